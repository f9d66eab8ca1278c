// Package kube pins the upstream Kubernetes components that liken's API-tier tests and the k3s
// stand-in's control plane run, built from k8s.io/kubernetes at the version in go.mod:
// kube-control-plane (kube-apiserver, kube-controller-manager and kube-scheduler in one
// program) and kubectl. go.mod's tool directives hold the upstream commands' dependencies.
package kube
