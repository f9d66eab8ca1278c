// Package syncbuf has a buffer that goroutines write while another reads it: a process's
// output read before it ends, a server's log read by a test.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent Write and String.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
