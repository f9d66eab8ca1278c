package disk

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
)

// The layer partition starts with a header, then the layer's bytes. Two forms exist:
//
//	"LIKENLYR" | length (8 bytes, little endian)                                   (16 bytes)
//	"LIKENLY2" | length | SHA-256 of the layer as built | SHA-256 of the bytes written (80 bytes)
//
// The first is what installs before the digests were recorded wrote; it is still read.
// The layer as built is what `liken layer` printed and `liken install --layer-digest`
// checked; the bytes written differ from it when install narrowed the layer to one
// machine (--machine).
const (
	layerMagicV1 = "LIKENLYR"
	layerMagicV2 = "LIKENLY2"
)

// LayerHeaderSize is the largest header: a partition holds at most its size less this.
const LayerHeaderSize = 80

// LayerHeader describes the layer a layer partition holds.
type LayerHeader struct {
	// Length of the layer's bytes after the header.
	Length uint64
	// Built and Written are the SHA-256 of the layer as built and of the bytes written;
	// both zero in a header of the first form (nothing recorded).
	Built, Written [32]byte
	// Size is the header's own size.
	Size int
}

// NewLayerHeader is the header for data, written from a layer whose digest as built is
// built ("sha256:..." as liken layer prints it).
func NewLayerHeader(data []byte, built string) (LayerHeader, error) {
	h := LayerHeader{Length: uint64(len(data)), Written: sha256.Sum256(data), Size: LayerHeaderSize}
	b, err := hex.DecodeString(stripSHA(built))
	if err != nil || len(b) != 32 {
		return h, fmt.Errorf("%q is not a layer digest (sha256: and 64 hex digits)", built)
	}
	copy(h.Built[:], b)
	return h, nil
}

func stripSHA(d string) string {
	if len(d) > 7 && d[:7] == "sha256:" {
		return d[7:]
	}
	return "!" // not a digest
}

// Encode is the header's bytes.
func (h LayerHeader) Encode() []byte {
	b := make([]byte, LayerHeaderSize)
	copy(b, layerMagicV2)
	binary.LittleEndian.PutUint64(b[8:], h.Length)
	copy(b[16:], h.Built[:])
	copy(b[48:], h.Written[:])
	return b
}

// Recorded says whether the header records the layer's digests.
func (h LayerHeader) Recorded() bool { return h.Written != [32]byte{} }

// BuiltDigest is the layer's digest as built, "sha256:..." ("" when not recorded).
func (h LayerHeader) BuiltDigest() string {
	if !h.Recorded() {
		return ""
	}
	return "sha256:" + hex.EncodeToString(h.Built[:])
}

// ErrNoLayer: the partition does not start with a layer header.
var ErrNoLayer = errors.New("holds no deployment layer (install writes one)")

// ParseLayerHeader reads a header from the partition's first LayerHeaderSize bytes (fewer
// will do for the first form), refusing a length over max.
func ParseLayerHeader(b []byte, max int64) (LayerHeader, error) {
	var h LayerHeader
	switch {
	case len(b) >= 16 && string(b[:8]) == layerMagicV1:
		h.Size = 16
	case len(b) >= LayerHeaderSize && string(b[:8]) == layerMagicV2:
		h.Size = LayerHeaderSize
		copy(h.Built[:], b[16:48])
		copy(h.Written[:], b[48:80])
	default:
		return h, ErrNoLayer
	}
	h.Length = binary.LittleEndian.Uint64(b[8:16])
	if h.Length > uint64(max) {
		return h, fmt.Errorf("the layer's recorded length %d is more than a layer may be (%d bytes): the partition is damaged", h.Length, max)
	}
	return h, nil
}

// CheckWritten compares the layer's bytes, as read, with what the header recorded.
func (h LayerHeader) CheckWritten(sum [32]byte) error {
	if h.Recorded() && !bytes.Equal(sum[:], h.Written[:]) {
		return fmt.Errorf("the layer partition's %d bytes have SHA-256 %x, not the %x install wrote: the layer was changed or damaged after install; install it again",
			h.Length, sum, h.Written)
	}
	return nil
}
