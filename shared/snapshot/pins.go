package snapshot

import (
	"cmp"
	"slices"
	"strconv"
)

// GroupDepth is how many leading blocks name a prompt's group: 16 blocks
// of 64 bytes, about 250 tokens, past a chat template's preamble and into
// what the tenant wrote. cachesync learns each group's decode demand and
// moves groups between endpoints (EndpointInfo.Pins); the policy follows.
const GroupDepth = 16

// GroupKey returns the key of the group of a prompt of chained block
// hashes: the hash of its first GroupDepth blocks, which names all of
// them, or of all of them when it has fewer. ok is false for a prompt of
// no block.
func GroupKey(hashes []uint64) (key uint64, ok bool) {
	if len(hashes) == 0 {
		return 0, false
	}
	return hashes[min(len(hashes), GroupDepth)-1], true
}

// MaxPins bounds the groups pinned to one endpoint.
const MaxPins = 255

// pinRowSize is a pin row: the group key (uint64), the endpoint table
// slot (uint16), 6 reserved bytes.
const pinRowSize = 16

// appendPinRows appends every endpoint's pins as rows sorted by key, and
// returns how many rows each endpoint got. A key pinned to two endpoints goes to the
// one in the lower slot: the planner pins a group to one endpoint, and a
// reader must find one answer.
func appendPinRows(dst []byte, eps []epState) ([]byte, []int) {
	type pin struct {
		key  uint64
		slot int
	}
	var all []pin
	for i := range eps {
		if e := &eps[i]; !e.vacant {
			for _, k := range e.info.Pins {
				all = append(all, pin{k, i})
			}
		}
	}
	slices.SortFunc(all, func(a, b pin) int {
		if c := cmp.Compare(a.key, b.key); c != 0 {
			return c
		}
		return cmp.Compare(a.slot, b.slot)
	})
	counts := make([]int, len(eps))
	for i, p := range all {
		if i > 0 && all[i-1].key == p.key {
			continue
		}
		var r [pinRowSize]byte
		le.PutUint64(r[0:], p.key)
		le.PutUint16(r[8:], uint16(p.slot))
		dst = append(dst, r[:]...)
		counts[p.slot]++
	}
	return dst, counts
}

// checkPins checks the pin rows: keys rise strictly, each names a listed
// endpoint, reserved bytes are zero, and each endpoint's row count is the
// one its endpoint row gives.
func (m *Manifest) checkPins() error {
	counts := make([]int, m.n)
	for k := 0; k < len(m.pins)/pinRowSize; k++ {
		r := m.pins[pinRowSize*k:]
		key, ep := le.Uint64(r), int(le.Uint16(r[8:]))
		if (k > 0 && key <= le.Uint64(m.pins[pinRowSize*(k-1):])) || ep >= m.n || m.Endpoint(ep).Vacant() ||
			le.Uint32(r[10:])|uint32(le.Uint16(r[14:])) != 0 {
			return corrupt("manifest: pin row " + strconv.Itoa(k) + " out of order, for no endpoint or with reserved bytes set")
		}
		counts[ep]++
	}
	for i, n := range counts {
		if n != int(m.Endpoint(i).r[23]) {
			return corrupt("manifest: endpoint " + strconv.Itoa(i) + "'s pin count does not match its rows")
		}
	}
	return nil
}

// Pinned returns the endpoint slot the group of key (GroupKey) is pinned
// to; ok is false when it is pinned nowhere. It does not allocate.
func (m *Manifest) Pinned(key uint64) (slot int, ok bool) {
	lo, hi := 0, len(m.pins)/pinRowSize
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		k := le.Uint64(m.pins[pinRowSize*mid:])
		switch {
		case k < key:
			lo = mid + 1
		case k > key:
			hi = mid
		default:
			return int(le.Uint16(m.pins[pinRowSize*mid+8:])), true
		}
	}
	return 0, false
}

// HasPins reports whether any group is pinned.
func (m *Manifest) HasPins() bool { return len(m.pins) > 0 }

// Pins returns how many groups are pinned to the endpoint.
func (e Endpoint) Pins() int { return int(e.r[23]) }
