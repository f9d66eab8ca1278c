package bootloader

import (
	"os"
	"path/filepath"
	"sync"
)

// Cut is the environment's files as a power cut leaves them: Written bytes of an update
// reached the disk, in the order they were written, and none after.
type Cut struct {
	Written int
	Files   map[string][]byte // EnvFile and EnvFile2, by name
}

var cutMu sync.Mutex

// PowerCuts makes change as UpdateEnv does on the ESP in dir, recording every byte it
// writes, and returns the files as a power cut after each byte would leave them, from none
// written to all. Cutting between any two bytes is harsher than a disk, whose sector writes
// are whole; it is what the torn-write tests prove the two-copy protocol against. dir is
// left as the whole update leaves it.
func PowerCuts(dir string, change func(Env)) ([]Cut, error) {
	names := []string{EnvFile, EnvFile2}
	before := map[string][]byte{}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return nil, err
		}
		before[n] = b
	}
	type write struct {
		name string
		b    []byte
		off  int64
	}
	var writes []write
	cutMu.Lock()
	orig := writeAt
	writeAt = func(f *os.File, b []byte, off int64) error {
		rel, _ := filepath.Rel(dir, f.Name())
		writes = append(writes, write{rel, append([]byte(nil), b...), off})
		return orig(f, b, off)
	}
	err := ESP{Dir: dir}.UpdateEnv(change)
	writeAt = orig
	cutMu.Unlock()
	if err != nil {
		return nil, err
	}
	state := map[string][]byte{}
	for n, b := range before {
		state[n] = append([]byte(nil), b...)
	}
	snapshot := func(n int) Cut {
		c := Cut{Written: n, Files: map[string][]byte{}}
		for k, v := range state {
			c.Files[k] = append([]byte(nil), v...)
		}
		return c
	}
	cuts := []Cut{snapshot(0)}
	n := 0
	for _, w := range writes {
		for i := range w.b {
			state[w.name][int(w.off)+i] = w.b[i]
			n++
			cuts = append(cuts, snapshot(n))
		}
	}
	return cuts, nil
}
