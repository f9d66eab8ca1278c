package qemu

// rdtsc reads this CPU's time stamp counter (tsc_amd64.s).
func rdtsc() uint64

const haveTSC = true
