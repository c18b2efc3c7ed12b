package snapshot

import (
	"math/bits"
	"strconv"
)

// MaxEndpoints is the most endpoints a snapshot can list: a holder code
// keeps the endpoint's slot in 14 bits next to its tier.
const MaxEndpoints = 16383

// MaxShardBits caps the shard count at 4096.
const MaxShardBits = 12

const (
	maxDirBits = 20
	noCode     = 0x7FFF     // "no holder" in an inline value
	extFlag    = 1 << 31    // value points into the extension area
	emptyVal   = 0x7FFF7FFF // inline value of the empty set: a delta tombstone
	tableFixed = 16         // table fields after the part header
)

// Tier is where an endpoint keeps a cached block.
type Tier uint8

// The tiers. An endpoint that holds a block in both keeps it as TierGPU.
const (
	TierGPU Tier = 0 // in accelerator memory: a hit costs nothing
	TierCPU Tier = 1 // offloaded to host memory or further: a hit costs a transfer
)

// String returns "gpu" or "cpu".
func (t Tier) String() string {
	if t == TierGPU {
		return "gpu"
	}
	return "cpu"
}

// Holder is one endpoint holding one block: its slot in the endpoint table
// and the tier it holds the block in.
type Holder uint16

// Endpoint returns the holder's slot in the endpoint table.
func (h Holder) Endpoint() int { return int(h >> 1) }

// Tier returns where the holder keeps the block.
func (h Holder) Tier() Tier { return Tier(h & 1) }

func holderCode(slot int, t Tier) uint16 { return uint16(slot)<<1 | uint16(t&1) }

// Holders is the set of endpoints holding one block, ordered by slot and read
// in place from the snapshot's bytes. The zero value is the empty set.
type Holders struct {
	ext []byte // three or more codes, two bytes each; nil when inline
	in  uint32 // the inline value XOR emptyVal, so that zero is the empty set
}

// Len returns the number of holders.
func (h Holders) Len() int {
	switch {
	case h.ext != nil:
		return len(h.ext) / 2
	case h.in&0xFFFF == 0:
		return 0
	case h.in>>16 == 0:
		return 1
	}
	return 2
}

// At returns the i-th holder in slot order; 0 <= i < Len().
func (h Holders) At(i int) Holder {
	if h.ext != nil {
		return Holder(le.Uint16(h.ext[2*i:]))
	}
	return Holder(uint16(h.in>>(16*uint(i&1))) ^ noCode)
}

// raw returns the holder codes as bytes, two per code, using buf for an
// inline set.
func (h Holders) raw(buf *[4]byte) []byte {
	if h.ext != nil {
		return h.ext
	}
	n := h.Len()
	le.PutUint32(buf[:], h.in^emptyVal)
	return buf[:2*n]
}

// Equal reports whether two sets hold the same endpoints in the same tiers.
// Sets are stored in one canonical form, so this compares bytes.
func (h Holders) Equal(o Holders) bool {
	if h.ext == nil || o.ext == nil {
		return h.ext == nil && o.ext == nil && h.in == o.in
	}
	return string(h.ext) == string(o.ext)
}

// table is a parsed shard or delta: a sorted index read in place.
//
// An entry's key is the block hash with the shard bits shifted out; the next
// dirBits select a bucket in dir, and the 32 bits after those are the
// fingerprint stored in the entry next to its value, so that a hit costs one
// cache line after the directory. Entries are sorted by hash, so
// fingerprints are strictly increasing within a bucket.
type table struct {
	ref       ref
	shardBits uint8
	dirBits   uint8
	index     int
	n         int
	dir       []byte // (1<<dirBits)+1 uint32 entry offsets
	ents      []byte // n entries: uint32 fingerprint, uint32 value
	ext       []byte // uint16 lists: count, then count holder codes
}

// tableSize returns the encoded size of a table, or -1 if it would not fit
// in a part.
func tableSize(dirBits uint8, n, extLen uint64) int {
	s := headerSize + tableFixed + 4*((uint64(1)<<dirBits)+1) + 8*n + 2*extLen + trailerSize
	if s > 1<<31 {
		return -1
	}
	return int(s)
}

// parseTable checks b as a part of kind k (KindShard or KindDelta) and
// returns its table: its framing, checksum, geometry and directory, which
// is what keeps lookups inside the bytes. It is linear in the directory, not
// the entries, because every worker pays it on every refresh; check, which
// the fetcher runs once per bundle, covers the entries.
func parseTable(b []byte, k Kind) (table, error) {
	gen, err := checkPart(b, k)
	if err != nil {
		return table{}, err
	}
	body := b[headerSize : len(b)-trailerSize]
	if len(body) < tableFixed {
		return table{}, corrupt(k.String() + ": truncated table header")
	}
	t := table{shardBits: body[0], dirBits: body[1], index: int(le.Uint32(body[4:]))}
	n, extLen := le.Uint32(body[8:]), le.Uint32(body[12:])
	if body[2] != 0 || body[3] != 0 {
		return table{}, corrupt(k.String() + ": reserved table bytes set")
	}
	if t.shardBits > MaxShardBits || t.dirBits > maxDirBits || t.shardBits+t.dirBits > 32 {
		return table{}, corrupt(k.String() + ": bad geometry")
	}
	if k == KindDelta && (t.shardBits != 0 || t.index != 0) {
		return table{}, corrupt("delta: shard fields set")
	}
	if uint64(t.index) >= uint64(1)<<t.shardBits {
		return table{}, corrupt(k.String() + ": index " + strconv.Itoa(t.index) + " out of range")
	}
	if tableSize(t.dirBits, uint64(n), uint64(extLen)) != len(b) {
		return table{}, corrupt(k.String() + ": size does not match its counts")
	}
	t.n = int(n)
	p := body[tableFixed:]
	nb := 1<<t.dirBits + 1
	t.dir, p = p[:4*nb], p[4*nb:]
	t.ents, t.ext = p[:8*t.n], p[8*t.n:]
	t.ref = partRef(b, t.n)
	t.ref.gen = gen
	if err := t.checkDir(); err != nil {
		return table{}, corrupt(k.String() + ": " + err.Error())
	}
	return t, nil
}

// parseTableFull is parseTable followed by check.
func parseTableFull(b []byte, k Kind) (table, error) {
	t, err := parseTable(b, k)
	if err != nil {
		return table{}, err
	}
	if err := t.check(k == KindDelta); err != nil {
		return table{}, corrupt(k.String() + ": " + err.Error())
	}
	return t, nil
}

type checkError string

func (e checkError) Error() string { return string(e) }

// checkDir validates the directory: bucket bounds that rise from 0 to the
// entry count.
func (t *table) checkDir() error {
	if le.Uint32(t.dir) != 0 || int(le.Uint32(t.dir[len(t.dir)-4:])) != t.n {
		return checkError("directory does not span the entries")
	}
	lo := uint32(0)
	for b := 4; b < len(t.dir); b += 4 {
		hi := le.Uint32(t.dir[b:])
		if hi < lo {
			return checkError("directory not monotone")
		}
		lo = hi
	}
	return nil
}

// check validates what checkDir leaves: the ordering of fingerprints, the
// extension lists and every value.
func (t *table) check(tombstones bool) error {
	lo := uint32(0)
	for b := 4; b < len(t.dir); b += 4 {
		hi := le.Uint32(t.dir[b:])
		for i := lo + 1; i < hi; i++ {
			if le.Uint32(t.ents[8*i:]) <= le.Uint32(t.ents[8*i-8:]) {
				return checkError("fingerprints not increasing")
			}
		}
		lo = hi
	}
	// The extension area must tile exactly into canonical lists; starts
	// marks where each begins so that values can only point at a start.
	ext := len(t.ext) / 2
	var starts []uint64
	if ext > 0 {
		starts = make([]uint64, (ext+63)/64)
	}
	for off := 0; off < ext; {
		cnt := int(le.Uint16(t.ext[2*off:]))
		if cnt < 3 || off+1+cnt > ext {
			return checkError("bad extension list")
		}
		if !canonical(t.ext[2*(off+1) : 2*(off+1+cnt)]) {
			return checkError("extension list not canonical")
		}
		starts[off/64] |= 1 << (off % 64)
		off += 1 + cnt
	}
	for i := 0; i < t.n; i++ {
		v := le.Uint32(t.ents[8*i+4:])
		if v&extFlag != 0 {
			off := int(v &^ extFlag)
			if off >= ext || starts[off/64]&(1<<(off%64)) == 0 {
				return checkError("value points outside the extension lists")
			}
			continue
		}
		a, b := uint16(v), uint16(v>>16)
		switch {
		case a == noCode && b == noCode:
			if !tombstones {
				return checkError("empty holder set in a shard")
			}
		case a == noCode || a > maxCode || (b != noCode && (b > maxCode || b>>1 <= a>>1)):
			return checkError("bad inline holders")
		}
	}
	return nil
}

const maxCode = MaxEndpoints<<1 - 1 // slot MaxEndpoints-1 on the CPU tier

// canonical reports whether codes (two bytes each) are valid holder codes
// with strictly increasing slots.
func canonical(codes []byte) bool {
	prev := -1
	for i := 0; i < len(codes); i += 2 {
		c := le.Uint16(codes[i:])
		if c > maxCode || int(c>>1) <= prev {
			return false
		}
		prev = int(c >> 1)
	}
	return true
}

// find looks h up. The second result is false if the table has no entry
// for h; a delta's tombstone is found and has no holders.
func (t *table) find(h uint64) (Holders, bool) {
	if t.n == 0 {
		return Holders{}, false
	}
	x := h << t.shardBits
	b := uint(x >> 1 >> (63 - t.dirBits)) // x >> (64-dirBits), 0 when dirBits is 0
	fp := uint32(x << t.dirBits >> 32)
	lo, hi := le.Uint32(t.dir[4*b:]), le.Uint32(t.dir[4*b+4:])
	for lo < hi {
		m := (lo + hi) >> 1
		f := le.Uint32(t.ents[8*m:])
		if f == fp {
			return t.holders(le.Uint32(t.ents[8*m+4:])), true
		}
		if f < fp {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return Holders{}, false
}

func (t *table) holders(v uint32) Holders {
	if v&extFlag == 0 {
		return Holders{in: v ^ emptyVal}
	}
	// A reader's parse does not check values (check does, in the
	// fetcher): one that points past the lists finds nothing.
	off := uint(v &^ extFlag)
	if 2*off+2 > uint(len(t.ext)) {
		return Holders{}
	}
	end := 2 * (off + 1 + uint(le.Uint16(t.ext[2*off:])))
	if end > uint(len(t.ext)) {
		return Holders{}
	}
	return Holders{ext: t.ext[2*off+2 : end]}
}

// tableEntry is one entry to encode: a block hash and the id of its holder
// set in the builder's interner (0 for the empty set, a delta tombstone).
type tableEntry struct {
	h   uint64
	set uint32
}

// encoder keeps the scratch space of table encoding between calls.
type encoder struct {
	fps, vals []uint32
	buckets   []uint32
	ext       []uint16
	extOff    []int32 // per set id: offset of its list in ext, valid if stamp matches
	stamp     []uint32
	epoch     uint32
	union     []uint16
}

func dirBitsFor(n int, shardBits uint8) uint8 {
	d := uint8(bits.Len(uint(n / 8)))
	if d > maxDirBits {
		d = maxDirBits
	}
	if shardBits+d > 32 {
		d = 32 - shardBits
	}
	return d
}

// appendTable encodes ents (sorted by hash, unique) as a part of kind k.
// Two hashes that share every bit the table keeps (bucket and fingerprint,
// 32 + shardBits + dirBits bits) become one entry holding the union of
// their holders: a rare false hit, never a missed one.
func (e *encoder) appendTable(dst []byte, k Kind, gen uint64, shardBits uint8, index int, ents []tableEntry, sets []hset) ([]byte, int) {
	dirBits := dirBitsFor(len(ents), shardBits)
	e.epoch++
	if len(e.stamp) < len(sets) {
		e.stamp = append(e.stamp, make([]uint32, len(sets)-len(e.stamp))...)
		e.extOff = append(e.extOff, make([]int32, len(sets)-len(e.extOff))...)
	}
	e.fps, e.vals, e.buckets, e.ext = e.fps[:0], e.vals[:0], e.buckets[:0], e.ext[:0]
	keep := 32 + uint(shardBits) + uint(dirBits)
	for i := 0; i < len(ents); {
		j := i + 1
		for j < len(ents) && ents[j].h>>(64-keep) == ents[i].h>>(64-keep) {
			j++
		}
		x := ents[i].h << shardBits
		e.buckets = append(e.buckets, uint32(x>>1>>(63-dirBits)))
		e.fps = append(e.fps, uint32(x<<dirBits>>32))
		if j == i+1 {
			e.vals = append(e.vals, e.value(ents[i].set, sets))
		} else {
			e.vals = append(e.vals, e.merged(ents[i:j], sets))
		}
		i = j
	}
	n := len(e.fps)
	start := len(dst)
	dst = appendHeader(dst, k, gen)
	dst = append(dst, shardBits, dirBits, 0, 0)
	dst = le.AppendUint32(dst, uint32(index))
	dst = le.AppendUint32(dst, uint32(n))
	dst = le.AppendUint32(dst, uint32(len(e.ext)))
	i := 0
	for b := uint32(0); b <= 1<<dirBits; b++ {
		for i < n && e.buckets[i] < b {
			i++
		}
		dst = le.AppendUint32(dst, uint32(i))
	}
	for i, f := range e.fps {
		dst = le.AppendUint32(dst, f)
		dst = le.AppendUint32(dst, e.vals[i])
	}
	for _, c := range e.ext {
		dst = le.AppendUint16(dst, c)
	}
	return finishPart(dst, start), n
}

// value returns the encoded value of set id, writing its list to the
// extension area the first time this table needs it.
func (e *encoder) value(id uint32, sets []hset) uint32 {
	s := &sets[id]
	if s.ext == nil {
		return s.inline
	}
	if e.stamp[id] != e.epoch {
		e.stamp[id] = e.epoch
		e.extOff[id] = int32(len(e.ext))
		e.ext = append(e.ext, uint16(len(s.ext)))
		e.ext = append(e.ext, s.ext...)
	}
	return extFlag | uint32(e.extOff[id])
}

// merged encodes the union of the holder sets of colliding entries, keeping
// the better tier of an endpoint listed twice.
func (e *encoder) merged(ents []tableEntry, sets []hset) uint32 {
	u := e.union[:0]
	for _, en := range ents {
		for _, c := range sets[en.set].codes() {
			at := len(u)
			for i, have := range u {
				if have>>1 >= c>>1 {
					at = i
					break
				}
			}
			switch {
			case at < len(u) && u[at]>>1 == c>>1:
				u[at] &= c | ^uint16(1) // GPU (tier bit 0) wins
			default:
				u = append(u, 0)
				copy(u[at+1:], u[at:])
				u[at] = c
			}
		}
	}
	e.union = u
	switch len(u) {
	case 0:
		return emptyVal
	case 1:
		return uint32(u[0]) | noCode<<16
	case 2:
		return uint32(u[0]) | uint32(u[1])<<16
	}
	off := len(e.ext)
	e.ext = append(e.ext, uint16(len(u)))
	e.ext = append(e.ext, u...)
	return extFlag | uint32(off)
}
