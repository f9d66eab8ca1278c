// Command kube-parts is the upstream programs a k3s node runs, in one binary, chosen by the
// name it runs as (a link named after each), as k3s links them into its own binary:
// kube-apiserver, kube-controller-manager and kube-scheduler (a server's control plane),
// kubelet and kube-proxy (every node), containerd and ctr. Sharing their common code makes it
// a fraction of the size of the programs apart, which is what the k3s stand-in's release
// carries in its read-only slot. containerd's runc shim stays a program of its own, as k3s
// ships it: containerd starts it by name, and its plugins must not load inside containerd.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	containerd "github.com/containerd/containerd/v2/cmd/containerd/command"
	ctr "github.com/containerd/containerd/v2/cmd/ctr/app"
	"k8s.io/component-base/cli"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"

	// containerd's plugins (CRI, the overlayfs snapshotter, the runc runtime ...), as its
	// own main registers them.
	_ "github.com/containerd/containerd/v2/cmd/containerd/builtins"
)

// Programs are the names kube-parts answers to.
var programs = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "containerd", "ctr"}

func main() {
	ctx := context.Background()
	switch name := filepath.Base(os.Args[0]); name {
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kubelet":
		os.Exit(cli.Run(kubelet.NewKubeletCommand(ctx)))
	case "kube-proxy":
		os.Exit(cli.Run(proxy.NewProxyCommand()))
	case "containerd":
		if err := containerd.App().Run(ctx, os.Args); err != nil {
			fmt.Fprintln(os.Stderr, "containerd:", err)
			os.Exit(1)
		}
	case "ctr":
		if err := ctr.New().Run(ctx, os.Args); err != nil {
			fmt.Fprintln(os.Stderr, "ctr:", err)
			os.Exit(1)
		}
	default:
		fmt.Fprintf(os.Stderr, "kube-parts: run as one of %v (a link of that name), not %q\n", programs, name)
		os.Exit(2)
	}
}
