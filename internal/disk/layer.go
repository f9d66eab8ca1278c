package disk

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
)

// The layer partition holds a header, the layer's bytes, and a trailer:
//
//	"LIKENLYR" | length (8 bytes, little endian)                                  16 bytes
//	the layer                                                                     length bytes
//	"LIKENDG1" | SHA-256 of the layer as built | SHA-256 of the bytes written     72 bytes
//
// The layer as built is what `liken layer` printed and `liken install --layer-digest`
// checked; the bytes written differ from it when install narrowed the layer to one machine
// (--machine). The digests come after the layer so that an init from before they were
// recorded (a rollback to an older release) still reads the partition; a partition
// written before has no trailer, and nothing recorded.
const (
	layerMagic   = "LIKENLYR"
	trailerMagic = "LIKENDG1"
)

// LayerHeaderSize and LayerTrailerSize frame the layer in its partition.
const (
	LayerHeaderSize  = 16
	LayerTrailerSize = 72
)

// LayerRecord describes the layer a layer partition holds.
type LayerRecord struct {
	// Length of the layer's bytes after the header.
	Length uint64
	// Built and Written are the SHA-256 of the layer as built and of the bytes written;
	// zero when the partition has no trailer (nothing recorded).
	Built, Written [32]byte
}

// NewLayerRecord is the record of data, written from a layer whose digest as built is
// built ("sha256:..." as liken layer prints it).
func NewLayerRecord(data []byte, built string) (LayerRecord, error) {
	r := LayerRecord{Length: uint64(len(data)), Written: sha256.Sum256(data)}
	hexDigest, ok := bytes.CutPrefix([]byte(built), []byte("sha256:"))
	b, err := hex.DecodeString(string(hexDigest))
	if !ok || err != nil || len(b) != 32 {
		return r, fmt.Errorf("%q is not a layer digest (sha256: and 64 hex digits)", built)
	}
	copy(r.Built[:], b)
	return r, nil
}

// Header is the partition's first LayerHeaderSize bytes.
func (r LayerRecord) Header() []byte {
	b := make([]byte, LayerHeaderSize)
	copy(b, layerMagic)
	binary.LittleEndian.PutUint64(b[8:], r.Length)
	return b
}

// Trailer is what follows the layer's bytes.
func (r LayerRecord) Trailer() []byte {
	b := make([]byte, LayerTrailerSize)
	copy(b, trailerMagic)
	copy(b[8:], r.Built[:])
	copy(b[40:], r.Written[:])
	return b
}

// Recorded says whether the partition records the layer's digests.
func (r LayerRecord) Recorded() bool { return r.Written != [32]byte{} }

// BuiltDigest is the layer's digest as built, "sha256:..." ("" when not recorded).
func (r LayerRecord) BuiltDigest() string {
	if !r.Recorded() {
		return ""
	}
	return "sha256:" + hex.EncodeToString(r.Built[:])
}

// ErrNoLayer: the partition does not start with a layer header.
var ErrNoLayer = errors.New("holds no deployment layer (install writes one)")

// ParseLayerHeader reads the header, refusing a length over max.
func ParseLayerHeader(b []byte, max int64) (LayerRecord, error) {
	var r LayerRecord
	if len(b) < LayerHeaderSize || string(b[:8]) != layerMagic {
		return r, ErrNoLayer
	}
	r.Length = binary.LittleEndian.Uint64(b[8:16])
	if r.Length > uint64(max) {
		return r, fmt.Errorf("the layer's recorded length %d is more than a layer may be (%d bytes): the partition is damaged", r.Length, max)
	}
	return r, nil
}

// ReadTrailer takes the digests from the bytes after the layer, when they are a trailer.
func (r *LayerRecord) ReadTrailer(b []byte) {
	if len(b) >= LayerTrailerSize && string(b[:8]) == trailerMagic {
		copy(r.Built[:], b[8:40])
		copy(r.Written[:], b[40:72])
	}
}

// CheckWritten compares the layer's bytes, as read, with what install recorded.
func (r LayerRecord) CheckWritten(sum [32]byte) error {
	if r.Recorded() && sum != r.Written {
		return fmt.Errorf("the layer partition's %d bytes have SHA-256 %x, not the %x install wrote: the layer was changed or damaged after install; install it again",
			r.Length, sum, r.Written)
	}
	return nil
}
