package disk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
)

// ext4 superblock fields (fs/ext4/ext4.h): the superblock is at byte 1024.
const (
	ext4SuperOffset   = 1024
	ext4MagicOff      = 0x38
	ext4StateOff      = 0x3A
	ext4IncompatOff   = 0x60
	ext4Magic         = 0xEF53
	ext4ValidFS       = 0x0001 // EXT4_VALID_FS: cleanly unmounted
	ext4ErrorFS       = 0x0002 // EXT4_ERROR_FS
	ext4IncompatRecov = 0x0004 // EXT4_FEATURE_INCOMPAT_RECOVER: the journal needs replay
)

// Ext4Clean reads an ext4 superblock (at offset in path) and says whether the file
// system was cleanly unmounted: valid, no errors, no journal to replay. why says what is
// not clean.
func Ext4Clean(path string, offset int64) (clean bool, why string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return false, "", err
	}
	defer f.Close()
	sb := make([]byte, 1024)
	if _, err := f.ReadAt(sb, offset+ext4SuperOffset); err != nil {
		return false, "", fmt.Errorf("reading the ext4 superblock of %s: %w", path, err)
	}
	if binary.LittleEndian.Uint16(sb[ext4MagicOff:]) != ext4Magic {
		return false, "", errors.New(path + " holds no ext4 file system")
	}
	state := binary.LittleEndian.Uint16(sb[ext4StateOff:])
	incompat := binary.LittleEndian.Uint32(sb[ext4IncompatOff:])
	switch {
	case incompat&ext4IncompatRecov != 0:
		return false, "its journal needs recovery: it was not unmounted (power lost, or a crash)", nil
	case state&ext4ErrorFS != 0:
		return false, "it has recorded errors", nil
	case state&ext4ValidFS == 0:
		return false, "it is not marked valid", nil
	}
	return true, "", nil
}
