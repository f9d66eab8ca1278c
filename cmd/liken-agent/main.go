// Command liken-agent is the machine agent (internal/agent). Init starts it on every
// machine with the machine's own credentials; it is not meant to be run by hand.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/agent"
	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/bootstrap"
	"liken.dev/liken/internal/coordinator"
	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/host/clock"
	"liken.dev/liken/internal/host/hardware"
	"liken.dev/liken/internal/host/k3s"
	"liken.dev/liken/internal/host/network"
	"liken.dev/liken/internal/host/sysctl"
	"liken.dev/liken/internal/initramfs"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/metrics"
	"liken.dev/liken/internal/release"
	"liken.dev/liken/internal/state"
	"liken.dev/liken/internal/supervisor"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "liken-agent:", err)
		os.Exit(1)
	}
}

func run() error {
	// k3s's files are where init put them (k3s.DefaultPaths), so the agent renders the same
	// configuration; every path starts from there, and a flag moves one.
	paths := k3s.DefaultPaths
	flag.StringVar(&paths.Config, "k3s-config", paths.Config, "k3s config file")
	flag.StringVar(&paths.Registries, "k3s-registries", paths.Registries, "k3s registries file")
	flag.StringVar(&paths.RegistryFiles, "k3s-registry-files", paths.RegistryFiles, "directory for registry CA and client files")
	flag.StringVar(&paths.TokenFile, "k3s-token-file", paths.TokenFile, "k3s join token file")
	flag.StringVar(&paths.AgentTokenFile, "k3s-agent-token-file", paths.AgentTokenFile, "on servers, the agent token file k3s accepts agents with")
	flag.StringVar(&paths.DataDir, "k3s-data-dir", paths.DataDir, "k3s data directory")
	var (
		machine    = flag.String("machine", "", "this machine's name (its Machine and Node)")
		kubeconfig = flag.String("kubeconfig", "/var/lib/liken/agent.kubeconfig", "the machine's own credentials")
		stateDir   = flag.String("state-dir", "/var/lib/liken", "where the agent remembers what it applied")
		socket     = flag.String("init-socket", supervisor.DefaultSocket, "init's supervisor socket")
		join       = flag.String("join", "", "server URL to render for joining (empty on the first server)")
		apiAddrs   = flag.String("api-addresses", "", "addresses (host:port, separated by commas) every API connection tries in order, whatever the kubeconfig's server says; each server is checked as \"kubernetes\" (empty: the kubeconfig's server alone)")
		localMets  = flag.String("metrics-addr", "127.0.0.1:9469", "local address for Prometheus metrics, plain HTTP (empty: off)")
		secure     = flag.String("secure-metrics-addr", "", "address for Prometheus metrics over TLS, each scrape authenticated and authorized by the API server (such as :9470; empty: off; init passes it on a liken machine)")
		sysRoot    = flag.String("sysctl-root", sysctl.Default.Root, "the /proc/sys tree")
		sysfs      = flag.String("sysfs", hardware.Default.Sys, "sysfs root for the hardware inventory")
		procfs     = flag.String("procfs", hardware.Default.Proc, "procfs root for the hardware inventory")
		delay      = flag.Duration("restart-delay", 2*time.Second, "quiet time before k3s is restarted for new configuration")
		healthz    = flag.String("k3s-healthz", "http://127.0.0.1:10248/healthz", "k3s's health check (the kubelet's); empty: not checked")
		coord      = flag.Bool("coordinator", false, "take part in electing the reboot coordinator (server machines)")
		bootKC     = flag.String("bootstrap-kubeconfig", "", "the bootstrap credential: create the Cluster and Machines of --layer-dir where absent (server machines)")
		layerDir   = flag.String("layer-dir", "/run/liken/layer", "the unpacked deployment layer")
		keepClock  = flag.Duration("keep-clock", 0, "set the clock from the time servers this often (0: leave the clock alone; init passes it on a liken machine)")
		peerWait   = flag.Duration("peer-wait", 0, "how long a server's network trial, healthy on its own, waits for another machine to reach it (0: three of the peers' Node Lease durations; init passes liken.trial.peerwait)")
	)
	flag.Parse()
	if *machine == "" {
		return errors.New("--machine is required")
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("reading %s: %w", *kubeconfig, err)
	}
	if *apiAddrs != "" {
		kube.Failover(cfg, strings.Split(*apiAddrs, ","))
	}
	m := agent.NewMetrics()
	acfg := agent.Config{
		Machine: *machine, REST: cfg, State: state.Store{Dir: *stateDir},
		Sysctl: sysctl.Host{Root: *sysRoot}, K3sRoot: k3s.Root("/"),
		K3sPaths: paths,
		Join:     *join, Restarter: supervisor.Client{Socket: *socket}, RestartDelay: *delay,
		Boot: supervisor.Client{Socket: *socket}, SlotDevice: slotPartition, K3sHealthz: *healthz,
		Inventory: func() (*v1alpha1.Hardware, *v1alpha1.NetworkStatus) {
			h := hardware.Default
			h.Sys, h.Proc = *sysfs, *procfs
			return h.Read(), h.Network()
		},
		Log: log, Metrics: m, Coordinator: coordinatorConfig(*coord),
		ClockEvery: *keepClock, DHCPTimeServers: network.DHCPTimeServers, PeerWait: *peerWait,
	}
	if *keepClock > 0 {
		acfg.Clock = &clock.Clock{}
	}
	a, err := agent.New(acfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *localMets != "" {
		l, err := net.Listen("tcp", *localMets)
		if err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		srv := &http.Server{Handler: promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(l)
		defer srv.Close()
		log.Info("metrics", "addr", l.Addr().String())
	}
	if *secure != "" {
		kc, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return fmt.Errorf("secure metrics: %w", err)
		}
		srv, err := metrics.Start(metrics.Options{Addr: *secure, Gatherer: m.Registry, Kube: kc, Name: *machine, IPs: hardware.Addresses(), Log: log})
		if err != nil {
			// The metrics are not worth the machine: said, and the agent goes on.
			log.Error("secure metrics endpoint not started", "err", err)
		} else {
			defer srv.Close(context.Background())
			log.Info("secure metrics", "addr", srv.Addr().String(), "path", metrics.Path)
		}
	}
	if *bootKC != "" {
		bcfg, err := clientcmd.BuildConfigFromFlags("", *bootKC)
		if err != nil {
			return fmt.Errorf("reading %s: %w", *bootKC, err)
		}
		// Beside the agent, which waits for its Machine meanwhile: the first server's
		// Machine exists only once this has made it.
		go func() {
			if _, err := bootstrap.Run(ctx, bootstrap.Config{REST: bcfg, LayerDir: *layerDir, Server: *machine, Log: log}); err != nil && ctx.Err() == nil {
				log.Error("bootstrap: the Cluster and Machines were not all made from the layer", "err", err)
			}
		}()
	}
	return a.Run(ctx)
}

// slotPartition finds a slot's partition by its label, never by device name.
func slotPartition(slot string) (release.PartitionTarget, error) {
	label := disk.SlotA
	if slot == bootloader.SlotB {
		label = disk.SlotB
	}
	dev, err := initramfs.WaitForDevice("PARTLABEL="+label, 5*time.Second)
	if err != nil {
		return release.PartitionTarget{}, fmt.Errorf("finding slot %s: %w", slot, err)
	}
	f, err := os.Open(dev)
	if err != nil {
		return release.PartitionTarget{}, fmt.Errorf("finding slot %s: %w", slot, err)
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return release.PartitionTarget{}, fmt.Errorf("sizing slot %s (%s): %w", slot, dev, err)
	}
	return release.PartitionTarget{Path: dev, Size: size}, nil
}

// coordinatorConfig is the reboot coordinator's configuration on a server, nil elsewhere.
func coordinatorConfig(on bool) *coordinator.Config {
	if !on {
		return nil
	}
	return &coordinator.Config{}
}
