package proxywasm

import (
	"encoding/binary"
	"errors"
)

// errBadPairs reports a header map the host serialised in a shape the ABI
// does not allow.
var errBadPairs = errors.New("proxy-wasm: malformed header map")

// encodePairs serialises a header map as the ABI defines it: a u32 count, a
// (key length, value length) u32 pair per entry, then each key and value
// followed by a NUL. The host's parser rejects anything else silently, so the
// layout must be exact.
func encodePairs(pairs [][2]string) []byte {
	size := 4 + 8*len(pairs)
	for _, p := range pairs {
		size += len(p[0]) + len(p[1]) + 2
	}
	buf := make([]byte, size)
	binary.LittleEndian.PutUint32(buf, uint32(len(pairs)))
	lens := buf[4:]
	data := buf[4+8*len(pairs):]
	for i, p := range pairs {
		binary.LittleEndian.PutUint32(lens[8*i:], uint32(len(p[0])))
		binary.LittleEndian.PutUint32(lens[8*i+4:], uint32(len(p[1])))
		n := copy(data, p[0])
		data[n] = 0
		data = data[n+1:]
		n = copy(data, p[1])
		data[n] = 0
		data = data[n+1:]
	}
	return buf
}

// decodePairs parses a serialised header map. An empty input is an empty map.
// visitPairs calls fn for each pair of a serialized map, checking it as
// decodePairs does.
func visitPairs(b []byte, fn func(key, value []byte)) error {
	if len(b) == 0 {
		return nil
	}
	if len(b) < 4 {
		return errBadPairs
	}
	n := binary.LittleEndian.Uint32(b)
	if uint64(n)*8 > uint64(len(b)-4) {
		return errBadPairs
	}
	lens := b[4 : 4+8*n]
	data := b[4+8*n:]
	for i := range int(n) {
		kl := binary.LittleEndian.Uint32(lens[8*i:])
		vl := binary.LittleEndian.Uint32(lens[8*i+4:])
		if uint64(kl)+uint64(vl)+2 > uint64(len(data)) || data[kl] != 0 || data[kl+1+vl] != 0 {
			return errBadPairs
		}
		fn(data[:kl], data[kl+1:kl+1+vl])
		data = data[kl+vl+2:]
	}
	if len(data) != 0 {
		return errBadPairs
	}
	return nil
}

func decodePairs(b []byte) ([][2]string, error) {
	var pairs [][2]string
	err := visitPairs(b, func(k, v []byte) { pairs = append(pairs, [2]string{string(k), string(v)}) })
	if err != nil {
		return nil, err
	}
	return pairs, nil
}
