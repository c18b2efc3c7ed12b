package vllmsim

// block is one GPU KV block. A block with hashed set holds a full block of
// tokens that later requests may reuse; while ref is 0 it also sits in the
// free queue and is reclaimed, least recently freed first, when a request
// needs a new block (vLLM's BlockPool and FreeKVCacheBlockQueue).
type block struct {
	ref        int
	hashed     bool
	hash       blockHash
	parent     blockHash
	hasParent  bool
	tokens     []int
	prev, next *block // free queue links
	free       bool
}

// blockPool is the GPU prefix cache with an optional CPU tier under it:
// blocks offloaded one by one as the GPU evicts them (cpu), or requests'
// blocks offloaded in chunks as they are computed (chunks).
// All methods run on the engine loop's goroutine or under the engine lock.
type blockPool struct {
	blockSize int
	blocks    []block
	head      block // free queue sentinel: head.next is evicted first
	nfree     int
	cached    map[blockHash]*block
	cpu       *cpuTier
	chunks    *chunkTier
	caching   bool // prefix caching on: hashes are kept and events sent
	events    []kvEvent
}

// lower reports whether the pool has a CPU tier.
func (p *blockPool) lower() bool { return p.cpu != nil || p.chunks != nil }

// lowerHas reports whether the CPU tier holds h.
func (p *blockPool) lowerHas(h blockHash) bool {
	if p.chunks != nil {
		return p.chunks.has(h)
	}
	return p.cpu.has(h)
}

// lowerTouch marks h as just used in the CPU tier.
func (p *blockPool) lowerTouch(h blockHash) {
	if p.chunks != nil {
		p.chunks.touch(h)
	} else if p.cpu != nil {
		p.cpu.touch(h)
	}
}

// newBlockPool makes the GPU pool and, with numCPU blocks, the CPU tier:
// offloaded in chunks of chunkBlocks, or block by block on eviction (0).
func newBlockPool(numGPU, numCPU, blockSize int, caching bool, chunkBlocks int) *blockPool {
	// vLLM reserves block 0 as the null block; the rest are usable.
	p := &blockPool{
		blockSize: blockSize,
		blocks:    make([]block, numGPU-1),
		cached:    make(map[blockHash]*block),
		caching:   caching,
	}
	p.head.next, p.head.prev = &p.head, &p.head
	for i := range p.blocks {
		p.pushFree(&p.blocks[i])
	}
	switch {
	case numCPU == 0 || !caching:
	case chunkBlocks > 0:
		p.chunks = newChunkTier(numCPU, chunkBlocks)
	default:
		p.cpu = newCPUTier(numCPU)
	}
	return p
}

func (p *blockPool) pushFree(b *block) {
	b.prev, b.next = p.head.prev, &p.head
	p.head.prev.next = b
	p.head.prev = b
	b.free = true
	p.nfree++
}

func (p *blockPool) unlinkFree(b *block) {
	b.prev.next, b.next.prev = b.next, b.prev
	b.prev, b.next = nil, nil
	b.free = false
	p.nfree--
}

// usage is vllm:kv_cache_usage_perc: the fraction of blocks held by requests.
func (p *blockPool) usage() float64 {
	return 1 - float64(p.nfree)/float64(len(p.blocks))
}

// match returns the longest run of cached GPU blocks for hashes, then how
// many of the following hashes the CPU tier holds.
func (p *blockPool) match(hashes []blockHash) (gpu []*block, cpu int) {
	if !p.caching {
		return nil, 0
	}
	for _, h := range hashes {
		b, ok := p.cached[h]
		if !ok {
			break
		}
		gpu = append(gpu, b)
	}
	if p.lower() {
		for _, h := range hashes[len(gpu):] {
			if !p.lowerHas(h) {
				break
			}
			cpu++
		}
	}
	return gpu, cpu
}

// reuse announces a request's prefix-cache hits again, as vLLM 0.33's
// emit_cached_block_events does for requests that ask for full reports:
// one BlockStored from the root over the blocks reused, the state
// unchanged.
func (p *blockPool) reuse(hit []*block, meta storeMeta) {
	if len(hit) == 0 || !p.caching {
		return
	}
	ev := blockStored{blockSize: p.blockSize, loraID: meta.loraID, loraName: meta.loraName, medium: mediumGPU, group: true}
	for i, b := range hit {
		ev.hashes = append(ev.hashes, b.hash)
		ev.tokens = append(ev.tokens, b.tokens...)
		ev.extraKeys = append(ev.extraKeys, meta.extra(i))
	}
	p.events = append(p.events, ev)
}

// offloadChunks stores the request's whole chunks among its first upTo
// blocks in the chunk tier, from chunk from on, and returns the chunks
// stored so far.
func (p *blockPool) offloadChunks(hashes []blockHash, tokens []int, from, upTo int, meta storeMeta) int {
	if p.chunks == nil {
		return from
	}
	n := p.chunks.n
	for ; (from+1)*n <= upTo; from++ {
		lo, hi := from*n, (from+1)*n
		var parent *blockHash
		if lo > 0 {
			parent = &hashes[lo-1]
		}
		p.events = p.chunks.store(p.events, hashes[lo:hi], parent, tokens[lo*p.blockSize:hi*p.blockSize], p.blockSize, meta)
	}
	return from
}

// evictableAmong counts blocks in bs that sit in the free queue: touching
// them takes them out of it, so they cannot also serve as new blocks.
func evictableAmong(bs []*block) int {
	n := 0
	for _, b := range bs {
		if b.free {
			n++
		}
	}
	return n
}

// touch takes a reference on cache hits.
func (p *blockPool) touch(bs []*block) {
	for _, b := range bs {
		if b.free {
			p.unlinkFree(b)
		}
		b.ref++
	}
}

// allocate takes n blocks from the head of the free queue, evicting the
// cached ones among them. The caller checks n <= nfree.
func (p *blockPool) allocate(n int) []*block {
	out := make([]*block, n)
	for i := range out {
		b := p.head.next
		p.unlinkFree(b)
		if b.hashed {
			p.evict(b)
		}
		b.ref = 1
		out[i] = b
	}
	return out
}

func (p *blockPool) evict(b *block) {
	delete(p.cached, b.hash)
	p.events = append(p.events, blockRemoved{hashes: []blockHash{b.hash}, medium: mediumGPU, group: true})
	if p.cpu != nil {
		var parent *blockHash
		if b.hasParent {
			parent = new(blockHash)
			*parent = b.parent
		}
		p.events = p.cpu.store(p.events, b.hash, parent, b.tokens, p.blockSize)
	}
	b.hashed, b.hasParent, b.tokens = false, false, nil
}

// free drops a request's references, last block first, so that the tail of
// a prompt is evicted before its shared head.
func (p *blockPool) free(bs []*block) {
	for i := len(bs) - 1; i >= 0; i-- {
		b := bs[i]
		b.ref--
		if b.ref == 0 {
			p.pushFree(b)
		}
	}
}

// commit registers full blocks as cached and queues one BlockStored per
// run of newly cached blocks. bs[i] holds tokens[i*bs:(i+1)*bs] and has hash
// hashes[i]; parent is the hash before hashes[0], if any. A hash another
// block already holds is not registered twice.
func (p *blockPool) commit(bs []*block, hashes []blockHash, parent *blockHash, tokens []int, meta storeMeta) {
	if !p.caching {
		return
	}
	var run *blockStored
	flush := func() {
		if run != nil {
			p.events = append(p.events, *run)
			run = nil
		}
	}
	for i, b := range bs {
		h := hashes[i]
		if _, dup := p.cached[h]; dup || b.hashed {
			flush()
			parent = &hashes[i]
			continue
		}
		b.hashed, b.hash = true, h
		b.tokens = tokens[i*p.blockSize : (i+1)*p.blockSize : (i+1)*p.blockSize]
		if parent != nil {
			b.hasParent, b.parent = true, *parent
		}
		p.cached[h] = b
		if run == nil {
			run = &blockStored{
				parent:    parent,
				blockSize: p.blockSize,
				loraID:    meta.loraID,
				loraName:  meta.loraName,
				medium:    mediumGPU,
				group:     true,
			}
		}
		run.hashes = append(run.hashes, h)
		run.tokens = append(run.tokens, b.tokens...)
		run.extraKeys = append(run.extraKeys, meta.extra(meta.first+i))
		parent = &hashes[i]
	}
	flush()
}

// storeMeta is what a request adds to the events of its blocks.
type storeMeta struct {
	loraID    int
	loraName  string
	salt      string
	first     int  // index of bs[0] within the request
	reportAll bool // announce reused blocks too (kv_cache_report_mode "full")
}

// extra returns the extra keys of the request's block i, as vLLM's
// generate_block_hash_extra_keys does: the LoRA name on every block, the
// cache salt on the first; nil when there are none.
func (m storeMeta) extra(i int) extras {
	var x extras
	if m.loraName != "" {
		x = append(x, m.loraName)
	}
	if m.salt != "" && i == 0 {
		x = append(x, m.salt)
	}
	return x
}

// reset drops every cached GPU hash, as vLLM's reset_prefix_cache does:
// AllBlocksCleared is the GPU pool's event, and offloaded copies stay
// unless external asks for the connector's cache to be reset too, which
// removes them one by one. It refuses while any block is held by a
// request.
func (p *blockPool) reset(external bool) bool {
	if p.nfree != len(p.blocks) {
		return false
	}
	for h, b := range p.cached {
		b.hashed, b.hasParent, b.tokens = false, false, nil
		delete(p.cached, h)
	}
	p.events = append(p.events, allBlocksCleared{})
	if external {
		if p.cpu != nil {
			p.events = p.cpu.reset(p.events)
		}
		if p.chunks != nil {
			p.events = p.chunks.reset(p.events)
		}
	}
	return true
}

// takeEvents returns and clears the queued events.
func (p *blockPool) takeEvents() []kvEvent {
	ev := p.events
	p.events = nil
	return ev
}

// cpuTier is an LRU set of blocks offloaded from the GPU on eviction.
type cpuTier struct {
	capacity int
	entries  map[blockHash]*cpuEntry
	head     cpuEntry // sentinel: head.next is least recently used
}

type cpuEntry struct {
	hash       blockHash
	parent     *blockHash
	tokens     []int
	prev, next *cpuEntry
}

func newCPUTier(capacity int) *cpuTier {
	t := &cpuTier{capacity: capacity, entries: make(map[blockHash]*cpuEntry)}
	t.head.next, t.head.prev = &t.head, &t.head
	return t
}

func (t *cpuTier) has(h blockHash) bool { _, ok := t.entries[h]; return ok }

func (t *cpuTier) unlink(e *cpuEntry) { e.prev.next, e.next.prev = e.next, e.prev }

func (t *cpuTier) pushBack(e *cpuEntry) {
	e.prev, e.next = t.head.prev, &t.head
	t.head.prev.next = e
	t.head.prev = e
}

// touch marks h as just used.
func (t *cpuTier) touch(h blockHash) {
	if e, ok := t.entries[h]; ok {
		t.unlink(e)
		t.pushBack(e)
	}
}

// store offloads a block, evicting the least recently used one when full,
// and appends the events vLLM's offloading connector sends: stores carry
// hashes but no tokens.
func (t *cpuTier) store(events []kvEvent, h blockHash, parent *blockHash, tokens []int, blockSize int) []kvEvent {
	if _, ok := t.entries[h]; ok {
		t.touch(h)
		return events
	}
	if len(t.entries) >= t.capacity {
		old := t.head.next
		t.unlink(old)
		delete(t.entries, old.hash)
		events = append(events, blockRemoved{hashes: []blockHash{old.hash}, medium: mediumCPU})
	}
	e := &cpuEntry{hash: h, parent: parent, tokens: tokens}
	t.entries[h] = e
	t.pushBack(e)
	return append(events, blockStored{hashes: []blockHash{h}, blockSize: blockSize, medium: mediumCPU, tokens: []int{}})
}

// reset drops every entry, least recently used first, with the removals.
func (t *cpuTier) reset(events []kvEvent) []kvEvent {
	for e := t.head.next; e != &t.head; e = e.next {
		events = append(events, blockRemoved{hashes: []blockHash{e.hash}, medium: mediumCPU})
	}
	clear(t.entries)
	t.head.next, t.head.prev = &t.head, &t.head
	return events
}

// chunkTier is the CPU tier of vLLM 0.33's offloading connector with
// self-describing events (kv_connector_extra_config
// self_describing_kv_events): a request's blocks are offloaded in chunks of
// n blocks as they are computed, each chunk named by its last hash and
// evicted whole, least recently used first. A chunk's BlockStored carries
// its tokens and parent and every hash it holds, and its BlockRemoved fans
// out to the same hashes; so a hash two chunks hold (a shared prefix that
// ends inside a chunk) is announced and removed twice, and consumers must
// count (vllm/distributed/kv_transfer/kv_connector/v1/offloading/events.py).
type chunkTier struct {
	n, capacity int // blocks per chunk; blocks held at most
	used        int
	chunks      map[blockHash]*chunk
	head        chunk             // sentinel: head.next is least recently used
	counts      map[blockHash]int // chunks holding each hash
}

type chunk struct {
	key        blockHash
	hashes     []blockHash
	parent     *blockHash
	tokens     []int
	prev, next *chunk
}

func newChunkTier(capacity, n int) *chunkTier {
	t := &chunkTier{n: n, capacity: capacity, chunks: map[blockHash]*chunk{}, counts: map[blockHash]int{}}
	t.head.next, t.head.prev = &t.head, &t.head
	return t
}

func (t *chunkTier) has(h blockHash) bool { return t.counts[h] > 0 }

func (t *chunkTier) unlink(c *chunk) { c.prev.next, c.next.prev = c.next, c.prev }

func (t *chunkTier) pushBack(c *chunk) {
	c.prev, c.next = t.head.prev, &t.head
	t.head.prev.next = c
	t.head.prev = c
}

// touch marks the chunk that ends at h as just used.
func (t *chunkTier) touch(h blockHash) {
	if c, ok := t.chunks[h]; ok {
		t.unlink(c)
		t.pushBack(c)
	}
}

// store offloads one chunk unless it is held, evicting least recently used
// chunks to make room, and appends the events.
func (t *chunkTier) store(events []kvEvent, hashes []blockHash, parent *blockHash, tokens []int, blockSize int, meta storeMeta) []kvEvent {
	key := hashes[len(hashes)-1]
	if _, ok := t.chunks[key]; ok {
		t.touch(key)
		return events
	}
	for t.used+len(hashes) > t.capacity && t.head.next != &t.head {
		events = t.evict(events, t.head.next)
	}
	if t.used+len(hashes) > t.capacity {
		return events // a chunk larger than the tier
	}
	c := &chunk{key: key, hashes: hashes, parent: parent, tokens: tokens}
	t.chunks[key] = c
	t.pushBack(c)
	t.used += len(hashes)
	for _, h := range hashes {
		t.counts[h]++
	}
	ev := blockStored{hashes: hashes, parent: parent, tokens: tokens, blockSize: blockSize,
		loraID: meta.loraID, loraName: meta.loraName, medium: mediumCPU, locality: localityLocal}
	return append(events, ev)
}

func (t *chunkTier) evict(events []kvEvent, c *chunk) []kvEvent {
	t.unlink(c)
	delete(t.chunks, c.key)
	t.used -= len(c.hashes)
	for _, h := range c.hashes {
		if t.counts[h]--; t.counts[h] == 0 {
			delete(t.counts, h)
		}
	}
	return append(events, blockRemoved{hashes: c.hashes, medium: mediumCPU, locality: localityLocal})
}

// reset evicts every chunk.
func (t *chunkTier) reset(events []kvEvent) []kvEvent {
	for t.head.next != &t.head {
		events = t.evict(events, t.head.next)
	}
	return events
}
