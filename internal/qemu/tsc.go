package qemu

import (
	"slices"
	"sync"
	"time"
)

// HostTSCkHz is the rate of this host's time stamp counter in kHz, measured against its
// monotonic clock (the median of three 50 ms readings), or 0 where it cannot be read (a host
// other than x86-64). Under TCG a guest's counter is the host's: QEMU's RDTSC returns the
// host's own.
var HostTSCkHz = sync.OnceValue(hostTSCkHz)

func hostTSCkHz() int64 {
	if !haveTSC {
		return 0
	}
	var rates []int64
	for range 3 {
		t0, c0 := time.Now(), rdtsc()
		time.Sleep(50 * time.Millisecond)
		c1, t1 := rdtsc(), time.Now()
		if c1 <= c0 {
			return 0 // a counter that does not count on
		}
		rates = append(rates, int64(float64(c1-c0)/t1.Sub(t0).Seconds()/1000))
	}
	slices.Sort(rates)
	return rates[1]
}
