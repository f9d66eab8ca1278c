//go:build !amd64

package qemu

func rdtsc() uint64 { return 0 }

const haveTSC = false
