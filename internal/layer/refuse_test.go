package layer_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"liken.dev/liken/internal/layer"
	"liken.dev/liken/internal/layer/layertest"
)

// TestUnpackRefuses: every hostile layer is refused with its message, and leaves nothing
// behind. Init's reader of the layer partition runs the same cases (internal/initd).
func TestUnpackRefuses(t *testing.T) {
	for _, tt := range layertest.Refused(t) {
		t.Run(tt.Name, func(t *testing.T) {
			parent := t.TempDir()
			dir := filepath.Join(parent, "layer")
			_, err := layer.Unpack(bytes.NewReader(tt.Data), dir, tt.Lim)
			if err == nil || !strings.Contains(err.Error(), tt.Want) {
				t.Fatalf("error = %v, want %q", err, tt.Want)
			}
			if entries, _ := os.ReadDir(parent); len(entries) != 0 {
				t.Errorf("a refused layer left %d entries behind", len(entries))
			}
		})
	}
}
