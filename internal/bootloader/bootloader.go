// Package bootloader is liken's GRUB: the EFI image, the A/B configuration with its one-shot
// trial, and the environment block both GRUB and liken read and write.
//
// The trial protocol: the environment block names default_slot (the last slot that booted
// successfully) and, while an upgrade or new kernel arguments are tried, trial_slot (and
// trial_args, the arguments the trial boots with instead of kernel_args). GRUB boots
// trial_slot once and
// clears it in the environment block *before* it loads the kernel, so every failure after
// that point (kernel panic, hang ended by the watchdog, power cut, failed health deadline
// followed by a reboot) ends on default_slot. Only liken, once the tried slot is healthy,
// makes it the default.
package bootloader

import (
	"bytes"
	"fmt"
	"os/exec"
	"sort"
	"strings"
)

// EnvSize is the size of GRUB's environment block; GRUB rewrites it in place and never
// resizes it.
const EnvSize = 1024

const envHeader = "# GRUB Environment Block\n"

// Env is the content of an environment block.
type Env map[string]string

// ParseEnv reads an environment block. A damaged block (torn by a power cut) is an error;
// callers treat it as "no trial".
func ParseEnv(b []byte) (Env, error) {
	if len(b) != EnvSize || !bytes.HasPrefix(b, []byte(envHeader)) {
		return nil, fmt.Errorf("not a GRUB environment block (%d bytes)", len(b))
	}
	e := Env{}
	for _, line := range strings.Split(string(b[len(envHeader):]), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("environment block: malformed line %q", line)
		}
		e[k] = strings.NewReplacer(`\\`, `\`, `\n`, "\n").Replace(v)
	}
	return e, nil
}

// Encode writes the block, padded with '#' to EnvSize.
func (e Env) Encode() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(envHeader)
	for _, k := range e.keys() {
		b.WriteString(k + "=" + escapeEnv(e[k]) + "\n")
	}
	if b.Len() > EnvSize {
		return nil, fmt.Errorf("environment block: %d bytes of variables do not fit in %d", b.Len(), EnvSize)
	}
	b.Write(bytes.Repeat([]byte("#"), EnvSize-b.Len()))
	return b.Bytes(), nil
}

// ownArgs are the arguments GRUB gives every boot (ConfigText): which slot, whether it is a
// trial. They come last and win, but an operator who gives them means something liken will
// not do, so install refuses them.
var ownArgs = []string{"liken.root", "liken.slot", "liken.trial"}

// CheckInstallArgs refuses install kernel arguments that name liken's own boot arguments.
func CheckInstallArgs(args string) error {
	for _, a := range strings.Fields(args) {
		k, _, _ := strings.Cut(a, "=")
		for _, own := range ownArgs {
			if k == own {
				return fmt.Errorf("--kernel-args %q: %s is liken's own boot argument (GRUB sets it at every boot, last, so it would be ignored)", args, k)
			}
		}
	}
	return nil
}

func (e Env) keys() []string {
	keys := make([]string, 0, len(e))
	for k := range e {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func escapeEnv(v string) string { return strings.NewReplacer(`\`, `\\`, "\n", `\n`).Replace(v) }

// ESPLabel is the FAT label of the EFI system partition, which GRUB searches for.
const ESPLabel = "LIKEN-ESP"

// Paths on the ESP.
const (
	EFIBinary = "EFI/BOOT/BOOTX64.EFI" // the removable-media path firmware boots without NVRAM entries
	ConfigDir = "EFI/liken"
	Config    = ConfigDir + "/grub.cfg"
	EnvFile   = ConfigDir + "/grubenv"
)

// embedded is built into the EFI image: find the ESP, hand over to its grub.cfg.
const embedded = `search --no-floppy --label ` + ESPLabel + ` --set=root
set prefix=($root)/` + ConfigDir + `
configfile $prefix/grub.cfg
`

// modules GRUB needs for liken's configuration. efi_gop and efi_uga are the firmware's
// framebuffer: without a video driver GRUB boots Linux "in blind mode", giving it no
// framebuffer, and a UEFI machine's screen (which has no text mode) shows nothing after GRUB.
var modules = []string{"part_gpt", "fat", "normal", "linux", "loadenv", "test", "echo", "search",
	"search_label", "configfile", "serial", "terminal", "gzio", "regexp", "sleep", "reboot", "halt",
	"efi_gop", "efi_uga"}

// BuildEFI makes GRUB's EFI image with grub-mkimage (Debian's grub-efi-amd64-bin); its PE
// timestamp is fixed, so the image is reproducible.
func BuildEFI(out, workDir string) error {
	return BuildEFIWith(out, workDir, embedded, "/"+ConfigDir)
}

// BuildEFIWith is BuildEFI with another embedded configuration and prefix, and more modules
// (an installer's GRUB reads ISO 9660 and mounts a slot image as a loop device).
func BuildEFIWith(out, workDir, embeddedConfig, prefix string, more ...string) error {
	cfg := workDir + "/grub-embedded.cfg"
	if err := writeFile(cfg, []byte(embeddedConfig)); err != nil {
		return err
	}
	args := append(append([]string{"-O", "x86_64-efi", "-o", out, "-c", cfg, "-p", prefix}, modules...), more...)
	if b, err := exec.Command("grub-mkimage", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("grub-mkimage: %w: %s", err, b)
	}
	return nil
}

// BuildEFIMemdisk is BuildEFIWith for a GRUB that boots from the network: memdisk (a tar)
// is built in as (memdisk), with the files its embedded configuration reads there, and the
// prefix is set after it (grub-mkimage's -m resets the prefix to the memdisk's).
func BuildEFIMemdisk(out, workDir, embeddedConfig, memdisk, prefix string, more ...string) error {
	cfg := workDir + "/grub-embedded.cfg"
	if err := writeFile(cfg, []byte(embeddedConfig)); err != nil {
		return err
	}
	args := append(append([]string{"-O", "x86_64-efi", "-o", out, "-m", memdisk, "-c", cfg, "-p", prefix}, modules...), more...)
	if b, err := exec.Command("grub-mkimage", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("grub-mkimage: %w: %s", err, b)
	}
	return nil
}

// EnvSelect defines pick_env DIR, which sets envfile to the current copy of liken's
// environment in DIR (see ESP.Env): the sealed copy (gen equals seal) with the higher
// generation; a disk with one copy and no generation (installed before there were two)
// uses that one. The torn-write VM test runs exactly this text on every cut it makes.
const EnvSelect = `function pick_env {
  set gen=
  set seal=
  load_env --file $1/grubenv gen seal
  set g1="$gen"
  set s1="$seal"
  set gen=
  set seal=
  load_env --file $1/grubenv2 gen seal
  set envfile=$1/grubenv
  if [ -n "$gen" -a "$gen" = "$seal" ]; then
    if [ -z "$g1" -o "$g1" != "$s1" ]; then
      set envfile=$1/grubenv2
    elif [ "$gen" -gt "$g1" ]; then
      set envfile=$1/grubenv2
    fi
  fi
}
`

// ConsoleSelect sets console_args, the kernel's consoles: the screen (tty0) always, and the
// first serial port (ttyS0, 115200 baud) last, so that /dev/console is it, only where GRUB
// finds one. GRUB registers com0 only if the UART's scratch register keeps what it writes
// (grub-core/term/ns8250.c), so "serial --unit=0" fails on a machine without one; a
// console= naming a port that is not there would take /dev/console, and init's lines with
// it, to nowhere. GRUB's own lines go to the serial port and the firmware's console.
const ConsoleSelect = `if serial --unit=0 --speed=115200; then
  terminal_input serial console
  terminal_output serial console
  set console_args="console=tty0 console=ttyS0,115200"
else
  terminal_input console
  terminal_output console
  set console_args="console=tty0"
fi
`

// ConfigText is grub.cfg. Slots are partitions 2 (A) and 3 (B) of the disk holding the ESP.
// apparmor=0: Debian's kernel enables AppArmor, and containerd then needs apparmor_parser,
// which the image does not carry; without it every pod would fail to start.
const ConfigText = ConsoleSelect + `set timeout=0
regexp --set=1:disk '^(.*),gpt[0-9]+$' "$root"
` + EnvSelect + `pick_env $prefix
load_env --file $envfile default_slot trial_slot install_args kernel_args trial_args
if [ "$default_slot" != "B" ]; then set default_slot=A; fi
set slot=$default_slot
set trial=0
set args="$kernel_args"
if [ "$trial_slot" = "A" -o "$trial_slot" = "B" ]; then
  set slot=$trial_slot
  set trial=1
  set args="$trial_args"
  # Consumed before the kernel starts: whatever happens next, the following boot is the
  # last good slot unless liken commits this one. One byte changes (B to -), in place.
  set trial_slot=-
  save_env --file $envfile trial_slot
fi
# boot_slot SLOT TRIAL boots with the kernel arguments in $args. Values with spaces are
# quoted: unquoted, "set" and function calls would take only their first word.
function boot_slot {
  if [ "$1" = "A" ]; then set part=2; set label=liken-slot-a; else set part=3; set label=liken-slot-b; fi
  echo "liken-grub: booting slot $1 (trial $2) with: $install_args $args"
  # liken's own arguments come last, so they win over an operator's (the kernel and init
  # both take the last of a repeated argument): panic=5 makes a panic end in a reboot,
  # which is how a failed trial falls back.
  if linux ($disk,gpt$part)/vmlinuz $install_args $args $console_args panic=5 apparmor=0 liken.root=PARTLABEL=$label liken.slot=$1 liken.trial=$2; then
    if initrd ($disk,gpt$part)/initramfs.img; then
      boot
    fi
  fi
  echo "liken-grub: slot $1 could not be loaded"
}
boot_slot $slot $trial
if [ "$trial" = "1" ]; then
  echo "liken-grub: trial of slot $slot failed to load; booting the last good slot $default_slot"
  set args="$kernel_args"
  boot_slot $default_slot 0
fi
echo "liken-grub: no slot could be loaded; rebooting in 10 seconds"
sleep 10
reboot
`
