// Package bridge turns an engine's KV-cache events, which name blocks of
// tokens, into the text blocks the filter hashes.
//
// The filter hashes a request's rendered prompt in fixed-size text blocks,
// chained (shared/blockhash). An engine reports the blocks of tokens it
// caches, each chained to its parent. For every stored engine block, the
// bridge decodes its tokens to bytes with the model's vocabulary, appends
// them to the text before the block (known from the parent), and hashes the
// text blocks that end inside it exactly as blockhash.Append hashes the
// whole prompt: a text block is completed by the engine block that holds its
// last byte. The Sink learns that the engine holds those text blocks; when
// the engine drops the block, exactly those text blocks go again.
//
// Per engine block the bridge keeps only what later events need: the chain
// hash at the last text-block boundary, the bytes after it (less than a
// text block), how many text blocks lie before, the text blocks the block
// completed, and which tiers hold it. Text blocks count references, since
// two engine blocks can complete the same text block (the same text reached
// through different tokens, or two KV-cache groups).
//
// Tiers follow vLLM 0.33's publishers (vllm/distributed/kv_events.py, the
// GPU block pool and the offloading connector's events):
//   - A copy is named by its medium, KV-cache group, locality and
//     ownership (the secondary offloading tier): a removal takes away only
//     the copy it names, never the LOCAL or primary one beside it.
//   - The GPU pool announces a block when it is cached and again whenever a
//     request reuses it, and removes it once: GPU stores are idempotent.
//   - The offloading connector announces a hash once per chunk that holds
//     it (chunks overlapping a shared prefix repeat the shared hashes) and
//     fans each chunk's eviction out to the same hashes: lower-tier copies
//     count announcements, and go when the last is removed.
//   - AllBlocksCleared comes from the GPU pool (/reset_prefix_cache):
//     offloaded copies stay.
//   - REMOTE copies live outside the engine; they are not indexed.
package bridge

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/kvroute/kvroute/cachesync/internal/kvevents"
	"github.com/kvroute/kvroute/cachesync/internal/vocab"
	"github.com/kvroute/kvroute/shared/blockhash"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// Sink receives one engine's text blocks. An Engine calls it from the one
// goroutine that feeds the Engine, never concurrently.
type Sink interface {
	// Add records that the engine holds text block h in tier t.
	Add(h uint64, t snapshot.Tier)
	// Remove records that it no longer does.
	Remove(h uint64, t snapshot.Tier)
	// Clear forgets every text block of the engine.
	Clear()
}

// DefaultCapacity is the engine blocks an Engine expects when the engine's
// capacity is not known.
const DefaultCapacity = 1 << 18

// Config describes one engine.
type Config struct {
	// Model is the engine's served model name: the filter seeds a request's
	// hashes with its "model", which for an adapter is the adapter's name,
	// and so does the bridge (blockhash.Seed(name, "")).
	Model string
	// Vocab decodes the model's token ids.
	Vocab *vocab.Vocab
	// Hash is the filter's block size and cap.
	Hash blockhash.Config
	// Capacity is how many blocks the engine can hold in all its tiers
	// (vLLM's num_gpu_blocks plus its CPU tier), default DefaultCapacity.
	// The bridge tracks at most a quarter more (plus 1024): blocks no tier
	// holds any more, kept for offload events that name them, go first;
	// past that the oldest blocks are dropped.
	Capacity int
	Logger   *slog.Logger
}

// Skip is why a stored engine block was not indexed.
type Skip uint8

// The reasons to skip a block.
const (
	// SkipUnknownParent: the block's parent is not known (the bridge
	// started after it was stored, or it was dropped), nor therefore the
	// text before the block.
	SkipUnknownParent Skip = iota
	// SkipUnknownBlock: a store without tokens (an offload to a lower tier)
	// names a block the bridge does not know.
	SkipUnknownBlock
	// SkipExtraKeys: the block's hash covers more than its tokens and a
	// first block's cache salt (multimodal inputs, a salt past the first
	// block), which text cannot match.
	SkipExtraKeys
	// SkipAdapter: the block belongs to a LoRA adapter the event names by id
	// only.
	SkipAdapter
	// SkipTokens: the vocabulary does not know a token id: it is not the
	// served model's.
	SkipTokens
	// SkipShape: the token count does not match the blocks and block size.
	SkipShape
	// SkipGroup: the block is in a KV-cache group that does not keep whole
	// prefixes (sliding window, Mamba state) or is another engine's.
	SkipGroup
	// SkipMedia: the engine uses more storage media and groups than the
	// bridge tracks (8).
	SkipMedia
	numSkips
)

var skipNames = [...]string{
	SkipUnknownParent: "unknown_parent", SkipUnknownBlock: "unknown_block", SkipExtraKeys: "extra_keys",
	SkipAdapter: "adapter", SkipTokens: "tokens", SkipShape: "shape", SkipGroup: "group", SkipMedia: "media",
}

// String returns the reason's metric label, e.g. "unknown_parent".
func (s Skip) String() string {
	if int(s) < len(skipNames) {
		return skipNames[s]
	}
	return "Skip(" + strconv.Itoa(int(s)) + ")"
}

// Stats are an Engine's counters and sizes, for export as Prometheus
// metrics.
type Stats struct {
	Stored  uint64           // engine blocks indexed (per tier they entered)
	Removed uint64           // engine blocks removed (per tier they left)
	Skipped [numSkips]uint64 // engine blocks not indexed, by reason
	Evicted uint64           // engine blocks dropped for the capacity cap
	Clears  uint64           // whole-engine clears: AllBlocksCleared, resets
	// Gauges.
	Blocks     int // engine blocks tracked, including those no tier holds
	TextBlocks int // distinct text blocks the engine holds
	Bytes      int // memory of the engine's state
}

// Entry flags, next to the vocab.State in the low bits.
const (
	stateMask = 0x0f
	flagUsed  = 0x10 // the slot holds a block
	flagFull  = 0x20 // the text reached the filter's cap: nothing after it is hashed
)

// entrySize is the size of an entry, for the memory account.
const entrySize = 40

// entry is one engine block.
type entry struct {
	hash       uint64 // the engine's hash of the block
	chain      uint64 // text chain hash at the last text-block boundary up to the block's end
	rec        uint32 // offset in the arena: completed text hashes (8 bytes each), then the tail
	nblk       uint32 // text blocks before the block's end
	prev, next uint32 // list links (slot numbers)
	nh         uint16 // text blocks the block completed
	tail       uint8  // text bytes after the last boundary
	media      uint8  // bit i: medium i holds the block
	flags      uint8
}

// The slab's first two slots are the heads of the block lists: blocks some
// medium holds, oldest first, and blocks none holds, kept for offload
// events, oldest first.
const (
	liveList  = 0
	ghostList = 1
	firstSlot = 2
	noSlot    = math.MaxUint32
)

// medium is one kind of copy the engine reports: a storage medium, a
// KV-cache group, a locality and an owning tier.
type medium struct {
	name      string
	group     int
	locality  string
	ownership string
	tier      snapshot.Tier
}

// Engine is the bridge state of one engine. Feed it the engine's batches
// from one goroutine (it is a kvevents.Handler); Stats may be called from
// any.
type Engine struct {
	cfg   Config
	sink  Sink
	log   *slog.Logger
	size  int // text block size
	max   uint32
	limit int // slots in use at most

	slab   []entry
	free   uint32 // free slot list, through next
	used   int
	index  table // engine hash -> slot
	refs   table // text hash -> holders in GPU (low 16 bits) and lower tiers (high 16)
	arena  []byte
	wasted int // arena bytes no entry uses
	media  []medium
	// extra counts a lower-tier copy's announcements beyond the first, by
	// slot<<3 | medium index.
	extra map[uint64]uint32

	seedName string
	seed     uint64
	text     []byte   // scratch: the text of one block with the tail before it
	tail     []byte   // scratch: the tail carried from block to block
	hashes   []uint64 // scratch: text blocks one block completes

	stats  counters
	blocks atomic.Int64
	texts  atomic.Int64
	bytes  atomic.Int64
}

type counters struct {
	stored, removed, evicted, clears atomic.Uint64
	skipped                          [numSkips]atomic.Uint64
}

// New returns the bridge state of one engine, which tells sink what it holds.
func New(cfg Config, sink Sink) (*Engine, error) {
	switch {
	case cfg.Vocab == nil:
		return nil, errors.New("bridge: no vocabulary")
	case cfg.Model == "":
		return nil, errors.New("bridge: no model name")
	case cfg.Hash.Size() > 256:
		return nil, fmt.Errorf("bridge: text block size %d: at most 256", cfg.Hash.Size())
	case cfg.Capacity < 0:
		return nil, fmt.Errorf("bridge: capacity %d", cfg.Capacity)
	}
	if cfg.Capacity == 0 {
		cfg.Capacity = DefaultCapacity
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	e := &Engine{
		cfg:   cfg,
		sink:  sink,
		log:   cfg.Logger,
		size:  cfg.Hash.Size(),
		max:   uint32(min(cfg.Hash.Max(), math.MaxUint32)),
		limit: min(cfg.Capacity+cfg.Capacity/4+1024, math.MaxUint32-firstSlot-1),
	}
	e.reset()
	return e, nil
}

// reset drops all state, keeping none of its memory.
func (e *Engine) reset() {
	e.slab = make([]entry, firstSlot, 64)
	for _, l := range []uint32{liveList, ghostList} {
		e.slab[l].prev, e.slab[l].next = l, l
	}
	e.free, e.used = noSlot, 0
	e.index, e.refs = table{}, table{}
	e.arena, e.wasted = nil, 0
	e.media = e.media[:0]
	e.extra = map[uint64]uint32{}
	e.publish()
}

var _ kvevents.Handler = (*Engine)(nil)

// Batch applies one batch of the engine's events.
func (e *Engine) Batch(b *kvevents.Batch) {
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Kind {
		case kvevents.BlockStored:
			e.store(ev)
		case kvevents.BlockRemoved:
			e.remove(ev)
		case kvevents.AllBlocksCleared:
			e.clearTier(snapshot.TierGPU)
		}
	}
	e.publish()
}

// Reset drops what the engine was known to hold: the subscriber lost track
// of it.
func (e *Engine) Reset(why kvevents.Reason) {
	e.log.Info("bridge: engine reset", "reason", why, "blocks", e.used)
	e.Clear()
}

// clearTier drops every copy in tier t, counted announcements and all: the
// engine reset that tier's prefix cache.
func (e *Engine) clearTier(t snapshot.Tier) {
	e.stats.clears.Add(1)
	for slot := e.slab[liveList].next; slot != liveList; {
		next := e.slab[slot].next // release may move slot to the ghost list
		for m := e.slab[slot].media; m != 0; m &= m - 1 {
			if bit := m & -m; e.tierOf(bit) == t {
				delete(e.extra, extraKey(slot, bit))
				e.release(slot, bit)
			}
		}
		slot = next
	}
}

// Clear forgets every block of the engine and clears the sink: the engine
// restarted, or is gone.
func (e *Engine) Clear() {
	e.stats.clears.Add(1)
	e.sink.Clear()
	e.reset()
}

// Stats returns the counters and sizes.
func (e *Engine) Stats() Stats {
	st := Stats{
		Stored: e.stats.stored.Load(), Removed: e.stats.removed.Load(),
		Evicted: e.stats.evicted.Load(), Clears: e.stats.clears.Load(),
		Blocks: int(e.blocks.Load()), TextBlocks: int(e.texts.Load()), Bytes: int(e.bytes.Load()),
	}
	for i := range st.Skipped {
		st.Skipped[i] = e.stats.skipped[i].Load()
	}
	return st
}

func (e *Engine) publish() {
	e.blocks.Store(int64(e.used))
	e.texts.Store(int64(e.refs.len()))
	e.bytes.Store(int64(cap(e.slab)*entrySize + e.index.bytes() + e.refs.bytes() + cap(e.arena) + cap(e.text) + cap(e.tail) + 8*cap(e.hashes)))
}

func (e *Engine) skip(why Skip, n int) {
	if n > 0 {
		e.stats.skipped[why].Add(uint64(n))
	}
}

// mediumOf returns the bit of an event's kind of copy, adding it when new
// and add is set; false when there is none, or the engine already named 8.
func (e *Engine) mediumOf(ev *kvevents.Event, add bool) (uint8, bool) {
	name := ev.Medium
	if name == "" {
		name = "GPU" // vLLM before media were named
	}
	locality := ev.Locality
	if strings.EqualFold(locality, "LOCAL") {
		locality = "" // unspecified means the publisher's own
	}
	for i, m := range e.media {
		if m.group == ev.Group && strings.EqualFold(m.name, name) && strings.EqualFold(m.locality, locality) && m.ownership == ev.Ownership {
			return 1 << i, true
		}
	}
	if !add || len(e.media) == 8 {
		return 0, false
	}
	t := snapshot.TierCPU
	if strings.EqualFold(name, "GPU") && ev.Ownership == "" {
		t = snapshot.TierGPU
	}
	e.media = append(e.media, medium{strings.Clone(name), ev.Group, strings.Clone(locality), strings.Clone(ev.Ownership), t})
	return 1 << (len(e.media) - 1), true
}

// mediumIndex returns the index of a medium bit.
func mediumIndex(bit uint8) int {
	for i := range 8 {
		if bit == 1<<i {
			return i
		}
	}
	return 0
}

func (e *Engine) tierOf(bit uint8) snapshot.Tier { return e.media[mediumIndex(bit)].tier }

// counted reports whether a medium's copies count announcements: the lower
// tiers', which vLLM's offloading connector repeats per chunk.
func (e *Engine) counted(bit uint8) bool { return e.tierOf(bit) != snapshot.TierGPU }

func extraKey(slot uint32, bit uint8) uint64 { return uint64(slot)<<3 | uint64(mediumIndex(bit)) }

// prefixGroup reports whether a KV-cache group kind keeps whole prefixes:
// full attention and its variants do; sliding-window and Mamba groups keep
// only a window or a state.
func prefixGroup(kind string) bool {
	switch kind {
	case "", "full_attention", "mla_attention", "sink_full_attention":
		return true
	}
	return false
}

// state is the text chain at the end of an engine block.
type state struct {
	chain uint64
	nblk  uint32
	vocab vocab.State
	full  bool
}

func (e *Engine) store(ev *kvevents.Event) {
	n := len(ev.Hashes)
	if !prefixGroup(ev.SpecKind) || strings.EqualFold(ev.Locality, "REMOTE") {
		e.skip(SkipGroup, n)
		return
	}
	bit, ok := e.mediumOf(ev, true)
	if !ok {
		e.skip(SkipMedia, n)
		return
	}
	if len(ev.Tokens) == 0 {
		// An offload to a lower tier: the blocks are known by their hashes.
		for _, h := range ev.Hashes {
			if slot, ok := e.index.get(h); ok {
				e.hold(slot, bit)
			} else {
				e.skip(SkipUnknownBlock, 1)
			}
		}
		return
	}
	bs := ev.BlockSize
	if bs <= 0 && len(ev.Tokens)%n == 0 {
		bs = len(ev.Tokens) / n
	}
	tokens := ev.Tokens
	if len(tokens) == n*bs+1 {
		tokens = tokens[:n*bs] // SGLang's token pairs carry the next block's first token
	}
	if bs <= 0 || len(tokens) != n*bs {
		e.skip(SkipShape, n)
		return
	}
	name := ev.LoRAName
	if name == "" {
		if ev.LoRAID != 0 {
			e.skip(SkipAdapter, n)
			return
		}
		name = e.cfg.Model
	}

	var st state
	e.tail = e.tail[:0]
	if ev.HasParent {
		slot, ok := e.index.get(ev.Parent)
		if !ok {
			e.skip(SkipUnknownParent, n)
			return
		}
		st = e.load(slot)
	} else {
		st = state{chain: e.seedOf(name), vocab: e.cfg.Vocab.Start()}
	}
	for i, h := range ev.Hashes {
		if i < len(ev.Extra) {
			salt, ok := textKeys(ev.Extra[i], ev.LoRAName)
			if !ok || (salt != "" && (i > 0 || ev.HasParent)) {
				e.skip(SkipExtraKeys, n-i)
				return
			}
			st.chain = blockhash.Salted(st.chain, salt)
		}
		if slot, ok := e.index.get(h); ok {
			e.hold(slot, bit)
			st = e.load(slot)
			continue
		}
		if !st.full {
			var err error
			e.text = append(e.text[:0], e.tail...)
			e.text, st.vocab, err = e.cfg.Vocab.Append(e.text, st.vocab, tokens[i*bs:(i+1)*bs])
			if err != nil {
				e.skip(SkipTokens, n-i)
				return
			}
		}
		e.hashes = e.hashes[:0]
		off := 0
		for !st.full && len(e.text)-off >= e.size {
			st.chain = blockhash.Next(st.chain, e.text[off:off+e.size])
			e.hashes = append(e.hashes, st.chain)
			off += e.size
			st.nblk++
			st.full = st.nblk >= e.max
		}
		if len(e.hashes) > math.MaxUint16 {
			e.skip(SkipShape, n-i)
			return
		}
		e.tail = e.tail[:0]
		if !st.full {
			e.tail = append(e.tail, e.text[off:]...)
		}
		e.insert(h, st, bit)
	}
}

// textKeys reports whether text can match a block with extra keys x: none
// but its adapter's name, which the seed already covers, and, on a
// prompt's first block, one more string, vLLM's cache salt, which it
// returns ("" for none). A first block with an image and no salt is taken
// for salted by the image's identifier; its hashes then match no request,
// which costs index room, never a wrong route.
func textKeys(x kvevents.Extra, lora string) (salt string, ok bool) {
	n := 0
	for _, k := range x.Keys {
		if k != lora {
			salt, n = k, n+1
		}
	}
	return salt, x.Other == 0 && (n == 0 || n == 1 && salt != "")
}

func (e *Engine) seedOf(name string) uint64 {
	if name != e.seedName || e.seedName == "" {
		e.seedName, e.seed = strings.Clone(name), blockhash.Seed(name, "")
	}
	return e.seed
}

// load returns a block's end state and copies its tail to e.tail.
func (e *Engine) load(slot uint32) state {
	en := &e.slab[slot]
	t := int(en.rec) + 8*int(en.nh)
	e.tail = append(e.tail[:0], e.arena[t:t+int(en.tail)]...)
	return state{chain: en.chain, nblk: en.nblk, vocab: vocab.State(en.flags & stateMask), full: en.flags&flagFull != 0}
}

// insert adds a new block ending in state st, with e.hashes completed and
// e.tail after them, held by medium bit.
func (e *Engine) insert(h uint64, st state, bit uint8) {
	for e.used >= e.limit {
		e.evictOne()
	}
	slot := e.alloc()
	rec := len(e.arena)
	for _, x := range e.hashes {
		e.arena = binary.LittleEndian.AppendUint64(e.arena, x)
	}
	e.arena = append(e.arena, e.tail...)
	flags := uint8(flagUsed) | uint8(st.vocab)&stateMask
	if st.full {
		flags |= flagFull
	}
	e.slab[slot] = entry{hash: h, chain: st.chain, rec: uint32(rec), nblk: st.nblk,
		nh: uint16(len(e.hashes)), tail: uint8(len(e.tail)), flags: flags}
	e.link(slot, ghostList)
	e.index.put(h, slot)
	e.hold(slot, bit)
	if len(e.arena) > math.MaxUint32/2 {
		e.compact()
	}
}

// hold records that medium bit holds the block in slot: once for the GPU,
// once more per announcement for lower tiers.
func (e *Engine) hold(slot uint32, bit uint8) {
	en := &e.slab[slot]
	if en.media&bit != 0 {
		if e.counted(bit) {
			e.extra[extraKey(slot, bit)]++
		}
		return
	}
	if en.media == 0 {
		e.unlink(slot)
		e.link(slot, liveList)
	}
	en.media |= bit
	e.stats.stored.Add(1)
	tier := e.tierOf(bit)
	for i := range int(en.nh) {
		e.ref(e.textHash(en, i), tier, 1)
	}
}

func (e *Engine) textHash(en *entry, i int) uint64 {
	return binary.LittleEndian.Uint64(e.arena[int(en.rec)+8*i:])
}

func (e *Engine) remove(ev *kvevents.Event) {
	bit, ok := e.mediumOf(ev, false)
	if !ok {
		return // a kind of copy never stored: nothing it names is held
	}
	for _, h := range ev.Hashes {
		if slot, ok := e.index.get(h); ok {
			e.release(slot, bit)
		}
	}
}

// release records that one announcement of medium bit's copy of the block
// in slot was removed; the copy goes with its last. A block no medium
// holds is kept, oldest dropped first, for offload events that name it.
func (e *Engine) release(slot uint32, bit uint8) {
	en := &e.slab[slot]
	if en.media&bit == 0 {
		return
	}
	if k := extraKey(slot, bit); e.extra[k] > 0 {
		if e.extra[k]--; e.extra[k] == 0 {
			delete(e.extra, k)
		}
		return
	}
	en.media &^= bit
	e.stats.removed.Add(1)
	tier := e.tierOf(bit)
	for i := range int(en.nh) {
		e.ref(e.textHash(en, i), tier, -1)
	}
	if en.media == 0 {
		e.unlink(slot)
		e.link(slot, ghostList)
	}
}

// evictOne makes room: the oldest block no medium holds, else the oldest
// block (the engine reports more blocks than it was said to hold).
func (e *Engine) evictOne() {
	slot := e.slab[ghostList].next
	if slot == ghostList {
		slot = e.slab[liveList].next
		e.stats.evicted.Add(1)
		for m := e.slab[slot].media; m != 0; m &= m - 1 {
			delete(e.extra, extraKey(slot, m&-m))
			e.release(slot, m&-m)
		}
	}
	en := &e.slab[slot]
	e.index.del(en.hash)
	e.wasted += 8*int(en.nh) + int(en.tail)
	e.unlink(slot)
	*en = entry{next: e.free}
	e.free = slot
	e.used--
	if e.wasted > len(e.arena)/2 && e.wasted > 1<<16 {
		e.compact()
	}
}

// ref adds d to the holders of text block h in tier t, telling the sink
// when the first arrives or the last leaves. Counts stick at 0xffff.
func (e *Engine) ref(h uint64, t snapshot.Tier, d int) {
	v, _ := e.refs.get(h)
	shift := 0
	if t != snapshot.TierGPU {
		shift = 16
	}
	c := int(v>>shift) & 0xffff
	if c == 0xffff {
		return
	}
	c += d
	if c < 0 {
		return
	}
	v = v&^(0xffff<<shift) | uint32(c)<<shift
	if v == 0 {
		e.refs.del(h)
	} else {
		e.refs.put(h, v)
	}
	switch {
	case c == 1 && d > 0:
		e.sink.Add(h, t)
	case c == 0:
		e.sink.Remove(h, t)
	}
}

func (e *Engine) alloc() uint32 {
	e.used++
	if e.free != noSlot {
		slot := e.free
		e.free = e.slab[slot].next
		return slot
	}
	e.slab = append(e.slab, entry{})
	return uint32(len(e.slab) - 1)
}

func (e *Engine) link(slot, list uint32) {
	head := &e.slab[list]
	en := &e.slab[slot]
	en.prev, en.next = head.prev, list
	e.slab[head.prev].next = slot
	head.prev = slot
}

func (e *Engine) unlink(slot uint32) {
	en := &e.slab[slot]
	e.slab[en.prev].next = en.next
	e.slab[en.next].prev = en.prev
}

// compact copies the arena's live records into a fresh one.
func (e *Engine) compact() {
	// Room for as much again: the arena is compacted when half of it is
	// waste, so it never grows between compactions.
	live := len(e.arena) - e.wasted
	arena := make([]byte, 0, 2*live)
	for i := firstSlot; i < len(e.slab); i++ {
		en := &e.slab[i]
		if en.flags&flagUsed == 0 {
			continue
		}
		n := 8*int(en.nh) + int(en.tail)
		rec := len(arena)
		arena = append(arena, e.arena[en.rec:int(en.rec)+n]...)
		en.rec = uint32(rec)
	}
	e.arena, e.wasted = arena, 0
}
