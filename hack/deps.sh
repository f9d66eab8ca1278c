#!/usr/bin/env bash
# Installs the Debian packages liken's build and tests need, when they are missing.
# Go itself and its modules come from the machine's Go and the Go module proxy.
set -euo pipefail
packages=(ca-certificates git make util-linux dpkg kmod cpio squashfs-tools qemu-system-x86 ovmf grub-efi-amd64-bin grub2-common mtools dosfstools xorriso gdisk e2fsprogs iptables iproute2 gcc libc6-dev libseccomp-dev pkg-config)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
# The release build downloads the current Debian kernel with apt-get: it needs package lists.
if ! ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1; then
	apt-get update -qq
fi
if [ ${#missing[@]} -gt 0 ]; then
	echo "installing ${missing[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
command -v go >/dev/null || { echo "deps: go is not on PATH (expected /usr/local/go/bin)" >&2; exit 1; }
