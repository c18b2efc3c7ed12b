package snapshot

// Match is how much of a prompt's block chain one endpoint holds.
type Match struct {
	Blocks int32 // leading blocks held, in any tier
	GPU    int32 // leading blocks held on the GPU; at most Blocks
}

// pending marks, during a walk, a run not yet resolved.
const pending = -1

// Prefix sets out[slot] to the leading run of hashes, a prompt's chained
// block hashes in order, that each endpoint holds, and returns the number
// of index lookups it made. out needs a row per endpoint slot; holders in
// slots past its end are ignored. It does not allocate.
//
// A chained hash names its whole prefix, and an engine that holds a block
// held every block before it when it was stored, so the set of endpoints
// holding block i shrinks as i grows. Prefix therefore bisects: it looks up
// the first and last block, and splits a range only while some endpoint
// still unresolved holds the block at its start and not the one at its
// end. That costs about log2(len(hashes)) lookups per distinct run length
// instead of one per block. Where an engine has evicted a block from the
// middle of a run, the answer is the end of some held run rather than
// necessarily the first.
func (v *View) Prefix(hashes []uint64, out []Match) int {
	for i := range out {
		out[i] = Match{}
	}
	n := len(hashes)
	if n == 0 || !v.loaded {
		return 0
	}
	first := v.Lookup(hashes[0])
	if first.Len() == 0 {
		return 1
	}
	for i := 0; i < first.Len(); i++ {
		h := first.At(i)
		if s := h.Endpoint(); s < len(out) {
			out[s].Blocks = pending
			if h.Tier() == TierGPU {
				out[s].GPU = pending
			}
		}
	}
	probes, last := 1, first
	if n > 1 {
		last = v.Lookup(hashes[n-1])
		probes += 1 + v.bisect(hashes, 0, n-1, first, last, out)
	}
	resolve(last, Holders{}, int32(n), out)
	for i := range out {
		m := &out[i]
		if m.GPU == pending || m.GPU > m.Blocks {
			m.GPU = m.Blocks // only reachable when runs have holes
		}
	}
	return probes
}

// bisect resolves the runs that end between lo and hi, given a and b, the
// holders of hashes[lo] and hashes[hi].
func (v *View) bisect(hashes []uint64, lo, hi int, a, b Holders, out []Match) int {
	if a.Equal(b) || !resolve(a, b, 0, out) {
		return 0
	}
	if hi-lo == 1 {
		resolve(a, b, int32(hi), out)
		return 0
	}
	mid := int(uint(lo+hi) >> 1)
	c := v.Lookup(hashes[mid])
	return 1 + v.bisect(hashes, lo, mid, a, c, out) + v.bisect(hashes, mid, hi, c, b, out)
}

// resolve looks for endpoints with an unresolved run that hold a block (or
// hold it on the GPU) in a but not in b. With end 0 it reports whether
// there are any; otherwise it ends their runs at end.
func resolve(a, b Holders, end int32, out []Match) bool {
	var abuf, bbuf [4]byte
	x, y := a.raw(&abuf), b.raw(&bbuf)
	found := false
	j := 0
	for i := 0; i+1 < len(x); i += 2 {
		c := uint16(x[i]) | uint16(x[i+1])<<8
		s := int(c >> 1)
		if s >= len(out) {
			break // codes are in slot order
		}
		m := &out[s]
		if m.Blocks != pending && m.GPU != pending {
			continue
		}
		d := uint16(0xFFFF) // s's code in b, if any
		for ; j+1 < len(y); j += 2 {
			e := uint16(y[j]) | uint16(y[j+1])<<8
			if int(e>>1) >= s {
				if int(e>>1) == s {
					d = e
				}
				break
			}
		}
		gone := d == 0xFFFF
		leavesGPU := m.GPU == pending && Tier(c&1) == TierGPU && (gone || Tier(d&1) != TierGPU)
		if !(gone && m.Blocks == pending) && !leavesGPU {
			continue
		}
		if end == 0 {
			return true
		}
		found = true
		if gone && m.Blocks == pending {
			m.Blocks = end
		}
		if leavesGPU {
			m.GPU = end
		}
	}
	return found
}
