package snapshot

import (
	"errors"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/shared/predict"
	"github.com/kvroute/kvroute/shared/prompt"
)

// DefaultShardBits gives 256 shards; see "Shard count" in the package
// documentation for the measurements behind it.
const DefaultShardBits = 8

// minDeltaBudget keeps small snapshots from compacting a shard for every
// handful of changes.
const minDeltaBudget = 1024

// ErrNoEndpoint reports an index change for a slot that holds no endpoint.
var ErrNoEndpoint = errors.New("snapshot: no endpoint in that slot")

// Health is an endpoint's state as cachesync last saw it.
type Health uint8

// The health states. Only HealthHealthy endpoints take new requests.
const (
	HealthUnknown   Health = 0 // discovered, not yet probed
	HealthHealthy   Health = 1
	HealthDraining  Health = 2 // finishing its requests, taking no new ones
	HealthUnhealthy Health = 3
)

// EndpointInfo is what cachesync knows about one endpoint.
type EndpointInfo struct {
	Addr     string   // ip:port, the value of x-gateway-destination-endpoint
	Models   []string // base model names served
	Adapters []string // LoRA adapters loaded, requested by name like models
	Health   Health
	// Template is the chat template the engine was found to render with
	// (cachesync's check); prompt.Plain when not known.
	Template prompt.Template

	Running       int     // requests being processed (vllm:num_requests_running)
	Waiting       int     // requests queued (vllm:num_requests_waiting)
	KVCacheUsage  float64 // fraction of KV-cache blocks in use, 0..1
	PrefillTokens int     // uncached prompt tokens in flight as cachesync estimates them
	// ShowsReports says the index shows the blocks a gateway's routing
	// report names from the report on: the endpoint is approximate, or
	// cachesync counts reported blocks as pending until its KV events
	// confirm them. Otherwise the engine's events show a prompt only once
	// it is prefilled.
	ShowsReports bool
	// LoadAt is when Running, Waiting and KVCacheUsage were read from the
	// engine (its last scrape); zero if not known. A gateway subtracts its
	// own requests in flight at that moment to tell the others' load from
	// its own, which it knows as of now.
	LoadAt time.Time

	// PrefillRate is the endpoint's calibrated prefill throughput in tokens
	// per second for its model and accelerator; 0 means unknown.
	PrefillRate float64
	// IndexCapacity is how many text blocks the endpoint's cache holds, as
	// the index sizes it (its KV capacity in text blocks); 0 unknown. The
	// blocks the index holds for the endpoint are counted by the Builder.
	IndexCapacity int
	// Model is the endpoint's fitted latency model (shared/predict); its
	// zero value, with no samples, means none.
	Model predict.Model
	// Slots are the engine's sequence slots and the prompts they hold, for
	// an engine whose cache is a prompt per slot; nil for any other.
	Slots []EngineSlot
	// Pins are the keys (GroupKey) of the prompt groups cachesync's
	// planner moved to the endpoint, at most MaxPins: the policy sends
	// their requests here while the endpoint can take them.
	Pins []uint64
}

func (e *EndpointInfo) validate() error {
	if len(e.Addr) == 0 || len(e.Addr) > 255 {
		return errors.New("snapshot: endpoint address must have 1 to 255 bytes")
	}
	if len(e.Models)+len(e.Adapters) > 255 {
		return errors.New("snapshot: endpoint " + e.Addr + " lists more than 255 models and adapters")
	}
	for _, l := range [][]string{e.Models, e.Adapters} {
		for _, n := range l {
			if len(n) == 0 || len(n) > 255 {
				return errors.New("snapshot: endpoint " + e.Addr + ": model names must have 1 to 255 bytes")
			}
		}
	}
	if e.Health > HealthUnhealthy {
		return errors.New("snapshot: endpoint " + e.Addr + ": unknown health")
	}
	if !e.Template.Known() {
		return errors.New("snapshot: endpoint " + e.Addr + ": unknown chat template")
	}
	if !e.Model.Valid() {
		return errors.New("snapshot: endpoint " + e.Addr + ": latency model has a negative or non-finite coefficient")
	}
	for _, n := range []int{e.Running, e.Waiting, e.PrefillTokens, e.IndexCapacity} {
		if n < 0 || int64(n) > math.MaxUint32 {
			return errors.New("snapshot: endpoint " + e.Addr + ": count out of range")
		}
	}
	if !(e.KVCacheUsage >= 0 && e.KVCacheUsage <= 1) {
		return errors.New("snapshot: endpoint " + e.Addr + ": KV-cache usage outside 0..1")
	}
	if !(e.PrefillRate >= 0 && e.PrefillRate <= math.MaxFloat32) {
		return errors.New("snapshot: endpoint " + e.Addr + ": prefill rate out of range")
	}
	if len(e.Pins) > MaxPins {
		return errors.New("snapshot: endpoint " + e.Addr + " has more than " + strconv.Itoa(MaxPins) + " pinned groups")
	}
	return validateSlots(e.Addr, e.Slots)
}

// BuilderConfig sets the shape of the snapshots a Builder makes.
type BuilderConfig struct {
	// ShardBits is log2 of the number of index shards, 1 to MaxShardBits;
	// 0 means DefaultShardBits.
	ShardBits int
	// DeltaBudget bounds the entries the delta may carry before the shards
	// with the most changes are compacted. 0 sizes it from the observed
	// change rate (see the package documentation); a negative value
	// disables the delta, so that every changed shard is rewritten.
	DeltaBudget int
	// FirstGeneration is the generation before the first Build. Seed it
	// from the clock so that a restarted cachesync never reuses a
	// generation that fetchers still hold.
	FirstGeneration uint64
	// BytesPerToken is published in every manifest: how many bytes of
	// prompt text a token stands for, 0 (unknown) to MaxBytesPerToken.
	BytesPerToken float64
}

// MaxBytesPerToken bounds BuilderConfig.BytesPerToken.
const MaxBytesPerToken = 64

// Builder keeps the authoritative index and endpoint table and encodes a
// new generation on each Build. It is not safe for concurrent use; the
// Images it returns are.
type Builder struct {
	bpt       float32
	shardBits uint8
	budget    int
	gen       uint64

	eps    []epState
	byAddr map[string]int
	sets   interner
	shards []shardState

	entries    int     // hashes indexed
	dirty      int     // entries changed since their shard's base, i.e. the delta's size
	dirtyAfter int     // dirty right after the previous Build
	growth     float64 // EWMA of delta growth per Build
	built      bool

	delta        []byte
	deltaEntries int
	deltaChanged bool

	templates        []ChatTemplate // sorted by model
	templatesPart    []byte         // nil while there are none
	templatesChanged bool

	enc    encoder
	ents   []tableEntry
	spare  []tableEntry
	counts []uint32
	ord    []int
}

type epState struct {
	info  EndpointInfo
	since uint64
	held  int // text blocks the index holds for it, in any tier
	// prefixes is how many distinct prompt prefixes it holds that
	// gateways recently routed there (SetPrefixes).
	prefixes int
	vacant   bool
}

type shardState struct {
	m     map[uint64]uint32   // hash -> holder set id
	dirty map[uint64]struct{} // hashes changed since part was encoded
	part  []byte
	n     int
}

// NewBuilder returns an empty Builder.
func NewBuilder(cfg BuilderConfig) (*Builder, error) {
	bits := cfg.ShardBits
	if bits == 0 {
		bits = DefaultShardBits
	}
	if bits < 1 || bits > MaxShardBits {
		return nil, errors.New("snapshot: shard bits must be 1 to 12")
	}
	if !(cfg.BytesPerToken >= 0 && cfg.BytesPerToken <= MaxBytesPerToken) {
		return nil, errors.New("snapshot: bytes per token must be 0 to 64")
	}
	b := &Builder{
		bpt:       float32(cfg.BytesPerToken),
		shardBits: uint8(bits),
		budget:    cfg.DeltaBudget,
		gen:       cfg.FirstGeneration,
		byAddr:    make(map[string]int),
		shards:    make([]shardState, 1<<bits),
	}
	b.sets.init()
	for i := range b.shards {
		b.shards[i] = shardState{m: make(map[uint64]uint32), dirty: make(map[uint64]struct{})}
	}
	return b, nil
}

// SetEndpoint adds the endpoint, or updates it if its address is known, and
// returns its slot. A slot stays with its endpoint until RemoveEndpoint.
func (b *Builder) SetEndpoint(info EndpointInfo) (int, error) {
	if err := info.validate(); err != nil {
		return -1, err
	}
	info.Models = slices.Clone(info.Models)
	info.Adapters = slices.Clone(info.Adapters)
	// Sorted once here rather than at every Build: rows go out by slot id.
	info.Pins = slices.Clone(info.Pins)
	info.Slots = slices.Clone(info.Slots)
	slices.SortFunc(info.Slots, func(a, b EngineSlot) int { return a.ID - b.ID })
	for i := range info.Slots {
		info.Slots[i].Hashes = slices.Clone(info.Slots[i].Hashes)
	}
	if slot, ok := b.byAddr[info.Addr]; ok {
		b.eps[slot].info = info
		return slot, nil
	}
	slot := slices.IndexFunc(b.eps, func(e epState) bool { return e.vacant })
	if slot < 0 {
		if len(b.eps) == MaxEndpoints {
			return -1, errors.New("snapshot: endpoint table full")
		}
		slot = len(b.eps)
		b.eps = append(b.eps, epState{})
	}
	b.eps[slot] = epState{info: info, since: b.gen + 1}
	b.byAddr[info.Addr] = slot
	return slot, nil
}

// Endpoint returns the slot of the endpoint with address addr.
func (b *Builder) Endpoint(addr string) (int, bool) {
	slot, ok := b.byAddr[addr]
	return slot, ok
}

// RemoveEndpoint drops the endpoint and every index entry of it. Its slot
// may go to an endpoint added later: every entry that named the slot is in
// the delta or a rewritten shard of the same generation, so no reader can
// attribute the old endpoint's blocks to the new one.
func (b *Builder) RemoveEndpoint(addr string) bool {
	slot, ok := b.byAddr[addr]
	if !ok {
		return false
	}
	b.ClearEndpoint(slot)
	delete(b.byAddr, addr)
	b.eps[slot] = epState{vacant: true}
	return true
}

func (b *Builder) live(slot int) bool {
	return slot >= 0 && slot < len(b.eps) && !b.eps[slot].vacant
}

// Add records that the endpoint in slot holds block h in tier t.
func (b *Builder) Add(slot int, h uint64, t Tier) error {
	if !b.live(slot) {
		return ErrNoEndpoint
	}
	b.update(h, slot, tierMask(t), 0)
	return nil
}

// Remove records that the endpoint in slot no longer holds block h in
// tier t. Removing what is not there is not an error: engines repeat
// removals after a replay.
func (b *Builder) Remove(slot int, h uint64, t Tier) error {
	if !b.live(slot) {
		return ErrNoEndpoint
	}
	b.update(h, slot, 0, tierMask(t))
	return nil
}

// Holds reports whether the endpoint in slot holds block h in tier t.
func (b *Builder) Holds(slot int, h uint64, t Tier) bool {
	if !b.live(slot) {
		return false
	}
	id, ok := b.shards[h>>(64-b.shardBits)].m[h]
	return ok && b.sets.sets[id].slotMask(slot)&tierMask(t) != 0
}

func (b *Builder) update(h uint64, slot int, set, clear uint8) {
	sh := &b.shards[h>>(64-b.shardBits)]
	old := sh.m[h]
	nw := b.sets.withMask(old, slot, set, clear)
	if nw == old {
		return
	}
	b.countHeld(slot, old, nw)
	b.setEntry(sh, h, old, nw)
}

// countHeld follows how many blocks slot holds as an entry moves from set
// old to set nw.
func (b *Builder) countHeld(slot int, old, nw uint32) {
	was, is := b.sets.sets[old].slotMask(slot) != 0, b.sets.sets[nw].slotMask(slot) != 0
	switch {
	case is && !was:
		b.eps[slot].held++
	case was && !is:
		b.eps[slot].held--
	}
}

// Held returns how many blocks the index holds for the endpoint in slot.
func (b *Builder) Held(slot int) int {
	if !b.live(slot) {
		return 0
	}
	return b.eps[slot].held
}

func (b *Builder) setEntry(sh *shardState, h uint64, old, nw uint32) {
	if nw != 0 {
		b.sets.ref(nw)
	}
	if old != 0 {
		b.sets.unref(old)
	}
	switch {
	case nw == 0:
		delete(sh.m, h)
		b.entries--
	case old == 0:
		b.entries++
		sh.m[h] = nw
	default:
		sh.m[h] = nw
	}
	if sh.part == nil {
		return // never encoded: the first Build writes the whole shard
	}
	if _, ok := sh.dirty[h]; !ok {
		sh.dirty[h] = struct{}{}
		b.dirty++
	}
	b.deltaChanged = true
}

// ClearEndpoint removes every index entry of the endpoint in slot, as when
// its engine reports that all blocks were cleared or it restarted.
func (b *Builder) ClearEndpoint(slot int) {
	if !b.live(slot) {
		return
	}
	has := make([]bool, len(b.sets.sets))
	for id := range b.sets.sets {
		has[id] = b.sets.sets[id].refs > 0 && b.sets.sets[id].slotMask(slot) != 0
	}
	for i := range b.shards {
		sh := &b.shards[i]
		for h, id := range sh.m {
			if int(id) < len(has) && has[id] {
				if nw := b.sets.withMask(id, slot, 0, maskGPU|maskCPU); nw != id {
					b.setEntry(sh, h, id, nw)
				}
			}
		}
	}
	b.eps[slot].held = 0
}

// SetPrefixes records how many distinct prompt prefixes the endpoint in slot
// holds that gateways recently routed there, each weighed by its share of
// their traffic: the traffic its cache draws, counted in prefixes rather
// than blocks (see Endpoint.Prefixes). It reports whether the count
// changed.
func (b *Builder) SetPrefixes(slot, n int) bool {
	if !b.live(slot) || b.eps[slot].prefixes == n {
		return false
	}
	b.eps[slot].prefixes = min(max(n, 0), math.MaxUint32)
	return true
}

// Entries returns the number of block hashes indexed.
func (b *Builder) Entries() int { return b.entries }

// Build encodes the current state as the next generation.
func (b *Builder) Build(now time.Time) *Image {
	gen := b.gen + 1
	if b.built {
		g := float64(b.dirty - b.dirtyAfter)
		if g < 0 {
			g = 0
		}
		b.growth = 0.8*b.growth + 0.2*g
	}
	b.compact(gen)
	if b.delta == nil || b.deltaChanged {
		b.encodeDelta(gen)
	}
	if b.templatesChanged {
		b.templatesPart = nil
		if len(b.templates) > 0 {
			b.templatesPart = appendTemplates(nil, gen, b.templates)
		}
		b.templatesChanged = false
	}
	b.dirtyAfter = b.dirty
	b.built = true

	im := &Image{gen: gen, delta: b.delta, templates: b.templatesPart, shards: make([][]byte, len(b.shards))}
	refs := make([]ref, len(b.shards))
	for i := range b.shards {
		im.shards[i] = b.shards[i].part
		refs[i] = partRef(b.shards[i].part, b.shards[i].n)
	}
	var tref ref
	if b.templatesPart != nil {
		tref = partRef(b.templatesPart, len(b.templates))
	}
	im.manifest = appendManifest(nil, gen, now, b.bpt, b.shardBits, partRef(b.delta, b.deltaEntries), tref, refs, b.eps)
	b.gen = gen
	return im
}

// deltaBudget returns how many entries the delta may keep. A worker copies
// the delta on every refresh and a shard each time it is compacted, so the
// copy per refresh is about budget + growth*entries/(2*budget) entries,
// least at budget = sqrt(growth*entries/2).
func (b *Builder) deltaBudget() int {
	if b.budget != 0 {
		return b.budget
	}
	return max(minDeltaBudget, int(math.Sqrt(b.growth*float64(b.entries)/2)))
}

// compact rewrites the shards never encoded and, while the delta is over
// budget, those with the most changes.
func (b *Builder) compact(gen uint64) {
	budget := b.deltaBudget()
	b.ord = b.ord[:0]
	for i := range b.shards {
		sh := &b.shards[i]
		switch {
		case sh.part == nil || (budget < 0 && len(sh.dirty) > 0):
			b.encodeShard(i, gen)
		case len(sh.dirty) > 0:
			b.ord = append(b.ord, i)
		}
	}
	if budget < 0 || b.dirty <= budget {
		return
	}
	slices.SortFunc(b.ord, func(x, y int) int { return len(b.shards[y].dirty) - len(b.shards[x].dirty) })
	for _, i := range b.ord {
		if b.dirty <= budget {
			break
		}
		b.encodeShard(i, gen)
	}
}

func (b *Builder) encodeShard(i int, gen uint64) {
	sh := &b.shards[i]
	b.ents = b.ents[:0]
	for h, id := range sh.m {
		b.ents = append(b.ents, tableEntry{h: h, set: id})
	}
	b.sortEntries(b.shardBits)
	sh.part, sh.n = b.enc.appendTable(make([]byte, 0, 9*len(b.ents)+256), KindShard, gen, b.shardBits, i, b.ents, b.sets.sets)
	if len(sh.dirty) > 0 {
		b.dirty -= len(sh.dirty)
		clear(sh.dirty)
		b.deltaChanged = true
	}
}

// encodeDelta writes every dirty entry with its current holders, or a
// tombstone if it has none.
func (b *Builder) encodeDelta(gen uint64) {
	b.ents = b.ents[:0]
	for i := range b.shards {
		sh := &b.shards[i]
		for h := range sh.dirty {
			b.ents = append(b.ents, tableEntry{h: h, set: sh.m[h]})
		}
	}
	b.sortEntries(0)
	b.delta, b.deltaEntries = b.enc.appendTable(make([]byte, 0, 9*len(b.ents)+256), KindDelta, gen, 0, 0, b.ents, b.sets.sets)
	b.deltaChanged = false
}

// sortEntries sorts b.ents by hash. Hashes are uniform and their top skip
// bits are equal (one shard's), so a counting sort on the next bits leaves
// buckets of a few entries, which insertion sort finishes: linear time,
// where a comparison sort of a 4M-entry snapshot took most of Build.
func (b *Builder) sortEntries(skip uint8) {
	n := len(b.ents)
	if n < 64 {
		slices.SortFunc(b.ents, cmpEntry)
		return
	}
	r := min(uint8(bits.Len(uint(n))-1), 20) // about two entries per bucket
	digit := func(h uint64) uint32 { return uint32(h << skip >> (64 - r)) }
	b.counts = slices.Grow(b.counts[:0], 1<<r+1)[:1<<r+1]
	clear(b.counts)
	for _, e := range b.ents {
		b.counts[digit(e.h)+1]++
	}
	for i := 1; i < len(b.counts); i++ {
		b.counts[i] += b.counts[i-1]
	}
	out := slices.Grow(b.spare[:0], n)[:n]
	for _, e := range b.ents {
		d := digit(e.h)
		out[b.counts[d]] = e
		b.counts[d]++
	}
	start := uint32(0)
	for _, end := range b.counts[:1<<r] {
		if bucket := out[start:end]; len(bucket) > 16 {
			slices.SortFunc(bucket, cmpEntry) // skewed hashes: stay n log n
		} else {
			for i := 1; i < len(bucket); i++ {
				for j := i; j > 0 && bucket[j].h < bucket[j-1].h; j-- {
					bucket[j], bucket[j-1] = bucket[j-1], bucket[j]
				}
			}
		}
		start = end
	}
	b.ents, b.spare = out, b.ents
}

func cmpEntry(x, y tableEntry) int {
	switch {
	case x.h < y.h:
		return -1
	case x.h > y.h:
		return 1
	}
	return 0
}

// Holder sets are interned: the builder's maps store a set id per hash, and
// all hashes held by the same endpoints share one set. Inside the builder a
// holder is slot<<2 | tier mask, so an endpoint that holds a block on both
// tiers loses it from one without losing it from the other.
const (
	maskGPU = 1
	maskCPU = 2
)

func tierMask(t Tier) uint8 {
	if t == TierGPU {
		return maskGPU
	}
	return maskCPU
}

type hset struct {
	key    string   // internal codes, two bytes each, by slot; "" for the empty set
	refs   int32    // index entries using the set
	inline uint32   // encoded value when the set has at most two holders
	ext    []uint16 // encoded codes when it has three or more
}

// codes returns the set's encoded holder codes.
func (s *hset) codes() []uint16 {
	if s.ext != nil {
		return s.ext
	}
	var c []uint16
	for _, x := range []uint16{uint16(s.inline), uint16(s.inline >> 16)} {
		if x != noCode {
			c = append(c, x)
		}
	}
	return c
}

// slotMask returns the tiers in which the set holds slot.
func (s *hset) slotMask(slot int) uint8 {
	for i := 0; i+1 < len(s.key); i += 2 {
		c := uint16(s.key[i]) | uint16(s.key[i+1])<<8
		if int(c>>2) == slot {
			return uint8(c & 3)
		}
	}
	return 0
}

type interner struct {
	sets []hset
	ids  map[string]uint32
	free []uint32
	buf  []byte
}

func (in *interner) init() {
	in.sets = []hset{{inline: emptyVal}} // id 0: the empty set, never counted or freed
	in.ids = map[string]uint32{"": 0}
}

// ref and unref count the entries using a set other than the empty one.
func (in *interner) ref(id uint32) { in.sets[id].refs++ }

func (in *interner) unref(id uint32) {
	s := &in.sets[id]
	if s.refs--; s.refs == 0 {
		delete(in.ids, s.key)
		*s = hset{}
		in.free = append(in.free, id)
	}
}

// withMask returns the id of set id with slot's tier mask changed by
// setting bits set and clearing bits clear.
func (in *interner) withMask(id uint32, slot int, set, clear uint8) uint32 {
	key := in.sets[id].key
	buf := in.buf[:0]
	done := false
	for i := 0; i+1 < len(key); i += 2 {
		c := uint16(key[i]) | uint16(key[i+1])<<8
		s := int(c >> 2)
		if s == slot {
			done = true
			if m := (uint8(c&3) | set) &^ clear; m != 0 {
				buf = append(buf, byte(slot<<2)|m, byte(slot>>6))
			}
			continue
		}
		if s > slot && !done {
			done = true
			if m := set &^ clear; m != 0 {
				buf = append(buf, byte(slot<<2)|m, byte(slot>>6))
			}
		}
		buf = append(buf, key[i], key[i+1])
	}
	if !done {
		if m := set &^ clear; m != 0 {
			buf = append(buf, byte(slot<<2)|m, byte(slot>>6))
		}
	}
	in.buf = buf
	if nid, ok := in.ids[string(buf)]; ok {
		return nid
	}
	return in.add(string(buf))
}

func (in *interner) add(key string) uint32 {
	s := hset{key: key}
	enc := make([]uint16, 0, len(key)/2)
	for i := 0; i+1 < len(key); i += 2 {
		c := uint16(key[i]) | uint16(key[i+1])<<8
		t := TierCPU
		if c&maskGPU != 0 {
			t = TierGPU
		}
		enc = append(enc, holderCode(int(c>>2), t))
	}
	switch len(enc) {
	case 1:
		s.inline = uint32(enc[0]) | noCode<<16
	case 2:
		s.inline = uint32(enc[0]) | uint32(enc[1])<<16
	default:
		s.ext = enc
	}
	var id uint32
	if n := len(in.free); n > 0 {
		id = in.free[n-1]
		in.free = in.free[:n-1]
		in.sets[id] = s
	} else {
		id = uint32(len(in.sets))
		in.sets = append(in.sets, s)
	}
	in.ids[key] = id
	return id
}
