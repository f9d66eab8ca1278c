// Package qemu describes a liken machine for QEMU: firmware, disks, network cards, the
// private network machines share and the ports forwarded to them. `liken lab` and the VM test
// tier start their machines from it, so both boot the same machine.
package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"liken.dev/liken/internal/syncbuf"
)

// OVMF's firmware and variable store, from Debian's ovmf package.
const (
	OVMFCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	OVMFVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// Machine is one emulated machine.
type Machine struct {
	// UEFI boots the first disk through OVMF and GRUB; VarsDir keeps the machine's copy of
	// the UEFI variables. Without UEFI, Kernel, Initrd and Append are given to QEMU directly.
	UEFI                   bool
	VarsDir                string
	Kernel, Initrd, Append string
	// Disks are attached as virtio disks in order (/dev/vda, /dev/vdb, ...).
	Disks     []Disk
	MemoryMiB int // default 1024
	CPUs      int // default 1
	// Icount, when set, is QEMU's -icount argument (see test/vm's Speed).
	Icount string
	// KVM uses hardware virtualisation; otherwise QEMU emulates the CPU (TCG).
	KVM bool
	// AllowReboot keeps QEMU running through a reboot.
	AllowReboot bool
	// NICs are the MAC addresses of virtio network cards on QEMU's user network (where the
	// host is 10.0.2.2); none means no network card.
	NICs []string
	// Forward are port forwards from the host to the guest on the first NIC, in QEMU's
	// hostfwd form: "tcp:127.0.0.1:HOSTPORT-:GUESTPORT".
	Forward []string
	// Private, when set, adds a NIC with MAC PrivateMAC on a network the machines given the
	// same Private address share and nothing else reaches: a QEMU multicast socket on the
	// host's loopback ("230.0.0.1:PORT"). Machines talk to each other there as on a switch.
	Private, PrivateMAC string
	// RTCBase, when set, is where the emulated hardware clock starts (QEMU -rtc base=, such
	// as "2001-01-01T00:00:00"); by default it starts at the host's time in UTC.
	RTCBase string
	// Screen gives the machine QEMU's standard VGA, on which OVMF makes a framebuffer the
	// kernel's console then draws on (efifb, fbcon), as on a machine with a monitor; nothing
	// shows it. Without it the machine is headless (-vga none), as most servers run, and no
	// boot pays for drawing text under emulation.
	Screen bool
	// NoCOM1 leaves the first serial port (COM1, 0x3f8) out, and puts the console on the
	// second (COM2, 0x2f8) instead: a machine on which GRUB finds no com0.
	NoCOM1 bool
	// CDROM, when set, is an ISO image in the machine's CD drive (SATA, as on Q35 boards).
	// The firmware boots the first disk first, as servers are set to, and the CD when the
	// disk holds nothing it boots: an installer's CD boots once, and the machine it
	// installed boots its disk after.
	CDROM string
	// USB, when set, is a disk image on a USB stick (USB 3, xHCI), which the firmware boots
	// after the first disk, as CDROM.
	USB string
	// Netboot, when set, is a directory the first NIC's DHCP server (QEMU's) serves by TFTP,
	// giving the installer's network GRUB as the boot file; the firmware's own PXE boots it
	// (no iPXE option ROM), after the first disk, when that holds nothing to boot.
	Netboot string
	// NetbootIPXE boots Netboot's iPXE script (liken.ipxe) with QEMU's iPXE option ROM
	// instead.
	NetbootIPXE bool
	// Watchdog is the hardware watchdog: "" is an i6300ESB card; "tco" is the TCO timer
	// of the Q35 chipset's LPC bridge (ICH9), which iTCO_wdt drives, set to reset the
	// machine (QEMU's default straps it not to), and no card.
	Watchdog string
}

// Disk is a disk image.
type Disk struct {
	Path     string
	ReadOnly bool
	// SectorSize, when set, is the disk's logical (and physical) sector size, such as 4096;
	// by default 512.
	SectorSize int
	// Serial, when set, is the serial number the disk reports (/sys/block/vdX/serial).
	Serial string
}

// Args are qemu-system-x86_64's arguments for m, the serial console on stdio. With UEFI, the
// variable store is copied into VarsDir the first time.
func (m Machine) Args() ([]string, error) {
	if m.MemoryMiB == 0 {
		m.MemoryMiB = 1024
	}
	if m.CPUs == 0 {
		m.CPUs = 1
	}
	accel, cpu := "tcg", TCGCPU()
	if m.KVM {
		accel, cpu = "kvm", "host"
	}
	args := []string{
		"-machine", "q35", "-accel", accel, "-cpu", cpu, "-smp", fmt.Sprint(m.CPUs), "-m", fmt.Sprint(m.MemoryMiB),
		"-display", "none", "-monitor", "none", "-action", "watchdog=reset",
	}
	// A watchdog as real hardware has; QEMU resets the machine when it fires.
	switch m.Watchdog {
	case "":
		args = append(args, "-device", "i6300esb")
	case "tco":
		args = append(args, "-global", "ICH9-LPC.noreboot=false")
	default:
		return nil, fmt.Errorf("watchdog %q: want \"\" (i6300esb) or \"tco\"", m.Watchdog)
	}
	if m.NoCOM1 {
		args = append(args, "-serial", "none", "-chardev", "stdio,id=console", "-device", "isa-serial,chardev=console,iobase=0x2f8,irq=3")
	} else {
		args = append(args, "-serial", "stdio")
	}
	if m.CDROM != "" {
		args = append(args, "-drive", "file="+m.CDROM+",if=none,id=cd,media=cdrom,readonly=on,format=raw", "-device", "ide-cd,drive=cd,bus=ide.0,bootindex=1")
	}
	if m.USB != "" {
		args = append(args, "-drive", "file="+m.USB+",if=none,id=usbstick,readonly=on,format=raw", "-device", "qemu-xhci,id=xhci",
			"-device", "usb-storage,bus=xhci.0,drive=usbstick,removable=on,bootindex=1")
	}
	if m.Screen {
		args = append(args, "-vga", "std")
	} else {
		args = append(args, "-vga", "none")
	}
	if m.Icount != "" {
		args = append(args, "-icount", m.Icount)
	}
	if m.RTCBase != "" {
		args = append(args, "-rtc", "base="+m.RTCBase)
	}
	if !m.AllowReboot {
		args = append(args, "-no-reboot")
	}
	if m.UEFI {
		vars := filepath.Join(m.VarsDir, "OVMF_VARS.fd")
		if _, err := os.Stat(vars); err != nil {
			b, err := os.ReadFile(OVMFVars)
			if err != nil {
				return nil, fmt.Errorf("OVMF (Debian package ovmf): %w", err)
			}
			if err := os.WriteFile(vars, b, 0o644); err != nil {
				return nil, err
			}
		}
		args = append(args, "-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+OVMFCode,
			"-drive", "if=pflash,format=raw,unit=1,file="+vars)
	} else {
		// A kernel booted directly gets what an installed machine's GRUB gives it under TCG.
		args = append(args, "-kernel", m.Kernel, "-append", InstallArgs(m.KVM, m.Append))
		if m.Initrd != "" {
			args = append(args, "-initrd", m.Initrd)
		}
	}
	if len(m.NICs) == 0 && m.Private == "" {
		args = append(args, "-nic", "none")
	}
	for i, mac := range m.NICs {
		fwd := ""
		if i == 0 {
			for _, f := range m.Forward {
				fwd += ",hostfwd=" + f
			}
		}
		if i == 0 && m.Netboot != "" {
			// The firmware's own PXE (no option ROM) boots GRUB; with NetbootIPXE, QEMU's iPXE
			// ROM boots the iPXE script.
			boot, rom := "bootx64.efi", ",romfile="
			if m.NetbootIPXE {
				boot, rom = "liken.ipxe", ""
			}
			args = append(args, "-netdev", "user,id=net0,tftp="+m.Netboot+",bootfile="+boot+fwd,
				"-device", "virtio-net-pci,netdev=net0,mac="+mac+rom+",bootindex=1")
			continue
		}
		args = append(args, "-nic", "user,model=virtio-net-pci,mac="+mac+fwd)
	}
	if m.Private != "" {
		args = append(args, "-netdev", "socket,id=private,mcast="+m.Private+",localaddr=127.0.0.1",
			"-device", "virtio-net-pci,netdev=private,mac="+m.PrivateMAC)
	}
	for i, d := range m.Disks {
		spec := "file=" + d.Path + ",format=raw"
		if d.ReadOnly {
			spec += ",readonly=on"
		}
		bootOrder := m.CDROM != "" || m.Netboot != "" || m.USB != ""
		if d.SectorSize == 0 && d.Serial == "" && !bootOrder {
			args = append(args, "-drive", spec+",if=virtio")
			continue
		}
		id := fmt.Sprintf("disk%d", i)
		dev := "virtio-blk-pci,drive=" + id
		if i == 0 && bootOrder {
			dev += ",bootindex=0"
		}
		if d.SectorSize != 0 {
			dev += fmt.Sprintf(",logical_block_size=%d,physical_block_size=%d", d.SectorSize, d.SectorSize)
		}
		if d.Serial != "" {
			dev += ",serial=" + d.Serial
		}
		args = append(args, "-drive", spec+",if=none,id="+id, "-device", dev)
	}
	return args, nil
}

// ProbeKVM says whether KVM boots a kernel on this host: /dev/kvm must open, and the kernel
// must print its banner within timeout under KVM. Where nested virtualisation hangs, as on
// liken's build machines, /dev/kvm opens but nothing runs: only a real boot tells. The
// answer says why, for the user.
func ProbeKVM(ctx context.Context, kernel string, timeout time.Duration) (bool, string) {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false, fmt.Sprintf("no usable /dev/kvm (%v)", err)
	}
	f.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", "-machine", "q35", "-accel", "kvm", "-cpu", "host", "-m", "256",
		"-display", "none", "-nodefaults", "-no-reboot", "-serial", "stdio",
		"-kernel", kernel, "-append", "console=ttyS0 panic=-1")
	var out syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// Should this process be killed, the probe dies with it rather than spin on a hung KVM.
	// The signal follows the thread that started the child, so that thread stays this
	// goroutine's (never ended) until the probe is over.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return false, fmt.Sprintf("starting QEMU with KVM: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if strings.Contains(out.String(), "Linux version") {
			cmd.Process.Kill()
			<-done
			return true, "KVM boots a kernel here"
		}
		select {
		case <-done:
			return strings.Contains(out.String(), "Linux version"), fmt.Sprintf("QEMU with KVM stopped: %s", firstLine(out.String()))
		case <-ctx.Done():
			<-done
			return false, fmt.Sprintf("KVM did not boot a kernel within %s (nested virtualisation may hang here)", timeout)
		case <-tick.C:
		}
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return l
}

// TCGCPU is the CPU model QEMU emulates (TCG): LIKEN_QEMU_CPU, or DefaultTCGCPU.
func TCGCPU() string {
	if c := os.Getenv("LIKEN_QEMU_CPU"); c != "" {
		return c
	}
	return DefaultTCGCPU
}

// DefaultTCGCPU is "max". A plain "qemu64,+rdrand" ran a Go program as init about 12%
// faster in a 2-vCPU guest (no AVX2 or ERMS for the runtime's memory copies; December 2026,
// three runs each), but the whole make test with it took 3660 s against 2404 s before, the
// lab test 3523 s with its machines using 5294 s of host CPU: not yet understood (the
// kernel's generic SHA-256 for module signatures is one suspect), so max stays the default
// and LIKEN_QEMU_CPU tries others.
const DefaultTCGCPU = "max"

// TCGKernelArgs are the kernel arguments a machine QEMU emulates (TCG) is installed with.
//
// tsc=reliable: its time stamp counter is the host's, one counter for every vCPU, but TCG
// cannot say so (it refuses invtsc), so Linux takes the counters of a guest of more than one
// (AMD-like) vCPU for unsynchronised ("Marking TSC unstable due to TSCs unsynchronized") and
// reads the time from the emulated HPET instead: a read took 3.2 µs instead of 0.3 µs, each
// one under QEMU's global lock, and Go programs read the time at every turn of their
// scheduler. Measured on a 2-core host, 2 vCPUs (December 2026): a Go program of 200
// goroutines on short timers woke 111k times in 8 s on the HPET, 171k on the TSC, for the
// same host CPU.
//
// tsc_early_khz=the host's counter's rate: Linux measures the counter's rate at boot against
// the emulated PIT and HPET, and when the two disagree it takes the PIT's. On a busy host a
// lab's server measured 127.569 MHz against the HPET's 2596.178 ("PIT calibration deviates
// from HPET"), so its clock ran twenty times fast, every timeout in it expired twenty times
// early and its API server was restarted for "not ready after 5 minutes" every 15 s, for
// ever (December 2026). tsc=reliable also keeps Linux from checking the counter against
// another clock later, so nothing corrects it. Told the rate, Linux skips the measurement;
// its later refinement against the HPET still corrects it by up to 1%.
//
// Under KVM the guest has kvm-clock and needs neither.
func TCGKernelArgs() string {
	if khz := HostTSCkHz(); khz > 0 {
		return "tsc=reliable tsc_early_khz=" + strconv.FormatInt(khz, 10)
	}
	return "tsc=reliable"
}

// InstallArgs are the kernel arguments to install a machine with: args, and under TCG
// (kvm false) TCGKernelArgs before them. A Machine booting a kernel directly is given the
// same.
func InstallArgs(kvm bool, args string) string {
	if kvm {
		return args
	}
	return strings.TrimSpace(TCGKernelArgs() + " " + args)
}
