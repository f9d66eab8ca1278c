// Package kube pins the upstream Kubernetes components that liken's API-tier tests run:
// kube-apiserver, kube-controller-manager and kubectl, built from k8s.io/kubernetes at the
// version in go.mod. It holds no code; go.mod's tool directives are the point.
package kube
