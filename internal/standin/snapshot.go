package standin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"liken.dev/liken/internal/host/k3s"
)

// `k3s etcd-snapshot save` and `prune`, as the stand-in does them. k3s's commands work on
// the server's etcd from its data directory (pkg/cli/etcdsnapshot); the stand-in's read
// its etcd through etcd's gateway on the client port (the gRPC Maintenance.Snapshot stream
// as JSON: no etcd client library), into the file k3s would write, with k3s's name and
// directory. As k3s's command, save prunes nothing (it sets the retention to 0); prune
// keeps the etcd-snapshot-retention newest snapshots of the name (internal/host/k3s).

// snapshotMain runs `etcd-snapshot save|prune [flags]`; flags as k3s's command spells
// them (pkg/cli/cmds/etcd_snapshot.go: the etcd- prefix may be left out), defaults from
// the server's config file.
func snapshotMain(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	o, err := parseSnapshot(args, getenv)
	if err != nil {
		fmt.Fprintf(stderr, "k3s-standin: etcd-snapshot: %v\n", err)
		return 1
	}
	if args[0] == "prune" {
		pruned, err := PruneSnapshots(o.Dir, o.Name, o.Retention)
		for _, p := range pruned {
			fmt.Fprintf(stdout, "Snapshot %s deleted.\n", p)
		}
		if err != nil {
			fmt.Fprintf(stderr, "k3s-standin: etcd-snapshot prune: %v\n", err)
			return 1
		}
		return 0
	}
	s, err := SaveSnapshot(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "k3s-standin: etcd-snapshot save: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "Snapshot %s saved.\n", s.Name)
	fmt.Fprintf(stderr, "k3s-standin: etcd snapshot %s saved (%d bytes)\n", s.Path, s.Size)
	return 0
}

// SnapshotOptions is one save.
type SnapshotOptions struct {
	// EtcdURL is the member's client URL (the stand-in's etcd listens on 127.0.0.1:2379).
	EtcdURL string
	// TLSDir holds the etcd client certificate and CA the call uses (server/tls/etcd);
	// empty, a plain HTTP client (tests).
	TLSDir string
	// Dir, Name, Node and Retention make the file's path and what is kept (k3s's).
	Dir, Name, Node string
	Retention       int
	// Now is the snapshot's time (time.Now when zero).
	Now time.Time
}

func parseSnapshot(args []string, getenv func(string) string) (SnapshotOptions, error) {
	if len(args) == 0 || (args[0] != "save" && args[0] != "prune") {
		return SnapshotOptions{}, errors.New("usage: k3s etcd-snapshot save|prune [--name NAME] [--dir DIR] [--snapshot-retention N] (the stand-in does save and prune only)")
	}
	flags := map[string]string{}
	names := map[string]string{"name": "name", "dir": "dir", "etcd-snapshot-dir": "dir", "snapshot-retention": "retention",
		"etcd-snapshot-retention": "retention", "config": "config", "c": "config", "data-dir": "data-dir", "d": "data-dir", "node-name": "node-name"}
	for i := 1; i < len(args); i++ {
		a := strings.TrimLeft(args[i], "-")
		k, v, ok := strings.Cut(a, "=")
		key, known := names[k]
		if !known || !strings.HasPrefix(args[i], "-") {
			return SnapshotOptions{}, fmt.Errorf("flag provided but not defined: %s", args[i])
		}
		if !ok {
			if i+1 >= len(args) {
				return SnapshotOptions{}, fmt.Errorf("flag needs an argument: %s", args[i])
			}
			v = args[i+1]
			i++
		}
		flags[key] = v
	}
	config := "/etc/rancher/k3s/config.yaml"
	if v, ok := flags["config"]; ok {
		config = v
	}
	if env := getenv("K3S_CONFIG_FILE"); env != "" {
		config = env
	}
	values := map[string]any{}
	if b, err := os.ReadFile(config); err == nil {
		if err := yaml.Unmarshal(b, &values); err != nil {
			return SnapshotOptions{}, fmt.Errorf("parsing config file %s: %w", config, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return SnapshotOptions{}, fmt.Errorf("reading config file: %w", err)
	}
	c := &Config{Role: "server", Values: values}
	if v, ok := flags["data-dir"]; ok {
		c.Values["data-dir"] = v
	}
	if v, ok := flags["node-name"]; ok {
		c.Values["node-name"] = v
	}
	o := SnapshotOptions{EtcdURL: "https://127.0.0.1:2379", TLSDir: filepath.Join(c.dataDir(), "server", "tls", "etcd"), Dir: k3s.SnapshotDir(c.dataDir()), Name: "on-demand", Node: c.NodeName(),
		Retention: k3s.DefaultSnapshotRetention}
	if v, ok := flags["dir"]; ok {
		o.Dir = v
	}
	if v, ok := flags["name"]; ok {
		o.Name = v
	}
	retention := flags["retention"]
	if r, ok := values["etcd-snapshot-retention"]; ok && retention == "" {
		retention = fmt.Sprint(r)
	}
	if retention != "" {
		n, err := strconv.Atoi(retention)
		if err != nil {
			return SnapshotOptions{}, fmt.Errorf("snapshot retention %q: %w", retention, err)
		}
		o.Retention = n
	}
	if o.Name == "" || strings.ContainsAny(o.Name, "/\x00") {
		return SnapshotOptions{}, fmt.Errorf("snapshot name %q: want a file name", o.Name)
	}
	return o, nil
}

// SaveSnapshot streams the member's snapshot into o.Dir as k3s names it and checks the
// checksum etcd appends. Nothing half-written is left under the snapshot's name: the stream
// goes to a temporary file, renamed once whole and synced.
func SaveSnapshot(ctx context.Context, o SnapshotOptions) (k3s.Snapshot, error) {
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return k3s.Snapshot{}, err
	}
	name := k3s.SnapshotFileName(o.Name, o.Node, now)
	path := filepath.Join(o.Dir, name)
	tmp, err := os.CreateTemp(o.Dir, ".saving-"+name+"-")
	if err != nil {
		return k3s.Snapshot{}, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	client := http.DefaultClient
	if o.TLSDir != "" {
		if client, err = etcdClient(o.TLSDir); err != nil {
			return k3s.Snapshot{}, err
		}
	}
	size, err := streamSnapshot(ctx, client, o.EtcdURL, tmp)
	if err != nil {
		return k3s.Snapshot{}, err
	}
	if err := tmp.Sync(); err != nil {
		return k3s.Snapshot{}, err
	}
	if err := tmp.Close(); err != nil {
		return k3s.Snapshot{}, err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return k3s.Snapshot{}, err
	}
	if d, err := os.Open(o.Dir); err == nil {
		d.Sync()
		d.Close()
	}
	return k3s.Snapshot{Name: name, Path: path, Size: size, At: time.Unix(now.Round(time.Second).Unix(), 0)}, nil
}

// PruneSnapshots keeps the retention newest snapshots in dir whose name begins with name
// and removes the others, as k3s's prune does (nothing below a retention of 1); it returns
// the files it removed.
func PruneSnapshots(dir, name string, retention int) ([]string, error) {
	if retention < 1 {
		return nil, nil
	}
	all, err := k3s.Snapshots(dir, name)
	if err != nil {
		return nil, err
	}
	var pruned []string
	for len(all) > retention {
		if err := os.Remove(all[0].Path); err != nil {
			return pruned, err
		}
		pruned = append(pruned, all[0].Name)
		all = all[1:]
	}
	return pruned, nil
}

// streamSnapshot writes the member's snapshot from etcd's gateway (POST
// /v3/maintenance/snapshot: one JSON object per message, each a base64 blob) to w, and
// checks the SHA-256 etcd sends after the database (its last 32 bytes), as etcdutl's
// restore does.
func streamSnapshot(ctx context.Context, client *http.Client, etcdURL string, w io.Writer) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(etcdURL, "/")+"/v3/maintenance/snapshot", strings.NewReader("{}"))
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("asking etcd for a snapshot: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return 0, fmt.Errorf("asking etcd for a snapshot: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	h := sha256.New()
	// The last 32 bytes seen are held back: they are the checksum, not the database.
	var held []byte
	var size int64
	dec := json.NewDecoder(resp.Body)
	for {
		var msg struct {
			Result *struct {
				Blob string `json:"blob"`
			} `json:"result"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := dec.Decode(&msg); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return size, fmt.Errorf("reading etcd's snapshot stream: %w", err)
		}
		if msg.Error != nil {
			return size, fmt.Errorf("etcd's snapshot stream: %s", msg.Error.Message)
		}
		if msg.Result == nil {
			continue
		}
		b, err := base64.StdEncoding.DecodeString(msg.Result.Blob)
		if err != nil {
			return size, fmt.Errorf("etcd's snapshot stream: %w", err)
		}
		if _, err := w.Write(b); err != nil {
			return size, err
		}
		size += int64(len(b))
		held = append(held, b...)
		if n := len(held) - sha256.Size; n > 0 {
			h.Write(held[:n])
			held = held[n:]
		}
	}
	if len(held) != sha256.Size || size <= sha256.Size {
		return size, fmt.Errorf("etcd's snapshot stream ended after %d bytes, without its checksum", size)
	}
	if !bytes.Equal(h.Sum(nil), held) {
		return size, errors.New("etcd's snapshot does not match the checksum etcd sent with it")
	}
	return size, nil
}
