// Package vm boots liken's own images in QEMU for the VM test tier. KVM does not work on
// liken's build machines, so QEMU emulates the CPU (TCG): a boot takes seconds, not
// milliseconds, and tests wait with generous deadlines. The serial console is the test's
// window into the machine: it is captured whole and searched for markers init prints.
package vm

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/internal/qemu"
	"liken.dev/liken/internal/release"
)

// Options describe one machine.
type Options struct {
	Kernel, Initrd, Append string
	// Disks are attached as virtio disks in order (/dev/vda, /dev/vdb, ...).
	Disks []Disk
	// MemoryMiB defaults to 1024.
	MemoryMiB int
	// Log receives the serial console as it arrives (besides the capture).
	Log io.Writer
	// UEFI boots the disk through OVMF and GRUB instead of a kernel given to QEMU; VarsDir
	// holds the machine's copy of the UEFI variables.
	UEFI    bool
	VarsDir string
	// AllowReboot keeps QEMU running through a reboot (a trial that falls back reboots).
	AllowReboot bool
	// NICs are the MAC addresses of virtio network cards on QEMU's user network (where the
	// host is 10.0.2.2); none means no network card.
	NICs []string
	// Forward are port forwards from the host to the guest on the first NIC, in QEMU's
	// hostfwd form: "tcp:127.0.0.1:HOSTPORT-:GUESTPORT".
	Forward []string
	// Private, when set, adds a NIC with MAC PrivateMAC on a network the VMs given the same
	// Private address share, and nothing else reaches: a QEMU multicast socket on the host's
	// loopback ("230.0.0.1:PORT"). Machines talk to each other there as on a switch.
	Private, PrivateMAC string
	// Speed is how fast the emulated machine runs; the zero value is the tier's default
	// (DefaultSpeed).
	Speed Speed
	// RTCBase, when set, is where the hardware clock starts ("2001-01-01T00:00:00").
	RTCBase string
	// Devices are more emulated devices, as QEMU's -device values ("e1000e,mac=..."): a
	// NIC without a network behind it is there for its driver (coldplug), not for traffic.
	Devices []string
	// Screen, NoCOM1 and Watchdog are qemu.Machine's: a display adapter, no first serial
	// port (the console on the second), the chipset's TCO watchdog instead of an i6300ESB card.
	Screen   bool
	NoCOM1   bool
	Watchdog string
	// CDROM is an ISO image in the machine's CD drive, USB a disk image on a USB stick;
	// Netboot a directory the first NIC's network boots from by TFTP (qemu.Machine's).
	CDROM, USB, Netboot string
	// NetbootIPXE boots Netboot's iPXE script with QEMU's iPXE ROM.
	NetbootIPXE bool
}

// Speed is how fast an emulated machine runs, relative to the host and to the test's own
// servers. A timing assumption (an Event sent "soon enough", a goroutine that "surely" runs
// first) holds at one speed and fails at another, so the tier runs at a speed set from the
// environment, and one scenario always at another one (OtherSpeed).
type Speed struct {
	// CPUs is the number of vCPUs (QEMU -smp). With TCG each vCPU is a host thread, so
	// one vCPU is the slower machine where goroutines take turns.
	CPUs int
	// Icount, when set, is QEMU's -icount argument: the vCPU runs a fixed number of
	// instructions per virtual nanosecond ("shift=N") on one host thread, so the machine's
	// clock, not the host's, decides how much it gets done in a second; "shift=auto"
	// keeps it near real time.
	Icount string
}

func (s Speed) String() string {
	out := fmt.Sprintf("%d vCPU", s.CPUs)
	if s.Icount != "" {
		out += ", -icount " + s.Icount
	}
	return out
}

// DefaultSpeed is the speed of every machine the tier boots: 2 vCPUs, unless
// LIKEN_VM_CPUS or LIKEN_VM_ICOUNT say otherwise (for example LIKEN_VM_CPUS=1
// LIKEN_VM_ICOUNT=shift=auto for a slower machine).
func DefaultSpeed() Speed {
	s := Speed{CPUs: 2, Icount: os.Getenv("LIKEN_VM_ICOUNT")}
	if n, err := strconv.Atoi(os.Getenv("LIKEN_VM_CPUS")); err == nil && n > 0 {
		s.CPUs = n
	}
	return s
}

// OtherSpeed differs from DefaultSpeed: one vCPU when the default has more, two otherwise.
func OtherSpeed() Speed {
	s := DefaultSpeed()
	if s.CPUs > 1 {
		s.CPUs = 1
	} else {
		s.CPUs = 2
	}
	return s
}

// Disk is a disk image.
type Disk = qemu.Disk

// VM is a running QEMU.
type VM struct {
	cmd     *exec.Cmd
	mu      sync.Mutex
	console bytes.Buffer
	changed chan struct{}
	done    chan struct{}
	err     error
	start   time.Time
	ended   time.Time
	// expected: the test stopped the machine (Kill) or waited for it to power off (Wait).
	expected atomic.Bool
}

// stoppedByItself: the machine stopped, and the test neither stopped it nor waited for it to.
func (v *VM) stoppedByItself() bool {
	select {
	case <-v.done:
		return !v.expected.Load()
	default:
		return false
	}
}

// Boot starts QEMU.
func Boot(opts Options) (*VM, error) {
	if opts.MemoryMiB == 0 {
		opts.MemoryMiB = 1024
	}
	if opts.Speed.CPUs == 0 {
		opts.Speed = DefaultSpeed()
	}
	args, err := qemu.Machine{UEFI: opts.UEFI, VarsDir: opts.VarsDir, Kernel: opts.Kernel, Initrd: opts.Initrd, Append: opts.Append,
		Disks: opts.Disks, MemoryMiB: opts.MemoryMiB, CPUs: opts.Speed.CPUs, Icount: opts.Speed.Icount, AllowReboot: opts.AllowReboot,
		NICs: opts.NICs, Forward: opts.Forward, Private: opts.Private, PrivateMAC: opts.PrivateMAC, RTCBase: opts.RTCBase,
		Screen: opts.Screen, NoCOM1: opts.NoCOM1, Watchdog: opts.Watchdog, CDROM: opts.CDROM, USB: opts.USB, Netboot: opts.Netboot, NetbootIPXE: opts.NetbootIPXE}.Args()
	if err != nil {
		return nil, err
	}
	for _, d := range opts.Devices {
		args = append(args, "-device", d)
	}
	v := &VM{changed: make(chan struct{}, 1), done: make(chan struct{}), start: time.Now()}
	v.cmd = exec.Command("qemu-system-x86_64", args...)
	out := io.Writer(consoleWriter{v})
	if opts.Log != nil {
		out = io.MultiWriter(out, opts.Log)
	}
	v.cmd.Stdout, v.cmd.Stderr = out, out
	if err := v.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting qemu-system-x86_64: %w", err)
	}
	go func() {
		v.err = v.cmd.Wait()
		v.ended = time.Now()
		close(v.done)
	}()
	return v, nil
}

type consoleWriter struct{ v *VM }

func (w consoleWriter) Write(p []byte) (int, error) {
	w.v.mu.Lock()
	w.v.console.Write(p)
	w.v.mu.Unlock()
	select {
	case w.v.changed <- struct{}{}:
	default:
	}
	return len(p), nil
}

// Console returns everything the serial console printed so far.
func (v *VM) Console() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.console.String()
}

// WaitFor waits until the console shows marker, and returns the time since boot.
func (v *VM) WaitFor(ctx context.Context, marker string, timeout time.Duration) (time.Duration, error) {
	return v.WaitForAfter(ctx, 0, marker, timeout)
}

// Mark is the console's length now: WaitForAfter(Mark(), ...) looks only at what follows.
func (v *VM) Mark() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.console.Len()
}

// WaitForAfter waits until the console after offset from shows marker (a machine that
// reboots prints the same lines again).
func (v *VM) WaitForAfter(ctx context.Context, from int, marker string, timeout time.Duration) (time.Duration, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	seen := func() bool {
		c := v.Console()
		return len(c) >= from && strings.Contains(c[from:], marker)
	}
	for {
		if seen() {
			return time.Since(v.start), nil
		}
		select {
		case <-v.changed:
		case <-v.done:
			if seen() {
				return time.Since(v.start), nil
			}
			return 0, fmt.Errorf("the machine stopped (%v) before printing %q", v.err, marker)
		case <-deadline.C:
			return 0, fmt.Errorf("no %q on the console within %s", marker, timeout)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// Wait waits for QEMU to exit (a power-off) and returns the time since boot.
func (v *VM) Wait(timeout time.Duration) (time.Duration, error) {
	v.expected.Store(true)
	select {
	case <-v.done:
		return time.Since(v.start), v.err
	case <-time.After(timeout):
		return 0, fmt.Errorf("the machine did not power off within %s", timeout)
	}
}

// CPU is the host CPU time QEMU used (user and system), once it has exited: the work of
// emulating the machine, which the time ledger adds up per test (hack/ledger).
func (v *VM) CPU() time.Duration {
	select {
	case <-v.done:
	default:
		return 0
	}
	if ps := v.cmd.ProcessState; ps != nil {
		return ps.UserTime() + ps.SystemTime()
	}
	return 0
}

// Kill stops QEMU at once: a power cut.
func (v *VM) Kill() {
	v.expected.Store(true)
	v.cmd.Process.Kill()
	<-v.done
}

// Release is a release built for the VM tests.
type Release struct {
	Dir    string
	Digest string
	Doc    *apirelease.Document
	// Took is how long the build took; Cached says it came from the release cache (then
	// Took is how long checking and copying it took).
	Took   time.Duration
	Cached bool
}

var (
	buildMu sync.Mutex
	builds  = map[string]*Release{}
)

// BuildRelease builds a release with the k3s stand-in from this source tree, once per
// version and test binary, into a temporary directory, through the release cache
// (release.DefaultCache): a rerun with the same source tree and host does not build again.
func BuildRelease(version string) (*Release, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	if r := builds[version]; r != nil {
		return r, nil
	}
	_, file, _, _ := runtime.Caller(0)
	source := filepath.Join(filepath.Dir(file), "..", "..")
	dir, err := os.MkdirTemp("", "liken-vm-release-")
	if err != nil {
		return nil, err
	}
	cache, _ := os.UserCacheDir()
	start := time.Now()
	digest, doc, hit, err := release.DefaultCache().BuildCached(release.BuildOptions{
		Version: version, Source: source, StandIn: true, TestSwitches: true, Out: dir,
		KernelCache: filepath.Join(cache, "liken", "kernel"), Epoch: time.Unix(1785000000, 0),
	})
	if err != nil {
		return nil, err
	}
	r := &Release{Dir: dir, Digest: digest, Doc: doc, Took: time.Since(start), Cached: hit}
	builds[version] = r
	return r, nil
}

// Path returns a file of the release.
func (r *Release) Path(name string) string { return filepath.Join(r.Dir, name) }

// GPTDisk makes a disk image of sizeMiB with one partition per entry (in order, 1 MiB
// aligned), each named by its label and filled from its image (when set), without loop
// devices: sgdisk writes the table, dd the contents.
func GPTDisk(path string, sizeMiB int, parts []Partition) error {
	if err := exec.Command("truncate", "-s", fmt.Sprintf("%dM", sizeMiB), path).Run(); err != nil {
		return fmt.Errorf("truncate: %w", err)
	}
	args := []string{"--clear"}
	for i, p := range parts {
		n := i + 1
		args = append(args, fmt.Sprintf("--new=%d:0:+%dM", n, p.SizeMiB), fmt.Sprintf("--change-name=%d:%s", n, p.Label))
		if p.Type != "" {
			args = append(args, fmt.Sprintf("--typecode=%d:%s", n, p.Type))
		}
	}
	args = append(args, path)
	if out, err := exec.Command("sgdisk", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("sgdisk: %w: %s", err, out)
	}
	offset := 1 // MiB: sgdisk aligns the first partition at 2048 sectors
	for _, p := range parts {
		if p.Image != "" {
			out, err := exec.Command("dd", "if="+p.Image, "of="+path, "bs=1M", fmt.Sprintf("seek=%d", offset), "conv=notrunc", "status=none").CombinedOutput()
			if err != nil {
				return fmt.Errorf("dd %s: %w: %s", p.Image, err, out)
			}
		}
		offset += p.SizeMiB
	}
	return nil
}

// Partition is one partition of a GPTDisk.
type Partition struct {
	Label   string
	SizeMiB int
	// Type is sgdisk's type code, such as ef00 for an EFI system partition (default 8300).
	Type  string
	Image string
}
