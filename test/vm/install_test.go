package vm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/identity"
	"liken.dev/liken/internal/install"
	"liken.dev/liken/internal/manifest"
	"liken.dev/liken/internal/qemu"
	"liken.dev/liken/internal/release"
	"liken.dev/liken/test/report"
)

// installedAgent installs the agent layer with no machine bound.
func installedAgent(t *testing.T) string {
	t.Helper()
	return installedRole(t, "quiet liken.test=poweroff", "", "agent")
}

// withoutPeers drops the Machines of role other than keep.
func withoutPeers(docs []manifest.Document, role, keep string) []manifest.Document {
	var out []manifest.Document
	for _, d := range docs {
		r, _, _ := unstructured.NestedString(d.Object.Object, "spec", "role")
		if d.Object.GetKind() == "Machine" && r == role && d.Object.GetName() != keep {
			continue
		}
		out = append(out, d)
	}
	return out
}

// testLayout keeps the test disks small; slots still hold a whole release (120 MiB with the
// stand-in and its node's programs, its root image compressed at zstd level 6), with room
// to grow.
var testLayout = disk.Layout{ESPMiB: 40, SlotMiB: 160, LayerMiB: 4, MinStateMiB: 64}

// installed publishes the test release into a channel, builds the example layers and
// installs server-1's disk image.
func installed(t *testing.T, kernelArgs, machine string) (diskPath string) {
	t.Helper()
	return installedRole(t, kernelArgs, machine, "server")
}

func installedRole(t *testing.T, kernelArgs, machine, role string) (diskPath string) {
	t.Helper()
	return installedEdited(t, kernelArgs, machine, role, nil)
}

// installedEdited is installedRole with the example documents changed by edit first.
func installedEdited(t *testing.T, kernelArgs, machine, role string, edit func([]manifest.Document)) (diskPath string) {
	t.Helper()
	diskPath = filepath.Join(t.TempDir(), role+".img")
	installTo(t, diskPath, testLayout.MinSizeMiB()+16, kernelArgs, machine, role, edit)
	return diskPath
}

// installTo installs the test release and the examples' layer of role onto diskPath: an
// image file made sizeMiB large, or, with sizeMiB 0, a block device.
func installTo(t *testing.T, diskPath string, sizeMiB int, kernelArgs, machine, role string, edit func([]manifest.Document)) {
	t.Helper()
	// These tests prove the install and boot paths; their machines' nodes are simulated, as
	// the stand-in says on their consoles, and the lab test runs real ones.
	kernelArgs = strings.TrimSpace(kernelArgs + " liken.test.node=simulated")
	channel, pin := publishedRelease(t)
	docs, err := manifest.Load(filepath.Join("..", "..", "docs", "examples"))
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(docs)
	}
	if machine == "" {
		// A disk found by hardware at boot is installed from a layer holding one machine of
		// its role (install refuses to put several machines' keys on one disk): here, the
		// role's first example.
		docs = withoutPeers(docs, role, role+"-1")
	}
	layers := t.TempDir()
	// The test release carries the k3s stand-in, which needs node credentials in the layer.
	res, err := identity.BuildLayers(identity.Input{Docs: docs, IdentityDir: filepath.Join(layers, "identity"), OutDir: layers, StandInNodeCredentials: true})
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	start := time.Now()
	_, err = install.Install(context.Background(), install.Options{
		Channel: "file://" + channel, Pin: pin, Layer: res.Layers[v1alpha1.Role(role)], Disk: diskPath,
		SizeMiB: sizeMiB, Machine: machine, Layout: testLayout,
		KernelArgs: qemu.InstallArgs(false, kernelArgs), Log: &log,
		// These installs prove the install and boot paths from an unsigned file:// channel
		// (the examples' Cluster names a root no key made); install's check of a signed
		// channel: joinMachines' installs and the lab's.
		InsecureUnsigned: true,
	})
	if err != nil {
		t.Fatalf("install: %v\n%s", err, log.String())
	}
	if sizeMiB > 0 {
		report.Line("install of a %d MiB disk image (release from a file:// channel): %s", sizeMiB, time.Since(start).Round(100*time.Millisecond))
	}
}

// publishedRelease builds the test release (once per run) and publishes it into a new
// channel directory, returning the channel and the release's pin.
func publishedRelease(t *testing.T) (channel, pin string) {
	t.Helper()
	rel, err := BuildRelease(releaseA)
	if err != nil {
		t.Fatal(err)
	}
	channel = filepath.Join(t.TempDir(), "channel")
	if pin, err = release.Publish(channel, rel.Dir); err != nil {
		t.Fatal(err)
	}
	return channel, pin
}

// espImage names the disk's ESP for mtools (an image file at an offset).
func espImage(t *testing.T, diskPath string) string {
	t.Helper()
	parts, err := disk.Read(diskPath)
	if err != nil {
		t.Fatal(err)
	}
	return diskPath + "@@" + strconv.FormatInt(parts[disk.ESP].Offset, 10)
}

// espFile reads a file from the disk's ESP with mtools.
func espFile(t *testing.T, diskPath, name string) []byte {
	t.Helper()
	tmp := filepath.Join(t.TempDir(), filepath.Base(name))
	if out, err := exec.Command("mcopy", "-n", "-i", espImage(t, diskPath), "::"+name, tmp).CombinedOutput(); err != nil {
		t.Fatalf("mcopy: %v %s", err, out)
	}
	b, err := os.ReadFile(tmp)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// espEnv reads the GRUB environment on the disk's ESP with mtools, as init reads it (the
// current of its two copies); with set, it changes it as init does and writes it back.
func espEnv(t *testing.T, diskPath string, set bootloader.Env) bootloader.Env {
	t.Helper()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, bootloader.ConfigDir), 0o755)
	for _, name := range []string{bootloader.EnvFile, bootloader.EnvFile2} {
		os.WriteFile(filepath.Join(dir, name), espFile(t, diskPath, name), 0o644)
	}
	esp := bootloader.ESP{Dir: dir}
	if set != nil {
		err := esp.UpdateEnv(func(env bootloader.Env) {
			for k, v := range set {
				env[k] = v
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{bootloader.EnvFile, bootloader.EnvFile2} {
			if out, err := exec.Command("mcopy", "-o", "-i", espImage(t, diskPath), filepath.Join(dir, name), "::"+name).CombinedOutput(); err != nil {
				t.Fatalf("mcopy: %v %s", err, out)
			}
		}
	}
	env, err := esp.Env()
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func bootUEFI(t *testing.T, diskPath string, allowReboot bool, nics ...string) *VM {
	t.Helper()
	return bootUEFIAt(t, Speed{}, diskPath, allowReboot, nics...)
}

// bootUEFIAt is bootUEFI at a given speed (the zero Speed: the tier's default).
func bootUEFIAt(t *testing.T, speed Speed, diskPath string, allowReboot bool, nics ...string) *VM {
	t.Helper()
	d := Disk{Path: diskPath}
	// A disk installed with larger sectors boots as one.
	if parts, err := disk.Read(diskPath); err == nil && parts[disk.ESP].SectorSize > 512 {
		d.SectorSize = int(parts[disk.ESP].SectorSize)
	}
	return bootWith(t, Options{UEFI: true, VarsDir: t.TempDir(), Disks: []Disk{d}, AllowReboot: allowReboot, NICs: nics, Speed: speed})
}

// consoles checks a boot's consoles: GRUB named the screen and the serial port (found); the
// kernel drew its console on the firmware's framebuffer (efifb, fbcon); init said it writes
// to both, /dev/console (ttyS0) last; and the screen showed init's last lines before the
// power-off (liken.test.screen prints it), and none of k3s's, which only /dev/console has.
func consoles(t *testing.T, console, kernelLog string) {
	t.Helper()
	if line := consoleLine(kernelLog, "Kernel command line:"); !strings.Contains(line, "console=tty0 console=ttyS0,115200 ") {
		t.Errorf("the kernel's command line does not end its consoles with GRUB's screen and serial port: %q", line)
	}
	for _, want := range []string{"efifb: ", "frame buffer device"} {
		if !strings.Contains(kernelLog, want) {
			t.Errorf("the kernel's log says nothing of %q: no console on the screen's framebuffer", want)
		}
	}
	if line := consoleLine(console, "liken-init: consoles: "); !strings.HasPrefix(line, "liken-init: consoles: tty0 ttyS0 (") {
		t.Errorf("init's consoles: %q; want tty0 (the screen), then ttyS0", line)
	}
	var screen []string
	for _, l := range strings.Split(console, "\n") {
		if s, ok := strings.CutPrefix(strings.TrimRight(l, "\r"), "liken-test: screen: "); ok {
			screen = append(screen, s)
		}
	}
	all := strings.Join(screen, "\n")
	for _, want := range []string{"liken-init: shutdown clean in", "liken-init: shutdown complete"} {
		if !strings.Contains(all, want) {
			t.Errorf("the screen does not show init's line %q; it shows:\n%s", want, all)
		}
	}
	if strings.Contains(all, "k3s-standin:") {
		t.Errorf("k3s's output is on the screen; only /dev/console is to have it:\n%s", all)
	}
}

// bootWith boots a machine for a test: its console is logged if the test fails, and it is
// stopped when the test ends.
func bootWith(t *testing.T, opts Options) *VM {
	t.Helper()
	if os.Getenv("LIKEN_VM_CONSOLE") != "" {
		opts.Log = os.Stderr // watch the machine while debugging a test
	}
	v, err := Boot(opts)
	if err != nil {
		t.Fatal(err)
	}
	register(t, v)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("console:\n%s", v.Console())
		}
		select {
		case <-v.done:
		default:
			v.Kill()
		}
		// For make test's time ledger (hack/ledger): liken's initramfs says so at every boot
		// (a machine booted with another initramfs shows the kernel's banner, when printed),
		// and QEMU's CPU time is what emulating the machine cost the host.
		boots := strings.Count(v.Console(), "liken-init: initramfs stage")
		if boots == 0 {
			boots = strings.Count(v.Console(), "Linux version ")
		}
		t.Logf("liken-ledger: boots %d cpu %.1fs", boots, v.CPU().Seconds())
	})
	return v
}

// poweredOff waits for a machine that said its shutdown is complete to power off.
func poweredOff(t *testing.T, v *VM) {
	t.Helper()
	if _, err := v.Wait(60 * time.Second); err != nil {
		t.Fatalf("after its shutdown: %v", err)
	}
}

func expect(t *testing.T, v *VM, marker string, timeout time.Duration) time.Duration {
	t.Helper()
	d, err := v.WaitFor(t.Context(), marker, timeout)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestInstallAndBootSlotA installs a disk image and boots it through OVMF and GRUB: slot A,
// not a trial, into the system stage.
func TestInstallAndBootSlotA(t *testing.T) {
	vmTest(t)
	// Onto a disk whose logical sectors are 4096 bytes (a loop device made with
	// --sector-size 4096 over an image file), booted as such a disk (virtio-blk with
	// logical_block_size=4096): the firmware finds GRUB on the ESP, GRUB and Linux read the
	// slot, init mounts the state partition. Every other VM test boots disks of 512-byte
	// sectors, so this one boot proves both sizes (it was TestDiskOf4096ByteSectors' own
	// boot until December 2026).
	d := filepath.Join(t.TempDir(), "4k.img")
	target, _, done := installTarget(t, d, testLayout.MinSizeMiB()+16, 4096)
	publishedRelease(t) // built before the install is timed
	start := time.Now()
	// liken.test.screen: init prints what the screen shows before it powers off.
	installTo(t, target, 0, "quiet liken.test=poweroff liken.test.trap-sigterm liken.test.screen", "server-1", "server", nil)
	took := time.Since(start)
	done()
	parts, err := disk.Read(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{disk.ESP, disk.SlotA, disk.SlotB, disk.Layer, disk.State} {
		if _, ok := parts[l]; !ok {
			t.Errorf("partition %s missing: %v", l, parts)
		}
	}
	if st := parts[disk.State]; st.SectorSize != 4096 {
		t.Fatalf("the image's GPT is not of 4096-byte sectors: %+v", st)
	}
	// As a disk of 4096-byte sectors (its GPT says so), on a machine with a screen (issue 29,
	// a console on the screen and the serial port): the kernel draws its console on the
	// firmware's framebuffer, and init's lines go to every console the kernel has, the
	// screen's too, not only to /dev/console (the serial port, the last console GRUB names).
	v := bootWith(t, Options{UEFI: true, VarsDir: t.TempDir(), Disks: []Disk{{Path: d, SectorSize: 4096}}, Screen: true})
	grub := expect(t, v, "liken-grub: booting slot A (trial 0)", 180*time.Second)
	expect(t, v, "mounted root image from slot /dev/vda2", 120*time.Second)
	system := expect(t, v, "liken-init: system stage", 120*time.Second)
	expect(t, v, "liken-init: state partition /dev/vda5 mounted on /var", 60*time.Second)
	expect(t, v, "liken-init: AppArmor off", 10*time.Second)
	if line := consoleLine(v.Console(), "liken-init: watchdog armed, "); !strings.HasSuffix(line, ", i6300ESB timer") {
		t.Errorf("the watchdog init armed on a machine with an i6300ESB card: %q", line)
	}
	expect(t, v, "liken-init: server layer unpacked", 60*time.Second)
	expect(t, v, "liken-init: this is Machine server-1 (server, found by the name bound at install)", 60*time.Second)
	k3s := expect(t, v, "liken-init: started k3s (pid", 60*time.Second)
	expect(t, v, "k3s-standin: liken's stand-in for k3s (not k3s)", 60*time.Second)
	// A process left after k3s (as a container's is) gets SIGTERM, and the shutdown that
	// waited for it is clean: the state file system is marked clean on the disk.
	expect(t, v, "traps SIGTERM", 60*time.Second)
	expect(t, v, "got SIGTERM; exiting in 1 s", 120*time.Second)
	expect(t, v, "liken-init: shutdown clean in", 60*time.Second)
	expect(t, v, "liken-init: shutdown complete", 60*time.Second)
	off, err := v.Wait(60 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !inOrder(v.Console(), "got SIGTERM; exiting in 1 s", "liken-init: shutdown clean in") {
		t.Errorf("the shutdown finished before the trapping process got SIGTERM")
	}
	parts, perr := disk.Read(d)
	if perr != nil {
		t.Fatal(perr)
	}
	if clean, why, err := disk.Ext4Clean(d, parts[disk.State].Offset); err != nil || !clean {
		t.Errorf("after the shutdown the state file system is not clean: %s %v", why, err)
	}
	consoles(t, v.Console(), debugfs(t, d, parts[disk.State], "cat /log/kernel.log"))
	report.Line("clean shutdown (TCG): %s", shutdownLine(v.Console()))
	report.Line("UEFI boot of an installed disk of 4096-byte sectors (OVMF + GRUB + kernel + init, TCG, wall clock from QEMU start): GRUB %s, system stage %s, init started k3s %s, clean power-off %s; kernel time to k3s start: %s; install onto a 4096-byte-sector loop device %s",
		grub.Round(100*time.Millisecond), system.Round(100*time.Millisecond), k3s.Round(100*time.Millisecond), off.Round(100*time.Millisecond), kernelTime(v.Console(), "liken-init: started k3s"), took.Round(100*time.Millisecond))
}

// TestTrialOfBrokenSlotFallsBack arms a one-shot trial of slot B, which holds no release:
// GRUB consumes the trial, cannot load B, boots the last good slot A; the trial is gone from
// the environment block afterwards.
func TestTrialOfBrokenSlotFallsBack(t *testing.T) {
	vmTest(t)
	d := installed(t, "quiet liken.test=poweroff liken.test.stage=system", "server-1")
	// Arguments that would switch liken's boot off if they won (the API refuses them; written
	// here into the environment directly): liken's own arguments come last, so they win.
	espEnv(t, d, bootloader.Env{"trial_slot": "B", bootloader.EnvKernelArgs: "liken.slot=B liken.trial=1 panic=0"})
	v := bootUEFI(t, d, false)
	expect(t, v, "liken-grub: booting slot B (trial 1)", 120*time.Second)
	expect(t, v, "liken-grub: slot B could not be loaded", 60*time.Second)
	expect(t, v, "liken-grub: booting slot A (trial 0)", 60*time.Second)
	expect(t, v, "liken-init: system stage", 120*time.Second)
	expect(t, v, "liken-init: booted slot A (trial 0)", 10*time.Second)
	if _, err := v.Wait(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	env := espEnv(t, d, nil)
	if env["trial_slot"] != "" || env["default_slot"] != "A" {
		t.Errorf("after the failed trial the environment is %v; want no trial and default A", env)
	}
}

// shutdownLine is init's line summing up its shutdown.
func shutdownLine(console string) string {
	for _, l := range strings.Split(console, "\n") {
		if i := strings.Index(l, "liken-init: shutdown clean in"); i >= 0 {
			return strings.TrimSpace(l[i+len("liken-init: "):])
		}
	}
	return "?"
}

// kernelTime is the "at N.NNs" uptime init printed on the line with marker: time since the
// kernel started.
func kernelTime(console, marker string) string {
	for _, l := range strings.Split(console, "\n") {
		if i := strings.Index(l, marker); i >= 0 {
			if j := strings.LastIndex(l, " at "); j >= 0 {
				return strings.TrimSpace(l[j+4:])
			}
		}
	}
	return "?"
}

// TestNoMachineMatchesTheHardware installs a disk bound to no machine, with the agent layer
// holding agent-1, and boots it with a MAC no Machine's spec.match names: init says no
// Machine matches and never starts k3s. (A machine found by its MAC:
// TestInstalledMachineJoinsTheAPI; this test booted agent-1's MAC too until December 2026.)
func TestNoMachineMatchesTheHardware(t *testing.T) {
	vmTest(t)
	d2 := installedAgent(t)
	// Besides its virtio NIC, an Intel 82574L (e1000e), whose driver the image carries but
	// loads only for a device present (issue 29, coldplug): its MAC is among those init
	// looked for a Machine by only if coldplug loaded its driver, as no spec names it.
	// Its watchdog is the chipset's TCO timer (no i6300ESB card), set to reset the machine
	// as on a real Intel board: the one init arms is iTCO_wdt, not softdog.
	v2 := bootWith(t, Options{UEFI: true, VarsDir: t.TempDir(), Disks: []Disk{{Path: d2}}, NICs: []string{"52:54:00:aa:bb:cc"},
		Devices: []string{"e1000e,mac=52:54:00:aa:bb:dd"}, Watchdog: "tco"})
	expect(t, v2, "no Machine matches this hardware (MACs 52:54:00:aa:bb:cc, 52:54:00:aa:bb:dd", 180*time.Second)
	if line := consoleLine(v2.Console(), "liken-init: watchdog armed, "); !strings.HasSuffix(line, ", iTCO_wdt") {
		t.Errorf("the watchdog init armed on a Q35 machine with its TCO timer: %q; want iTCO_wdt", line)
	}
	if line := consoleLine(v2.Console(), "liken-init: coldplug: loaded e1000e for "); !strings.Contains(line, "pci:v00008086d000010D3") {
		t.Errorf("coldplug did not say it loaded e1000e for the 82574L (pci:v00008086d000010D3...): %q", line)
	}
	report.Line("coldplug at boot (TCG, a virtio NIC and an e1000e): %s", regexp.MustCompile(`coldplug: \d+ devices, \d+ drivers loaded in \S+`).FindString(v2.Console()))
	// Init says so in its system stage, which ends there: k3s is started only after it, so
	// what the console shows now is all it will ever show of k3s (no waiting, at any speed).
	if strings.Contains(v2.Console(), "started k3s") {
		t.Errorf("k3s started on a machine without a manifest")
	}
	v2.Kill()
}
