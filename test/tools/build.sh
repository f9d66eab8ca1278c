#!/usr/bin/env bash
# Builds the upstream components liken's tests and the k3s stand-in's release run, from the Go
# module proxy into test/tools/bin, unless they are already there for the same go.mod/go.sum:
# etcd; kube-parts (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
# kube-proxy, containerd and ctr in one program, as k3s links them into one) with a link for
# each; containerd's runc shim; kubectl; runc; the CNI plugins; CoreDNS. Safe to run concurrently (flock).
# Static builds (CGO_ENABLED=0, runc a static cgo build) so the same binaries also run inside
# liken's VMs, stripped (-s -w) to keep slots small.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin="$here/bin"
mkdir -p "$bin"
exec 9>"$bin/.lock"
flock 9

build() { # build MODULE_DIR PACKAGE... (into $bin, or the directory $out names)
	local dir=$1; shift
	local to=${out:-$bin}
	local stamp="$bin/.stamp-$(basename "$dir")"
	local want
	want=$(cat "$dir/go.mod" "$dir/go.sum" "$0" | sha256sum | cut -d' ' -f1)
	local missing=0
	for p in "$@"; do [ -x "$to/$(basename "$p")" ] || missing=1; done
	if [ "$missing" = 0 ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
		return
	fi
	echo "building $* (the kube tools take about 15 minutes on 2 cores the first time) ..." >&2
	local start=$SECONDS
	mkdir -p "$to"
	# cgo=1 links a program that needs cgo statically (runc), so it runs in liken's image too;
	# tags= adds build tags to it.
	local ldflags="-s -w ${ldx:-}" gotags=
	if [ "${cgo:-0}" = 1 ]; then
		ldflags="-s -w -extldflags -static ${ldx:-}" gotags="-tags=netgo,osusergo${tags:+,$tags}"
	fi
	(cd "$dir" && CGO_ENABLED=${cgo:-0} go build -trimpath $gotags -ldflags="$ldflags" -o "$to/" "$@")
	echo "$want" >"$stamp"
	echo "built $(basename "$dir") tools in $((SECONDS - start))s" >&2
	if [ -n "${LIKEN_TEST_REPORT:-}" ]; then
		echo "tools: built $(basename "$dir") in $((SECONDS - start))s" >>"$LIKEN_TEST_REPORT"
	fi
}

build "$here/etcd" liken.dev/liken/test/tools/etcd
# The version Kubernetes's own build stamps (hack/lib/version.sh), so the Nodes, the API's
# /version and kubectl name the release they run rather than v0.0.0-master.
kv=$(awk '$1 == "k8s.io/kubernetes" { print $2 }' "$here/kube/go.mod")
kminor=${kv#v1.}; kminor=${kminor%%.*}
kver=
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	kver="$kver -X $p.gitVersion=$kv -X $p.gitMajor=1 -X $p.gitMinor=$kminor -X $p.gitTreeState=clean"
done
ldx=$kver build "$here/kube" liken.dev/liken/test/tools/kube/kube-parts k8s.io/kubernetes/cmd/kubectl \
	github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
# The CNI plugins the stand-in's node runs, in a directory of their own (their names are
# generic): bridge, host-local, loopback, portmap, bandwidth.
plugins=github.com/containernetworking/plugins/plugins
out="$bin/cni" build "$here/cni" $plugins/main/bridge $plugins/ipam/host-local $plugins/main/loopback \
	$plugins/meta/portmap $plugins/meta/bandwidth
cgo=1 tags=seccomp build "$here/runc" github.com/opencontainers/runc
# CoreDNS with the plugins k3s's Corefile uses, for the stand-in's cluster DNS.
build "$here/coredns" liken.dev/liken/test/tools/coredns/coredns
# kube-parts is several programs in one, chosen by the name it runs as.
for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy containerd ctr; do
	ln -sfn kube-parts "$bin/$c"
done
rm -f "$bin/kube-control-plane" "$bin/.stamp-containerd" # what older versions of this script built
