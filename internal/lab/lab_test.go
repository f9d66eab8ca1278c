package lab

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestUpRefuses: what cannot work is refused with a message that says what to do, before
// anything is built, written or started.
func TestUpRefuses(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	running := t.TempDir()
	if err := os.WriteFile(filepath.Join(running, StateFile), []byte(`{"dir":"`+running+`","machines":[{"name":"m","pid":1}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	stale := t.TempDir()
	os.WriteFile(filepath.Join(stale, StateFile), []byte(`{"dir":"`+stale+`"}`), 0o644)
	full := t.TempDir()
	os.WriteFile(filepath.Join(full, "notes.txt"), []byte("mine"), 0o644)
	for _, tc := range []struct {
		name  string
		edit  func(*Options)
		path  string // PATH for the case; empty keeps the test's
		want  string
		fresh bool // the case's Dir is new: up must not create it
	}{
		{"two servers", func(o *Options) { o.Servers = 2 }, "", "give 1, 3 or 5", true},
		{"seven servers", func(o *Options) { o.Servers = 7 }, "", "give 1, 3 or 5", true},
		{"too many agents", func(o *Options) { o.Agents = 9 }, "", "give 0 to 8", true},
		{"a bad version", func(o *Options) { o.Version = "latest" }, "", "not of the form", true},
		{"a bad accelerator", func(o *Options) { o.Accel = "hvf" }, "", "give auto, kvm or tcg", true},
		{"liken's own kernel argument", func(o *Options) { o.KernelArgs = "quiet liken.slot=B" }, "", "liken.slot is liken's own boot argument", true},
		{"a lab left in the directory", func(o *Options) { o.Dir = stale }, "", "holds a lab that is not running", false},
		{"a directory with other files", func(o *Options) { o.Dir = full }, "", "is not empty and holds no lab", false},
		{"no QEMU", func(*Options) {}, t.TempDir(), "qemu-system-x86_64 is missing", true},
		{"more memory than the host has", func(o *Options) { o.ServerMiB = 1 << 30 }, "", "MiB of memory and this host has", true},
		{"a server with too little memory", func(o *Options) { o.ServerMiB = 512 }, "", "needs at least 1536 MiB", true},
		{"an agent with no CPU", func(o *Options) { o.AgentCPUs = 0 }, "", "every machine needs at least one CPU", true},
		{"the API port in use", func(o *Options) { o.APIPort = busy.Addr().(*net.TCPAddr).Port }, "", "is in use on this host", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.path != "" {
				t.Setenv("PATH", tc.path)
			}
			o := Defaults
			o.Dir = filepath.Join(t.TempDir(), "lab")
			o.APIPort = 0
			if l, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
				o.APIPort = l.Addr().(*net.TCPAddr).Port
				l.Close()
			}
			tc.edit(&o)
			_, err := Up(t.Context(), o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Up = %v; want a refusal saying %q", err, tc.want)
			}
			if _, err := os.Stat(o.Dir); tc.fresh && err == nil {
				t.Errorf("a refused up created %s", o.Dir)
			}
		})
	}
	// A running lab (its process alive, its command line naming the directory) is refused
	// too; PID 1 is not the lab's, so this one reads as stale.
	o := Defaults
	o.Dir = running
	if _, err := Up(t.Context(), o); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("a lab whose recorded PID is another program's: %v", err)
	}
}

// TestAddRefuses: add refuses, saying what to do and touching nothing, where there is no
// lab, a lab made before it recorded its private network, or a lab whose machines stopped.
func TestAddRefuses(t *testing.T) {
	old := t.TempDir()
	os.WriteFile(filepath.Join(old, StateFile), []byte(`{"dir":"`+old+`","machines":[{"name":"lab-server-1","role":"server","pid":1}]}`), 0o644)
	stopped := t.TempDir()
	os.WriteFile(filepath.Join(stopped, StateFile), []byte(`{"dir":"`+stopped+`","private":"230.0.0.1:20001","machines":[{"name":"lab-server-1","role":"server","pid":1}]}`), 0o644)
	for _, tc := range []struct{ name, dir, want string }{
		{"no lab", filepath.Join(t.TempDir(), "none"), "no lab in"},
		{"a lab made by an older liken", old, "did not record its private network"},
		{"a machine stopped", stopped, "lab-server-1 is not running"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := os.ReadFile(filepath.Join(tc.dir, StateFile))
			_, err := Add(t.Context(), tc.dir, io.Discard, time.Minute)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Add = %v; want a refusal saying %q", err, tc.want)
			}
			if after, _ := os.ReadFile(filepath.Join(tc.dir, StateFile)); string(after) != string(before) {
				t.Errorf("a refused add changed lab.json")
			}
			if ents, _ := os.ReadDir(tc.dir); len(ents) > 1 {
				t.Errorf("a refused add left files in %s: %v", tc.dir, ents)
			}
		})
	}
}
