package initd

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"

	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/layer"
)

// readLayerPartition reads a layer partition (its header, then the layer) and unpacks the
// layer into dir, with the bounds every layer read has. When the header records the
// digest of the bytes install wrote, the bytes read must have it: a layer changed or
// damaged since the install is refused, not booted.
func readLayerPartition(r io.Reader, dir string) (*layer.Index, disk.LayerHeader, error) {
	head := make([]byte, disk.LayerHeaderSize)
	n, err := io.ReadFull(r, head[:16])
	if err != nil {
		return nil, disk.LayerHeader{}, fmt.Errorf("reading the layer header: %w", err)
	}
	hdr, err := disk.ParseLayerHeader(head[:n], layer.DefaultLimits.MaxTotal)
	if errors.Is(err, disk.ErrNoLayer) {
		// Perhaps the longer form: read the rest of it.
		if _, err := io.ReadFull(r, head[16:]); err != nil {
			return nil, hdr, fmt.Errorf("reading the layer header: %w", err)
		}
		hdr, err = disk.ParseLayerHeader(head, layer.DefaultLimits.MaxTotal)
	}
	if err != nil {
		return nil, hdr, err
	}
	sum := sha256.New()
	body := io.TeeReader(io.LimitReader(r, int64(hdr.Length)), sum)
	idx, err := layer.Unpack(body, dir, layer.DefaultLimits)
	if err != nil {
		return nil, hdr, err
	}
	// Whatever the unpacker left unread is part of the bytes written.
	if _, err := io.Copy(io.Discard, body); err != nil {
		return nil, hdr, fmt.Errorf("reading the layer: %w", err)
	}
	var got [32]byte
	copy(got[:], sum.Sum(nil))
	if err := hdr.CheckWritten(got); err != nil {
		return nil, hdr, err
	}
	return idx, hdr, nil
}
