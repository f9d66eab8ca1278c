// Command kube-control-plane is kube-apiserver, kube-controller-manager and kube-scheduler in
// one program, chosen by the name it runs as (a link named after each), as k3s links them into
// one binary. Sharing their common code makes it less than half the size of the three programs
// apart, which is what the k3s stand-in's release carries in its read-only slot.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/component-base/cli"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	switch name := filepath.Base(os.Args[0]); name {
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	default:
		fmt.Fprintf(os.Stderr, "kube-control-plane: run as kube-apiserver, kube-controller-manager or kube-scheduler (a link of that name), not %q\n", name)
		os.Exit(2)
	}
}
