// Package kube pins the upstream programs that liken's API-tier tests and the k3s stand-in's
// release run, built from k8s.io/kubernetes and containerd at the versions in go.mod: kube-parts
// (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, containerd and
// ctr in one program), containerd's runc shim and kubectl. go.mod's tool directives hold the
// upstream commands' dependencies.
package kube
