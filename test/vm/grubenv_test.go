package vm

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/test/report"
)

// TestGRUBReadsEveryPowerCut boots GRUB on an ESP that holds the environment files as a
// power cut leaves them after every byte of liken's updates (arming a trial, committing it,
// arming another: bootloader.PowerCuts), and has GRUB pick and read each with liken's own
// pick_env (bootloader.EnvSelect, the text grub.cfg runs). For every cut, GRUB reads the
// intent before the update or after it, the same one init reads.
func TestGRUBReadsEveryPowerCut(t *testing.T) {
	vmTest(t)
	work := t.TempDir()
	esp := filepath.Join(work, "esp")
	os.MkdirAll(filepath.Join(esp, bootloader.ConfigDir), 0o755)
	a, b, err := bootloader.EnvCopies(bootloader.Env{bootloader.EnvDefaultSlot: bootloader.SlotA, bootloader.EnvInstallArgs: "quiet",
		bootloader.EnvKernelArgs: "console=ttyS0,115200"})
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(esp, bootloader.EnvFile), a, 0o644)
	os.WriteFile(filepath.Join(esp, bootloader.EnvFile2), b, 0o644)
	updates := []func(bootloader.Env){
		func(env bootloader.Env) {
			env[bootloader.EnvTrialSlot], env[bootloader.EnvTrialArgs] = bootloader.SlotB, "console=ttyS0,115200 mitigations=off"
		},
		func(env bootloader.Env) {
			env[bootloader.EnvDefaultSlot], env[bootloader.EnvKernelArgs] = bootloader.SlotB, env[bootloader.EnvTrialArgs]
			env[bootloader.EnvTrialSlot], env[bootloader.EnvTrialArgs] = "", ""
		},
		func(env bootloader.Env) {
			env[bootloader.EnvTrialSlot], env[bootloader.EnvTrialArgs] = bootloader.SlotA, "quiet"
		},
	}
	// Each cut goes into its own directory of the test ESP; want is what init reads there.
	tree := filepath.Join(work, "tree")
	var script strings.Builder
	want := map[string]string{}
	n := 0
	for _, u := range updates {
		cuts, err := bootloader.PowerCuts(esp, u)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cuts {
			dir := fmt.Sprintf("c/%d/%d", n/100, n%100)
			for name, data := range c.Files {
				p := filepath.Join(tree, dir, filepath.Base(name))
				os.MkdirAll(filepath.Dir(p), 0o755)
				os.WriteFile(p, data, 0o644)
			}
			want[dir] = intent(t, c)
			fmt.Fprintf(&script, "check /%s\n", dir)
			n++
		}
	}
	// Serial output only: through the firmware's console too, each line would come twice.
	// GRUB wraps at 80 columns, so each value has a line of its own.
	// First, grub.cfg's own console choice (bootloader.ConsoleSelect) on a machine with a
	// first serial port; TestGRUBFindsNoSerialPort is the one without.
	cfg := bootloader.ConsoleSelect + "terminal_input serial\nterminal_output serial\necho \"consoles: $console_args\"\n" + bootloader.EnvSelect + `function check {
  pick_env $1
  set default_slot=
  set trial_slot=
  set install_args=
  set kernel_args=
  set trial_args=
  load_env --file $envfile default_slot trial_slot install_args kernel_args trial_args
  echo "cut $1 d=$default_slot t=$trial_slot"
  echo "cut $1 i=$install_args"
  echo "cut $1 k=$kernel_args"
  echo "cut $1 a=$trial_args"
}
echo "cuts start"
` + script.String() + "echo \"cuts done\"\nhalt\n"
	disk := grubDisk(t, work, tree, cfg)
	start := time.Now()
	v := bootUEFI(t, disk, false)
	expect(t, v, "consoles: console=tty0 console=ttyS0,115200", 3*time.Minute)
	expect(t, v, "cuts start", time.Minute)
	expect(t, v, "cuts done", 20*time.Minute)
	took := time.Since(start)
	got := map[string]string{}
	for _, m := range cutLine.FindAllStringSubmatch(v.Console(), -1) {
		got[m[1]] += m[2] + ";"
	}
	for dir, w := range want {
		if got[dir] != w {
			t.Errorf("cut %s: GRUB read %q; init reads %q", dir, got[dir], w)
		}
	}
	report.Line("GRUB environment power cuts: %d cut points (after every byte of three updates), each read by GRUB in QEMU as the old or the new intent, as init reads it; %s (TCG)", n, took.Round(time.Second))
}

// TestGRUBFindsNoSerialPort: on a machine without a first serial port (COM1), grub.cfg's
// console choice (bootloader.ConsoleSelect) gives the kernel the screen alone: a console=
// naming the missing port would take /dev/console, and init's lines, to nowhere. The
// script's answer comes out of the second serial port, the only one there.
func TestGRUBFindsNoSerialPort(t *testing.T) {
	vmTest(t)
	work := t.TempDir()
	cfg := bootloader.ConsoleSelect + "serial --unit=1 --speed=115200\nterminal_input serial\nterminal_output serial\necho \"consoles: $console_args.\"\nhalt\n"
	disk := grubDisk(t, work, filepath.Join(work, "tree"), cfg)
	v := bootWith(t, Options{UEFI: true, VarsDir: t.TempDir(), Disks: []Disk{{Path: disk}}, NoCOM1: true})
	expect(t, v, "consoles: console=tty0.", 3*time.Minute)
}

// grubDisk is a disk whose ESP holds GRUB, liken's EFI image, with cfg as its grub.cfg, and
// the directories of tree.
func grubDisk(t *testing.T, work, tree, cfg string) string {
	t.Helper()
	os.MkdirAll(filepath.Join(tree, "EFI", "BOOT"), 0o755)
	os.MkdirAll(filepath.Join(tree, bootloader.ConfigDir), 0o755)
	os.WriteFile(filepath.Join(tree, bootloader.Config), []byte(cfg), 0o644)
	if err := bootloader.BuildEFI(filepath.Join(tree, bootloader.EFIBinary), work); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(work, "esp.img")
	entries, _ := os.ReadDir(tree)
	mcopy := []string{"mcopy", "-s", "-i", img}
	for _, e := range entries {
		mcopy = append(mcopy, filepath.Join(tree, e.Name()))
	}
	for _, cmd := range [][]string{
		{"mkfs.vfat", "-n", bootloader.ESPLabel, "-C", img, "65536"},
		append(mcopy, "::"),
	} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v %s", cmd[0], err, out)
		}
	}
	disk := filepath.Join(work, "disk.img")
	if err := GPTDisk(disk, 66, []Partition{{Label: "esp", SizeMiB: 64, Image: img, Type: "ef00"}}); err != nil {
		t.Fatal(err)
	}
	return disk
}

// cutLine is one line the test's GRUB script prints: the cut and what GRUB read there.
var cutLine = regexp.MustCompile(`cut /(c/[0-9]+/[0-9]+) ([dika]=[^\r\n]*)`)

// intent is what init reads from a cut (which the bootloader tests prove is the old or the
// new environment), written as the test's GRUB script prints it.
func intent(t *testing.T, c bootloader.Cut) string {
	t.Helper()
	esp := filepath.Join(t.TempDir(), "esp")
	os.MkdirAll(filepath.Join(esp, bootloader.ConfigDir), 0o755)
	for name, data := range c.Files {
		os.WriteFile(filepath.Join(esp, name), data, 0o644)
	}
	env, err := bootloader.ESP{Dir: esp}.Env()
	if err != nil {
		t.Fatalf("cut after %d bytes: %v", c.Written, err)
	}
	trial := env[bootloader.EnvTrialSlot]
	if trial == "" {
		trial = "-" // what GRUB holds when no trial is armed
	}
	return fmt.Sprintf("d=%s t=%s;i=%s;k=%s;a=%s;", env[bootloader.EnvDefaultSlot], trial,
		env[bootloader.EnvInstallArgs], env[bootloader.EnvKernelArgs], env[bootloader.EnvTrialArgs])
}
