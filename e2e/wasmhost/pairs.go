package wasmhost

import (
	"encoding/binary"
	"strings"
)

// headerMap is an Envoy header map: ordered, keys lower-cased, repeated
// keys allowed.
type headerMap struct {
	pairs   [][2]string
	present bool // the map exists at this point of the stream
}

func newHeaderMap(pairs [][2]string) headerMap {
	m := headerMap{present: true}
	for _, p := range pairs {
		m.add(p[0], p[1])
	}
	return m
}

func (m *headerMap) orNil() *headerMap {
	if m == nil || !m.present {
		return nil
	}
	return m
}

func (m *headerMap) get(key string) (string, bool) {
	key = strings.ToLower(key)
	for _, p := range m.pairs {
		if p[0] == key {
			return p[1], true
		}
	}
	return "", false
}

func (m *headerMap) add(key, value string) {
	m.pairs = append(m.pairs, [2]string{strings.ToLower(key), value})
}

func (m *headerMap) remove(key string) {
	key = strings.ToLower(key)
	kept := m.pairs[:0]
	for _, p := range m.pairs {
		if p[0] != key {
			kept = append(kept, p)
		}
	}
	m.pairs = kept
}

func (m *headerMap) replace(key, value string) {
	m.remove(key)
	m.add(key, value)
}

func (m *headerMap) clone() [][2]string { return append([][2]string(nil), m.pairs...) }

// marshalPairs serialises a map the way cpp-host does: the count is always
// written, even for an empty map.
func marshalPairs(pairs [][2]string) []byte {
	size := 4
	for _, p := range pairs {
		size += 8 + len(p[0]) + len(p[1]) + 2
	}
	b := make([]byte, 4, size)
	binary.LittleEndian.PutUint32(b, uint32(len(pairs)))
	for _, p := range pairs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p[0])))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p[1])))
	}
	for _, p := range pairs {
		b = append(b, p[0]...)
		b = append(b, 0)
		b = append(b, p[1]...)
		b = append(b, 0)
	}
	return b
}

// unmarshalPairs is cpp-host's strict parser: anything not exactly in the
// ABI layout, NUL terminators and total length included, is an empty map,
// silently.
func unmarshalPairs(b []byte) [][2]string {
	if len(b) < 4 {
		return nil
	}
	n := uint64(binary.LittleEndian.Uint32(b))
	if 4+8*n > uint64(len(b)) {
		return nil
	}
	lens := b[4 : 4+8*n]
	data := b[4+8*n:]
	out := make([][2]string, 0, n)
	for i := uint64(0); i < n; i++ {
		kl := uint64(binary.LittleEndian.Uint32(lens[8*i:]))
		vl := uint64(binary.LittleEndian.Uint32(lens[8*i+4:]))
		if kl+vl+2 > uint64(len(data)) || data[kl] != 0 || data[kl+1+vl] != 0 {
			return nil
		}
		out = append(out, [2]string{string(data[:kl]), string(data[kl+1 : kl+1+vl])})
		data = data[kl+vl+2:]
	}
	if len(data) != 0 {
		return nil
	}
	return out
}
