// Package containerd names the containerd programs test/tools/build.sh builds for the k3s
// stand-in's node (see go.mod's tool lines).
package containerd
