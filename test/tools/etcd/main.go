// Command etcd is upstream etcd (go.etcd.io/etcd/server/v3) built from the Go module proxy,
// for liken's API-tier tests and the k3s stand-in's release: this file only calls etcd's own
// main. Run as "etcdutl" (argv[0]), it is the one etcdutl command the stand-in needs,
// `etcdutl snapshot restore`, through etcd's own library (go.etcd.io/etcd/etcdutl/v3/snapshot),
// as k3s restores a snapshot with it (--cluster-reset-restore-path).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"go.uber.org/zap"
)

func main() {
	if filepath.Base(os.Args[0]) == "etcdutl" {
		os.Exit(etcdutl(os.Args[1:]))
	}
	etcdmain.Main(os.Args)
}

// etcdutl runs `snapshot restore SNAPSHOT` with etcdutl's flags for it.
func etcdutl(args []string) int {
	if len(args) < 2 || args[0] != "snapshot" || args[1] != "restore" {
		fmt.Fprintln(os.Stderr, "etcdutl: only `snapshot restore` is built here (liken's test tools)")
		return 2
	}
	fs := flag.NewFlagSet("etcdutl snapshot restore", flag.ContinueOnError)
	var cfg snapshot.RestoreConfig
	var peerURLs string
	fs.StringVar(&cfg.OutputDataDir, "data-dir", "", "path to the output data directory")
	fs.StringVar(&cfg.Name, "name", "default", "human-readable name for this member")
	fs.StringVar(&cfg.InitialCluster, "initial-cluster", "", "initial cluster configuration for restore bootstrap")
	fs.StringVar(&cfg.InitialClusterToken, "initial-cluster-token", "etcd-cluster", "initial cluster token")
	fs.StringVar(&peerURLs, "initial-advertise-peer-urls", "http://localhost:2380", "list of this member's peer URLs")
	fs.BoolVar(&cfg.SkipHashCheck, "skip-hash-check", false, "ignore the snapshot's integrity hash")
	fs.Uint64Var(&cfg.RevisionBump, "bump-revision", 0, "how much to increase the latest revision after restore")
	fs.BoolVar(&cfg.MarkCompacted, "mark-compacted", false, "mark the latest revision after restore as compacted")
	// The snapshot comes first, as etcdutl takes it; flags follow.
	if len(args) < 3 || strings.HasPrefix(args[2], "-") {
		fmt.Fprintln(os.Stderr, "etcdutl snapshot restore: give the snapshot file first")
		return 2
	}
	cfg.SnapshotPath = args[2]
	if err := fs.Parse(args[3:]); err != nil {
		return 2
	}
	cfg.PeerURLs = strings.Split(peerURLs, ",")
	if cfg.InitialCluster == "" {
		cfg.InitialCluster = cfg.Name + "=" + cfg.PeerURLs[0]
	}
	lg, err := zap.NewProduction()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := snapshot.NewV3(lg).Restore(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "etcdutl snapshot restore: %v\n", err)
		return 1
	}
	return 0
}
