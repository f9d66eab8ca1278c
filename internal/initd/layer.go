package initd

import (
	"crypto/sha256"
	"fmt"
	"io"

	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/layer"
)

// readLayerPartition reads a layer partition (header, layer, trailer: disk.LayerRecord)
// and unpacks the layer into dir, with the bounds every layer read has. When the trailer
// records the digest of the bytes install wrote, the bytes read must have it: a layer
// changed or damaged since the install is refused, not booted.
func readLayerPartition(r io.Reader, dir string) (*layer.Index, disk.LayerRecord, error) {
	head := make([]byte, disk.LayerHeaderSize)
	if _, err := io.ReadFull(r, head); err != nil {
		return nil, disk.LayerRecord{}, fmt.Errorf("reading the layer header: %w", err)
	}
	rec, err := disk.ParseLayerHeader(head, layer.DefaultLimits.MaxTotal)
	if err != nil {
		return nil, rec, err
	}
	sum := sha256.New()
	body := io.TeeReader(io.LimitReader(r, int64(rec.Length)), sum)
	idx, err := layer.Unpack(body, dir, layer.DefaultLimits)
	if err != nil {
		return nil, rec, err
	}
	// Whatever the unpacker left unread is part of the bytes written.
	if _, err := io.Copy(io.Discard, body); err != nil {
		return nil, rec, fmt.Errorf("reading the layer: %w", err)
	}
	trailer := make([]byte, disk.LayerTrailerSize)
	if _, err := io.ReadFull(r, trailer); err == nil {
		rec.ReadTrailer(trailer)
	}
	var got [32]byte
	copy(got[:], sum.Sum(nil))
	if err := rec.CheckWritten(got); err != nil {
		return nil, rec, err
	}
	return idx, rec, nil
}
