package snapshot

import (
	"errors"
	"math"
	"strconv"
)

// EngineSlot is one sequence slot of an engine whose cache is a prompt per
// slot (llama.cpp's llama-server): such an engine reuses a prompt only for
// a request that lands in the slot holding it, and gives a request any
// idle slot unless the request names one. A gateway that knows which slot
// holds a prompt can name it, and the request then waits for that slot
// instead of evicting another prompt from an idle one.
type EngineSlot struct {
	ID   int  // the engine's slot id, 0 to MaxEngineSlots-1
	Busy bool // it was processing a request when read
	// Remaining is how many tokens a busy slot's request may still
	// generate (its max_tokens left), 0 when idle.
	Remaining int
	// Hashes are the chained block hashes (shared/blockhash) of the prompt
	// the slot holds; the manifest keeps some of them (slotDepths).
	Hashes []uint64
}

// MaxEngineSlots bounds an engine's slot ids and how many it may publish.
const MaxEngineSlots = 256

// slotDepths are the depths, in blocks, at which a manifest keeps a slot
// prompt's chained block hash: each about 1.5 times the one before, so a
// prompt's match against a slot is known to within a third, enough to
// weigh the prefill the slot saves against the wait for it. Every hash
// would cost a manifest, rewritten every sync interval, 8 bytes per 64
// bytes of every slot's prompt.
var slotDepths = [...]int{1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048}

// slotRowSize is an engine slot row: endpoint table slot (uint16), engine
// slot id (uint16), flags (bit 0 busy), hashes kept (uint8), 2 reserved
// bytes, remaining tokens (uint32), prompt blocks (uint32), then a hash
// per depth of slotDepths (uint64), the unkept ones 0.
const slotRowSize = 16 + 8*len(slotDepths)

func validateSlots(addr string, slots []EngineSlot) error {
	if len(slots) > MaxEngineSlots {
		return errors.New("snapshot: endpoint " + addr + " lists more than " + strconv.Itoa(MaxEngineSlots) + " slots")
	}
	for i, s := range slots {
		if s.ID < 0 || s.ID >= MaxEngineSlots || s.Remaining < 0 || int64(s.Remaining) > math.MaxUint32 {
			return errors.New("snapshot: endpoint " + addr + ": slot id or remaining tokens out of range")
		}
		for _, o := range slots[:i] {
			if o.ID == s.ID {
				return errors.New("snapshot: endpoint " + addr + ": slot " + strconv.Itoa(s.ID) + " listed twice")
			}
		}
	}
	return nil
}

// appendSlotRows appends the rows of every endpoint's slots, by endpoint
// and then slot id; it returns how many it appended. A slot holding no
// full block keeps no hash: it counts among the endpoint's slots, as room.
func appendSlotRows(dst []byte, eps []epState) ([]byte, int) {
	n := 0
	for i := range eps {
		e := &eps[i]
		if e.vacant || len(e.info.Slots) == 0 {
			continue
		}
		for _, s := range e.info.Slots { // sorted by SetEndpoint
			var r [slotRowSize]byte
			le.PutUint16(r[0:], uint16(i))
			le.PutUint16(r[2:], uint16(s.ID))
			if s.Busy {
				r[4] = 1
			}
			kept := 0
			for kept < len(slotDepths) && slotDepths[kept] <= len(s.Hashes) {
				le.PutUint64(r[16+8*kept:], s.Hashes[slotDepths[kept]-1])
				kept++
			}
			r[5] = byte(kept)
			le.PutUint32(r[8:], uint32(s.Remaining))
			le.PutUint32(r[12:], uint32(min(len(s.Hashes), math.MaxUint32)))
			dst = append(dst, r[:]...)
			n++
		}
	}
	return dst, n
}

// checkSlots checks the engine slot rows: each names a listed endpoint,
// rows rise strictly by endpoint and slot id, and each keeps at most
// len(slotDepths) hashes, no more than its prompt's blocks allow, with the
// unkept ones zero.
func (m *Manifest) checkSlots() error {
	prev := -1
	for k := 0; k < len(m.slots)/slotRowSize; k++ {
		r := m.slots[slotRowSize*k:]
		ep, id := int(le.Uint16(r)), int(le.Uint16(r[2:]))
		kept, blocks := int(r[5]), uint64(le.Uint32(r[12:]))
		if ep >= m.n || m.Endpoint(ep).Vacant() || id >= MaxEngineSlots || ep<<16|id <= prev {
			return corrupt("manifest: slot row " + strconv.Itoa(k) + " out of order or for no endpoint")
		}
		prev = ep<<16 | id
		if r[4] > 1 || r[6]|r[7] != 0 || kept > len(slotDepths) || (kept > 0 && uint64(slotDepths[kept-1]) > blocks) {
			return corrupt("manifest: slot row " + strconv.Itoa(k) + " has bad flags or depths")
		}
		for d := kept; d < len(slotDepths); d++ {
			if le.Uint64(r[16+8*d:]) != 0 {
				return corrupt("manifest: slot row " + strconv.Itoa(k) + " sets a hash it does not keep")
			}
		}
	}
	return nil
}

// SlotMatch is the engine slot that holds the most of a prompt.
type SlotMatch struct {
	ID        int  // the engine's slot id
	Busy      bool // processing a request when cachesync read it
	Remaining int  // tokens that request may still generate
	// Blocks is how many leading blocks of the prompt the slot holds, at
	// least: the deepest of the kept depths (1, 2, 3, 4, 6, 8, ...) that
	// match, within a third of the truth.
	Blocks int
}

// SlotHolding returns the engine slot of endpoint i whose prompt shares the most leading
// blocks with the prompt of chained block hashes, an idle one of two that
// share as many; ok is false when the endpoint publishes no slots or no
// slot shares a block. It does not allocate.
func (m *Manifest) SlotHolding(i int, hashes []uint64) (best SlotMatch, ok bool) {
	rows := len(m.slots) / slotRowSize
	for k := m.firstSlotRow(i, rows); k < rows; k++ {
		r := m.slots[slotRowSize*k:]
		if int(le.Uint16(r)) != i {
			break
		}
		depth := 0
		for d := 0; d < int(r[5]) && d < len(slotDepths) && slotDepths[d] <= len(hashes); d++ {
			if le.Uint64(r[16+8*d:]) != hashes[slotDepths[d]-1] {
				break
			}
			depth = slotDepths[d]
		}
		busy := r[4] == 1
		if depth > best.Blocks || (depth == best.Blocks && depth > 0 && best.Busy && !busy) {
			best = SlotMatch{ID: int(le.Uint16(r[2:])), Busy: busy, Remaining: int(le.Uint32(r[8:])), Blocks: depth}
		}
	}
	return best, best.Blocks > 0
}

// firstSlotRow returns the index of endpoint i's first slot row, or where
// it would be.
func (m *Manifest) firstSlotRow(i, rows int) int {
	lo, hi := 0, rows
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if int(le.Uint16(m.slots[slotRowSize*mid:])) < i {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// SlotsHeld returns how many engine slots endpoint i lists and how many of
// them hold a prompt of a block or more; 0, 0 for an endpoint whose cache
// is not a prompt per slot.
func (m *Manifest) SlotsHeld(i int) (held, total int) {
	rows := len(m.slots) / slotRowSize
	for k := m.firstSlotRow(i, rows); k < rows; k++ {
		r := m.slots[slotRowSize*k:]
		if int(le.Uint16(r)) != i {
			break
		}
		total++
		if r[5] > 0 {
			held++
		}
	}
	return held, total
}

// HasSlots reports whether any endpoint lists engine slots.
func (m *Manifest) HasSlots() bool { return len(m.slots) > 0 }
