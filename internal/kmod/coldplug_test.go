package kmod

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// TestPresent: the devices of a sysfs tree with a modalias, each with the modules of the
// index that serve it, in path order; a device no module serves has none, one with an
// empty modalias is not listed.
func TestPresent(t *testing.T) {
	ix := testIndex(t)
	sys := t.TempDir()
	for path, alias := range map[string]string{
		"bus/pci/devices/0000:00:03.0":     "pci:v00001AF4d00001000sv00001AF4sd00000001bc02sc00i00\n",
		"bus/pci/devices/0000:00:1f.2":     "pci:v00008086d00002922sv00001AF4sd00001100bc01sc06i01\n",
		"bus/platform/devices/serial8250":  "\n",
		"bus/virtio/devices/virtio0":       "virtio:d00000001v00001AF4\n",
		"bus/pci/devices/0000:00:04.0/sub": "",
	} {
		if err := os.MkdirAll(filepath.Join(sys, path), 0o755); err != nil {
			t.Fatal(err)
		}
		if alias != "" {
			if err := os.WriteFile(filepath.Join(sys, path, "modalias"), []byte(alias), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, err := ix.Present(sys)
	if err != nil {
		t.Fatal(err)
	}
	want := []Device{
		{Path: filepath.Join(sys, "bus/pci/devices/0000:00:03.0"), Alias: "pci:v00001AF4d00001000sv00001AF4sd00000001bc02sc00i00", Modules: []string{"virtio_net"}},
		{Path: filepath.Join(sys, "bus/pci/devices/0000:00:1f.2"), Alias: "pci:v00008086d00002922sv00001AF4sd00001100bc01sc06i01"},
		{Path: filepath.Join(sys, "bus/virtio/devices/virtio0"), Alias: "virtio:d00000001v00001AF4"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Present =\n%+v\nwant\n%+v", got, want)
	}
	os.MkdirAll(filepath.Join(sys, "module", "virtio_net"), 0o755)
	if !Loaded(sys, "virtio-net") || Loaded(sys, "e1000e") {
		t.Errorf("Loaded: virtio-net %v, e1000e %v; want true, false", Loaded(sys, "virtio-net"), Loaded(sys, "e1000e"))
	}
}
