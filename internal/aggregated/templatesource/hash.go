package templatesource

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"maps"
	"slices"
)

// FilesHash identifies a template source by content: two spec.files maps
// hash alike exactly when they hold the same paths with the same
// contents. Paths and contents are length-prefixed, so no two different
// maps share an encoding.
func FilesHash(files map[string]string) string {
	h := sha256.New()
	var n [8]byte
	write := func(s string) {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	for _, p := range slices.Sorted(maps.Keys(files)) {
		write(p)
		write(files[p])
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}
