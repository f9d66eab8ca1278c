package initd

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/layer"
	"liken.dev/liken/internal/layer/layertest"
)

// partition is a layer partition as install writes it (the trailer recording the
// digests), or as installs before wrote it (old: no trailer), with the partition's zeros
// after it.
func partition(t *testing.T, data []byte, old bool) []byte {
	t.Helper()
	sum := sha256.Sum256(data)
	rec, err := disk.NewLayerRecord(data, fmt.Sprintf("sha256:%x", sum))
	if err != nil {
		t.Fatal(err)
	}
	out := append(rec.Header(), data...)
	if !old {
		out = append(out, rec.Trailer()...)
	}
	return append(out, make([]byte, 4096)...)
}

// TestReadLayerPartition: init's reader unpacks a layer with or without the trailer, reports the
// recorded digest as built, and refuses a layer whose bytes are not those install wrote, a
// partition with no layer, and a length no layer may have.
func TestReadLayerPartition(t *testing.T) {
	data := layertest.Sample(t)
	sum := sha256.Sum256(data)
	for _, old := range []bool{false, true} {
		idx, hdr, err := readLayerPartition(bytes.NewReader(partition(t, data, old)), filepath.Join(t.TempDir(), "layer"))
		if err != nil || len(idx.Files) != 3 {
			t.Fatalf("old partition %v: %v, %+v", old, err, idx)
		}
		want := fmt.Sprintf("sha256:%x", sum)
		if old {
			want = ""
		}
		if hdr.BuiltDigest() != want {
			t.Errorf("old partition %v: digest as built %q, want %q", old, hdr.BuiltDigest(), want)
		}
	}
	changed := partition(t, data, false)
	changed[disk.LayerHeaderSize+len(data)+40] ^= 1 // the recorded digest of the bytes written no longer matches them
	damagedLength := partition(t, data, false)
	binary.LittleEndian.PutUint64(damagedLength[8:], 1<<40)
	for _, tc := range []struct {
		name string
		part []byte
		want string
	}{
		{"bytes not as written", changed, "the layer was changed or damaged after install"},
		{"no layer", make([]byte, 8192), "holds no deployment layer"},
		{"a length no layer has", damagedLength, "the partition is damaged"},
		{"cut short", partition(t, data, false)[:200], "unexpected EOF"},
	} {
		if _, _, err := readLayerPartition(bytes.NewReader(tc.part), filepath.Join(t.TempDir(), "layer")); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestReadLayerPartitionRefuses runs the layer package's hostile layers (those under the
// default bounds, which are the bounds at boot) through init's reader, with and without
// the trailer.
func TestReadLayerPartitionRefuses(t *testing.T) {
	for _, tc := range layertest.Refused(t) {
		if tc.Lim != layer.DefaultLimits {
			continue
		}
		for _, old := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/old partition %v", tc.Name, old), func(t *testing.T) {
				_, _, err := readLayerPartition(bytes.NewReader(partition(t, tc.Data, old)), filepath.Join(t.TempDir(), "layer"))
				if err == nil || !strings.Contains(err.Error(), tc.Want) {
					t.Fatalf("error = %v, want %q", err, tc.Want)
				}
			})
		}
	}
}
