// Command liken-initramfs is /init in liken's initramfs (see internal/initramfs).
package main

import "liken.dev/liken/internal/initramfs"

func main() { initramfs.Main() }
