package kmod

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Coldplug is what udev does at boot for the devices already present: every device the
// kernel lists with a modalias (/sys/bus/*/devices/*/modalias: PCI, USB, virtio, ACPI,
// platform...) gets the modules whose modules.alias patterns match it, so a NIC, a disk
// controller or a watchdog the image carries works without being named anywhere.

// Device is one device present and the modules its modalias resolves to.
type Device struct {
	// Path is its directory under /sys/bus/BUS/devices; Alias its modalias.
	Path, Alias string
	// Modules are the modules its alias matches (none when a built-in driver or no driver
	// of this kernel serves it).
	Modules []string
}

// Present lists the devices under sys (/sys) with a modalias, each with the modules of ix
// that serve it, in path order. A device served by a built-in driver, or by no module of
// the image, has none.
func (ix *Index) Present(sys string) ([]Device, error) {
	paths, err := filepath.Glob(filepath.Join(sys, "bus", "*", "devices", "*", "modalias"))
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	var out []Device
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // a device that went away
		}
		alias := strings.TrimSpace(string(b))
		if alias == "" {
			continue
		}
		d := Device{Path: filepath.Dir(p), Alias: alias}
		mods, _, err := ix.Lookup(alias)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		d.Modules = mods
		out = append(out, d)
	}
	return out, nil
}

// Loaded says whether a module is in the kernel now (/sys/module/NAME).
func Loaded(sys, module string) bool {
	_, err := os.Stat(filepath.Join(sys, "module", Name(module)))
	return err == nil
}
