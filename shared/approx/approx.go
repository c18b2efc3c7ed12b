// Package approx keeps an approximate prefix index: for each endpoint, the
// block hashes of the prompts recently routed to it, in a least recently used
// set sized like the endpoint's KV cache. It stands in for the engine's own
// cache state where none is available (engines without KV events, or a
// gateway running without cachesync), as llm-d's "routing history" does.
//
// # Order within a request
//
// An engine frees a finished request's blocks tail first, so under memory
// pressure it evicts the end of a prompt before its beginning, and a prefix
// shared by many prompts (a system prompt) outlives all of them. Touch
// therefore moves a prompt's hashes to the most recently used end in
// reverse, last block first, leaving the first block most recent: eviction
// takes the tails of the oldest prompts first, and a block the index holds
// implies, in practice, that it holds the blocks before it, which is what
// the prefix walk of shared/snapshot assumes.
//
// # Memory
//
// An entry costs a 16-byte list node (hash and two 32-bit links) plus 4 to 8
// bytes of open-addressing table (a 32-bit entry at a load factor
// between 3/8 and 3/4): 20 to 24 bytes, against about 40 for a Go map and a
// linked list. Memory grows with the entries held, up to each endpoint's
// capacity; BenchmarkTouch reports it.
//
// The index is deterministic: what it holds and what it tells the sink
// depend only on the calls made. It is not safe for concurrent use.
package approx

import (
	"errors"
	"math"
	"math/bits"
	"math/rand/v2"

	"github.com/kvroute/kvroute/shared/blockhash"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// Sink receives the index's changes. *snapshot.Builder is one: the index
// then keeps a snapshot's prefix index in step, with every entry on the
// GPU tier.
type Sink interface {
	Add(slot int, h uint64, t snapshot.Tier) error
	Remove(slot int, h uint64, t snapshot.Tier) error
}

// ErrNoEndpoint reports a call for a slot SetCapacity never set up.
var ErrNoEndpoint = errors.New("approx: no endpoint in that slot")

// MaxCapacity bounds an endpoint's capacity: a table entry keeps a 24-bit
// node index (node 0 is the list's sentinel). 16M text blocks is about 256M
// tokens of KV cache, far more than an accelerator holds.
const MaxCapacity = 1<<24 - 2

// Index holds one LRU set per endpoint slot.
type Index struct {
	sets    []*set // by slot; nil where there is none
	seed    uint64
	entries int
}

// New returns an empty index.
func New() *Index {
	// The seed scatters hashes over the tables. It does not change what
	// the index holds, only where: prompts crafted so that their block
	// hashes collide in a table cannot know it.
	return &Index{seed: rand.Uint64() | 1}
}

// Change counts what one call did to the sink.
type Change struct {
	Added   int // hashes the endpoint did not hold
	Evicted int // hashes dropped to stay within capacity
}

// SetCapacity sets up the endpoint in slot, or resizes it, to hold at most
// blocks hashes. Shrinking evicts the least recently used hashes and tells
// the sink.
func (x *Index) SetCapacity(slot, blocks int, s Sink) (Change, error) {
	if slot < 0 || slot >= snapshot.MaxEndpoints {
		return Change{}, errors.New("approx: slot out of range")
	}
	if blocks < 1 || blocks > MaxCapacity {
		return Change{}, errors.New("approx: capacity must be 1 to 2^24-2 blocks")
	}
	for len(x.sets) <= slot {
		x.sets = append(x.sets, nil)
	}
	st := x.sets[slot]
	if st == nil {
		x.sets[slot] = newSet(blocks, x.seed)
		return Change{}, nil
	}
	st.cap = blocks
	var c Change
	for st.len > st.cap {
		h := st.evict()
		x.entries--
		c.Evicted++
		if err := s.Remove(slot, h, snapshot.TierGPU); err != nil {
			return c, err
		}
	}
	return c, nil
}

// Capacity returns the capacity of the endpoint in slot, 0 if it has none.
func (x *Index) Capacity(slot int) int {
	if st := x.get(slot); st != nil {
		return st.cap
	}
	return 0
}

func (x *Index) get(slot int) *set {
	if slot < 0 || slot >= len(x.sets) {
		return nil
	}
	return x.sets[slot]
}

// Touch records that a prompt with the chained block hashes hashes, prefix
// first, was routed to the endpoint in slot: the hashes become its most
// recently used, the first one most of all. Hashes it did not hold are added
// and the sink told; if that takes the endpoint over capacity, its least
// recently used hashes are evicted and the sink told that first. Hashes
// beyond the endpoint's capacity are left out: an engine could not hold
// them together with the prefix.
//
// A sink error stops the call; the index then holds what it had told the
// sink.
func (x *Index) Touch(slot int, hashes []uint64, s Sink) (Change, error) {
	st := x.get(slot)
	if st == nil {
		return Change{}, ErrNoEndpoint
	}
	if len(hashes) > st.cap {
		hashes = hashes[:st.cap]
	}
	var c Change
	// A prompt routed before is usually still a run of the list, in
	// order: first..last is such a run of hashes already touched, moved
	// to the front in one splice when the run breaks, which is the same
	// as moving each of them to the front in turn. Evicting needs the
	// list in its final order, so a run is spliced before anything is
	// added.
	var first, last uint32
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		pos, n := st.find(h)
		if n != 0 {
			if first != 0 && st.nodes[n].next == first {
				first = n
				continue
			}
			st.toFront(first, last)
			first, last = n, n
			continue
		}
		st.toFront(first, last)
		first = 0
		if st.len == st.cap {
			old := st.evict()
			x.entries--
			c.Evicted++
			if err := s.Remove(slot, old, snapshot.TierGPU); err != nil {
				return c, err
			}
			// Eviction may shift entries back into the probe sequence.
			pos, _ = st.find(h)
		}
		st.insert(pos, h)
		x.entries++
		c.Added++
		if err := s.Add(slot, h, snapshot.TierGPU); err != nil {
			return c, err
		}
	}
	st.toFront(first, last)
	return c, nil
}

// Forget drops the endpoint in slot without telling the sink: the caller
// clears the sink's side itself (snapshot.Builder's RemoveEndpoint or
// ClearEndpoint) when the endpoint goes away or restarts.
func (x *Index) Forget(slot int) {
	if st := x.get(slot); st != nil {
		x.entries -= st.len
		x.sets[slot] = nil
	}
}

// Len returns the number of hashes the endpoint in slot holds.
func (x *Index) Len(slot int) int {
	if st := x.get(slot); st != nil {
		return st.len
	}
	return 0
}

// Entries returns the number of hashes held over all endpoints.
func (x *Index) Entries() int { return x.entries }

// Contains reports whether the endpoint in slot holds h, without touching it.
func (x *Index) Contains(slot int, h uint64) bool {
	st := x.get(slot)
	if st == nil {
		return false
	}
	_, n := st.find(h)
	return n != 0
}

// Bytes returns the memory the index's tables and nodes take.
func (x *Index) Bytes() int {
	n := 0
	for _, st := range x.sets {
		if st != nil {
			n += 16*cap(st.nodes) + 4*len(st.table)
		}
	}
	return n
}

// Sizing converts an engine's KV-cache capacity, in tokens, into text blocks
// of the index. The zero value means the defaults.
type Sizing struct {
	// BytesPerToken is how many bytes of prompt text a token stands for;
	// <= 0 means DefaultBytesPerToken. About 4 for English with
	// BPE vocabularies of 100k+ tokens, less for code, CJK and small
	// vocabularies.
	BytesPerToken float64
	// BlockBytes is the text block size of shared/blockhash; <= 0 means
	// 64, blockhash.DefaultBlockSize.
	BlockBytes int
}

// DefaultBytesPerToken is the default text-to-token ratio.
const DefaultBytesPerToken = 4

// DefaultCapacity is the capacity, in text blocks, of an endpoint whose
// KV-cache size is not known: the 31,250-block LRU per server of the
// Gateway API Inference Extension's approximate prefix scorer (500k tokens
// of its 16-token blocks), in filter's local mode and in cachesync until an
// engine's metrics say more.
const DefaultCapacity = 31250

// Blocks returns how many text blocks an engine holding tokens tokens of KV
// cache holds: for vLLM, num_gpu_blocks x block_size from
// vllm:cache_config_info; for SGLang, num_pages x page_size (or
// sglang:max_total_num_tokens). The result is at least 1 and at most
// MaxCapacity.
func (s Sizing) Blocks(tokens int64) int {
	bpt, bb := s.BytesPerToken, s.BlockBytes
	if bpt <= 0 {
		bpt = DefaultBytesPerToken
	}
	if bb <= 0 {
		bb = blockhash.DefaultBlockSize
	}
	n := math.Floor(float64(tokens) * bpt / float64(bb))
	switch {
	case !(n >= 1): // NaN or fewer than one block
		return 1
	case n > MaxCapacity:
		return MaxCapacity
	}
	return int(n)
}

// set is one endpoint's LRU: nodes in a doubly linked list through 32-bit
// indices, node 0 the list's sentinel (next is the most recently used,
// prev the least), found through an open-addressing table with linear
// probing. A table entry is a node index shifted left by 8 over the low 8
// bits of the hash's home position; 0 is an empty entry. Those bits let a
// probe pass over the hashes of other homes, and a deletion find the home
// of the entries it shifts, without reading their nodes. An entry never
// lies 255 or more positions past its home, so the low bits pin it down.
type set struct {
	nodes []node
	free  uint32 // a free node, linked through next; 0 if none
	table []uint32
	shift uint8 // 64 - log2(len(table))
	seed  uint64
	len   int
	cap   int
}

type node struct {
	h          uint64
	prev, next uint32
}

const minTable = 16

func newSet(capacity int, seed uint64) *set {
	st := &set{cap: capacity, seed: seed, nodes: make([]node, 1, 16)}
	st.resize(minTable)
	return st
}

func (st *set) home(h uint64) uint32 { return uint32((h ^ st.seed) * 0x9E3779B97F4A7C15 >> st.shift) }

// find returns the table position of h and its node, or 0 and the empty
// position where it belongs.
func (st *set) find(h uint64) (pos, n uint32) {
	mask, home := uint32(len(st.table)-1), st.home(h)
	for i := home; ; i = (i + 1) & mask {
		e := st.table[i]
		if e == 0 {
			return i, 0
		}
		if e&0xFF == home&0xFF && st.nodes[e>>8].h == h {
			return i, e >> 8
		}
	}
}

// insert adds h at table position pos (from find) as the most recently
// used.
func (st *set) insert(pos uint32, h uint64) {
	for 4*(st.len+1) > 3*len(st.table) || (pos-st.home(h))&uint32(len(st.table)-1) >= 255 {
		st.resize(2 * len(st.table))
		pos, _ = st.find(h)
	}
	n := st.free
	if n != 0 {
		st.free = st.nodes[n].next
	} else {
		if len(st.nodes) == cap(st.nodes) {
			// Grow as append would, but never past the capacity: a
			// full set then holds no spare nodes.
			c := 2 * len(st.nodes)
			if c >= st.cap { // the sentinel takes a node too
				c = st.cap + 1
			}
			grown := make([]node, len(st.nodes), c)
			copy(grown, st.nodes)
			st.nodes = grown
		}
		n = uint32(len(st.nodes))
		st.nodes = append(st.nodes, node{})
	}
	st.nodes[n] = node{h: h}
	st.link(n)
	st.table[pos] = n<<8 | st.home(h)&0xFF
	st.len++
}

// evict removes the least recently used hash and returns it; its node goes
// to the free list.
func (st *set) evict() uint64 {
	n := st.nodes[0].prev
	h := st.nodes[n].h
	st.unlink(n)
	st.remove(h)
	st.nodes[n] = node{next: st.free}
	st.free = n
	st.len--
	return h
}

// toFront moves the run of the list from first to last to the front; it
// does nothing if first is 0.
func (st *set) toFront(first, last uint32) {
	if first == 0 || st.nodes[0].next == first {
		return
	}
	p, q := st.nodes[first].prev, st.nodes[last].next
	st.nodes[p].next = q
	st.nodes[q].prev = p
	f := st.nodes[0].next
	st.nodes[last].next = f
	st.nodes[f].prev = last
	st.nodes[first].prev = 0
	st.nodes[0].next = first
}

func (st *set) link(n uint32) {
	first := st.nodes[0].next
	st.nodes[n].prev, st.nodes[n].next = 0, first
	st.nodes[first].prev = n
	st.nodes[0].next = n
}

func (st *set) unlink(n uint32) {
	p, q := st.nodes[n].prev, st.nodes[n].next
	st.nodes[p].next = q
	st.nodes[q].prev = p
}

// remove deletes h from the table, shifting later entries of its probe
// run back so that no tombstones are needed.
func (st *set) remove(h uint64) {
	mask := uint32(len(st.table) - 1)
	i, n := st.find(h)
	if n == 0 {
		return
	}
	for j := (i + 1) & mask; st.table[j] != 0; j = (j + 1) & mask {
		// The entry at j may fill the hole at i unless its home lies
		// cyclically in (i, j], that is unless it is fewer than j-i
		// positions past its home. Its distance is below 256 and below
		// the table size, so the low bits of the two suffice.
		if (j-st.table[j])&mask&0xFF >= (j-i)&mask {
			st.table[i] = st.table[j]
			i = j
		}
	}
	st.table[i] = 0
}

func (st *set) resize(size int) {
	st.table = make([]uint32, size)
	st.shift = uint8(64 - bits.Len(uint(size-1)))
	mask := uint32(size - 1)
	for n := st.nodes[0].next; n != 0; n = st.nodes[n].next {
		i := st.home(st.nodes[n].h)
		for st.table[i] != 0 {
			i = (i + 1) & mask
		}
		st.table[i] = n<<8 | st.home(st.nodes[n].h)&0xFF
	}
}
