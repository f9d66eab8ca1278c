package installer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/host/datadisk"
	"liken.dev/liken/internal/install"
	"liken.dev/liken/internal/layer"
	"liken.dev/liken/internal/release"
)

// Env is the machine the install mode runs on.
type Env struct {
	// Medium is where the installer image is mounted (initramfs.MediumDir).
	Medium string
	// ManifestDigest, when set, is the manifest's digest as the boot loader was built with
	// it (liken.install.manifest=): a network boot's files are checked against it.
	ManifestDigest string
	// Dev and Sys are "/dev" and "/sys" (a test's trees elsewhere).
	Dev, Sys string
	// MACs and Serial identify the machine, as spec.match names it.
	MACs   map[string]bool
	Serial string
	// Disks are the whole disks present (hardware inventory names, such as vda or nvme0n1).
	Disks []v1alpha1.DiskInfo
	// Tools make the file systems: the release image's.
	Tools install.Tools
	Log   io.Writer
}

// Refusal is an install the mode would not do: nothing was written to any disk.
type Refusal struct{ Why string }

func (r *Refusal) Error() string { return r.Why }

// Plan is what the install mode decided before anything is written.
type Plan struct {
	Manifest *Manifest
	// Layer is the layer file holding the machine's Machine, LayerDigest its digest.
	Layer, LayerDigest string
	Machine            *v1alpha1.Machine
	// How says how the Machine was found, Disk is the disk to install and Why how it was
	// chosen; Wipe says the Machine's wipe allows erasing what it holds.
	How, Disk, Why string
	Wipe           bool
}

// Decide reads the image and the machine, and says what to install where, or refuses.
func Decide(env Env) (*Plan, error) {
	b, err := os.ReadFile(filepath.Join(env.Medium, ManifestPath))
	if err != nil {
		return nil, fmt.Errorf("reading the installer's manifest: %w", err)
	}
	if env.ManifestDigest != "" {
		h := sha256.Sum256(b)
		if got := "sha256:" + hex.EncodeToString(h[:]); got != env.ManifestDigest {
			return nil, &Refusal{Why: fmt.Sprintf("the installer's manifest is %s, not the %s its boot loader was built with: the installer's files are not the ones built with it", got, env.ManifestDigest)}
		}
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil || m.Schema != Schema {
		return nil, fmt.Errorf("the installer's manifest is not a %s manifest (%v)", Schema, err)
	}
	p := &Plan{Manifest: &m}
	// Every Machine of every layer, each with its layer: the hardware says which is this one.
	var machines []*v1alpha1.Machine
	layerOf := map[*v1alpha1.Machine]Layer{}
	for _, l := range m.Layers {
		path := filepath.Join(env.Medium, LayersDir, l.Name)
		data, err := readChecked(path, l.Digest)
		if err != nil {
			return nil, err
		}
		idx, files, err := layer.Read(bytes.NewReader(data), layer.DefaultLimits)
		if err != nil {
			return nil, fmt.Errorf("the layer %s: %w", l.Name, err)
		}
		// Every layer holds every Machine's manifest; a machine is installed from the layer
		// holding its credential.
		own := map[string]bool{}
		for _, name := range idx.Machines {
			own[name] = true
		}
		for name, fb := range files {
			if !strings.HasPrefix(name, layer.MachinesDir+"/") {
				continue
			}
			mm, err := layer.DecodeMachine(name, fb)
			if err != nil {
				return nil, fmt.Errorf("the layer %s: %w", l.Name, err)
			}
			if !own[mm.Name] {
				continue
			}
			machines = append(machines, mm)
			layerOf[mm] = l
		}
	}
	sort.Slice(machines, func(i, j int) bool { return machines[i].Name < machines[j].Name })
	mach, how, err := layer.Pick(machines, env.MACs, env.Serial, "")
	if err != nil && len(machines) == 1 {
		// Nothing matches, but the installer holds one Machine: it is this machine's.
		mach, how, err = machines[0], "the only Machine the installer holds", nil
	}
	if err != nil {
		return nil, &Refusal{Why: err.Error()}
	}
	p.Machine, p.How = mach, how
	l := layerOf[mach]
	p.Layer, p.LayerDigest = filepath.Join(env.Medium, LayersDir, l.Name), l.Digest
	if err := chooseDisk(env, p); err != nil {
		return nil, err
	}
	return p, nil
}

// readChecked reads a file of the image and checks it is the one the manifest names.
func readChecked(path, digest string) ([]byte, error) {
	lf, size, err := layer.Open(path, layer.DefaultLimits)
	if err != nil {
		return nil, err
	}
	defer lf.Close()
	data := make([]byte, size)
	if _, err := io.ReadFull(lf, data); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	sum := sha256.Sum256(data)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != digest {
		return nil, fmt.Errorf("%s is %s, not the %s the installer's manifest names: the image is damaged", path, got, digest)
	}
	return data, nil
}

// chooseDisk picks the install disk: the one spec.install names, else the one disk that
// can be it (not the installer's own medium, not a data disk spec.disks names, large
// enough); and checks that it is empty, or that the Machine's wipe names it and what it
// holds.
func chooseDisk(env Env, p *Plan) error {
	de := datadisk.Env{Dev: env.Dev, Sys: env.Sys, Wait: 30 * time.Second}
	datadisk.LinkByID(env.Dev, env.Sys)
	minBytes := int64(disk.DefaultLayout.MinSizeMiB()) << 20
	var wipe *v1alpha1.DiskWipe
	if in := p.Machine.Spec.Install; in != nil && in.Disk != "" {
		dev, _, err := de.Resolve(string(in.Disk))
		if err != nil {
			return &Refusal{Why: fmt.Sprintf("Machine %s's spec.install.disk %s: %v", p.Machine.Name, in.Disk, err)}
		}
		p.Disk, p.Why, wipe = dev, "spec.install.disk names "+string(in.Disk), in.Wipe
	} else {
		data := map[string]bool{}
		for _, d := range p.Machine.Spec.Disks {
			if dev, err := filepath.EvalSymlinks(string(d.Device)); err == nil {
				data[filepath.Base(dev)] = true
			}
		}
		medium := mediumDisk(env)
		var eligible, not []string
		for _, d := range env.Disks {
			switch {
			case d.Name == medium:
				not = append(not, d.Name+" (the installer's own medium)")
			case data[d.Name]:
				not = append(not, d.Name+" (a data disk spec.disks names)")
			case d.SizeBytes < minBytes:
				not = append(not, fmt.Sprintf("%s (%d MiB: smaller than the %d MiB liken needs)", d.Name, d.SizeBytes>>20, minBytes>>20))
			default:
				eligible = append(eligible, d.Name)
			}
		}
		switch len(eligible) {
		case 0:
			return &Refusal{Why: fmt.Sprintf("no disk to install on: %s", orNone(not))}
		case 1:
			p.Disk, p.Why = filepath.Join(env.Dev, eligible[0]), "the one disk that can be the install disk"
			if len(not) > 0 {
				p.Why += "; not " + strings.Join(not, ", ")
			}
		default:
			return &Refusal{Why: fmt.Sprintf("%d disks could be the install disk (%s): name one in Machine %s's spec.install.disk", len(eligible), strings.Join(eligible, ", "), p.Machine.Name)}
		}
	}
	f, err := os.Open(p.Disk)
	if err != nil {
		return err
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	if size < minBytes {
		return &Refusal{Why: fmt.Sprintf("%s is %d MiB: liken needs at least %d MiB", p.Disk, size>>20, minBytes>>20)}
	}
	found, err := datadisk.Inspect(f, size)
	if err != nil {
		return err
	}
	if found.Empty {
		return nil
	}
	serial := de.Serial(p.Disk)
	switch {
	case wipe != nil && wipe.Serial == serial && wipe.ContentID == found.ContentID:
		p.Wipe = true
		return nil
	case wipe != nil:
		return &Refusal{Why: fmt.Sprintf("%s holds %s, and Machine %s's wipe names another disk or content (serial %q, content %s; this disk: serial %q, content %s): nothing was written", p.Disk, found.What, p.Machine.Name, wipe.Serial, wipe.ContentID, serial, found.ContentID)}
	}
	what := found.What
	if found.Table != nil && liken(found.Table) {
		what = "liken already (an install of it: if this machine booted the installer again after installing, take the medium out or boot the disk first)"
	}
	hint := fmt.Sprintf("to install over it, set Machine %s's spec.install {disk: ..., wipe: {serial: %q, contentID: %q}}", p.Machine.Name, serial, found.ContentID)
	if serial == "" {
		hint = "this disk reports no serial number, so no wipe can name it: erase its first and last MiB by other means to install on it"
	}
	return &Refusal{Why: fmt.Sprintf("%s is not empty: it holds %s. Nothing was written: %s", p.Disk, what, hint)}
}

// liken says whether a table is a liken install's.
func liken(t *disk.Table) bool {
	for _, e := range t.Entries {
		if e.Name == disk.State {
			return true
		}
	}
	return false
}

// mediumDisk is the whole disk the installer image is mounted from, by name ("" for a CD,
// which is no disk).
func mediumDisk(env Env) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 10 || f[4] != env.Medium {
			continue
		}
		for i, w := range f {
			if w == "-" && i+2 < len(f) {
				dev := filepath.Base(f[i+2])
				if whole := datadisk.WholeDisk(env.Sys, env.Dev, filepath.Join(env.Dev, dev)); whole != "" {
					return filepath.Base(whole)
				}
				return dev
			}
		}
	}
	return ""
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "the machine has no disk liken's kernel sees (its controller's driver is not in the image?)"
	}
	return strings.Join(s, ", ")
}

// Install installs the plan's disk as `liken install` does, from the image's copy of the
// channel.
func Install(ctx context.Context, env Env, p *Plan) (install.Result, error) {
	m := p.Manifest
	if env.Log == nil {
		env.Log = io.Discard
	}
	o := install.Options{
		Channel: "file://" + filepath.Join(env.Medium, ChannelDir), Pin: m.Pin, Version: m.Version,
		Layer: p.Layer, LayerDigest: p.LayerDigest, Disk: p.Disk, Machine: p.Machine.Name, Wipe: p.Wipe,
		KernelArgs: m.KernelArgs, Tools: env.Tools, Log: env.Log,
		Fetcher: &release.Fetcher{Progress: release.PrintProgress(env.Log)},
	}
	// The builder's word that the channel is taken unsigned, written in the manifest; a
	// signed copy is checked against the root the layer's Cluster names.
	if !m.Signed && m.Unsigned == "--insecure-unsigned" {
		o.InsecureUnsigned = true
	}
	if !m.Signed && m.Unsigned == "" {
		return install.Result{}, errors.New("the installer's manifest says neither that its release is signed nor that it was taken unsigned")
	}
	return install.Install(ctx, o)
}
