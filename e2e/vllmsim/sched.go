package vllmsim

import (
	"sync"
)

// request is one sequence in the engine: a prompt and the tokens generated
// after it.
type request struct {
	id        string
	tokens    []int // prompt, then output
	promptLen int
	maxOutput int
	reason    string // finish reason once maxOutput tokens are out: length, or stop for the simulated end of sequence
	meta      storeMeta
	hashes    []blockHash // of the full blocks of tokens, grown on demand

	blocks      []*block
	numComputed int // tokens whose KV is in blocks
	numCached   int // blocks of blocks already committed to the cache
	offloaded   int // chunks of blocks offloaded to the chunk tier
	admitted    bool

	arrival     float64 // simulated seconds
	scheduled   float64 // first admission
	firstToken  float64
	lastToken   float64
	cachedToks  int // prompt tokens served from the cache at first admission
	preemptions int

	out *stream
}

func (r *request) outputLen() int { return len(r.tokens) - r.promptLen }

// stream carries a request's output from the engine loop to its HTTP
// handler without ever blocking the loop.
type stream struct {
	mu       sync.Mutex
	tokens   []int
	finish   string // "" while running: stop, length or abort
	cached   int
	notify   chan struct{} // capacity 1, may be shared by the streams of one HTTP request
	promptN  int
	finished bool
}

func (s *stream) push(tok int) {
	s.mu.Lock()
	s.tokens = append(s.tokens, tok)
	s.mu.Unlock()
	s.signal()
}

func (s *stream) done(reason string, cached int) {
	s.mu.Lock()
	s.finish, s.cached, s.finished = reason, cached, true
	s.mu.Unlock()
	s.signal()
}

func (s *stream) signal() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// read returns the tokens after the first `from` and whether the request
// has finished, with its reason and cached prompt tokens.
func (s *stream) read(from int) (toks []int, finished bool, reason string, cached int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tokens[from:len(s.tokens):len(s.tokens)], s.finished, s.finish, s.cached
}

// work is one request's share of a step.
type work struct {
	r       *request
	n       int // tokens computed in this step
	context int // tokens before them already in the KV cache
	loaded  int // tokens copied in from the CPU tier
	decode  bool
}

// scheduler is the engine's continuous-batching state: vLLM V1's Scheduler
// and KVCacheManager reduced to what routing can observe.
type scheduler struct {
	cfg     *Config
	pool    *blockPool
	hasher  *hasher
	waiting []*request
	running []*request
	stats   stepStats
}

// stepStats are the counters a step moves; the metrics read them.
type stepStats struct {
	prefixQueries, prefixHits     int
	externalQueries, externalHits int
	preemptions                   int
}

func newScheduler(cfg *Config) *scheduler {
	return &scheduler{
		cfg:    cfg,
		pool:   newBlockPool(cfg.NumGPUBlocks, cfg.NumCPUBlocks, cfg.BlockSize, !cfg.DisablePrefixCaching, cfg.OffloadChunkBlocks),
		hasher: newHasher(cfg.HashSeed),
	}
}

// hashesUpTo makes sure r.hashes covers the first n full blocks.
func (s *scheduler) hashesUpTo(r *request, n int) {
	bs := s.cfg.BlockSize
	for i := len(r.hashes); i < n; i++ {
		var parent *blockHash
		if i > 0 {
			parent = &r.hashes[i-1]
		}
		r.hashes = append(r.hashes, s.hasher.block(parent, r.tokens[i*bs:(i+1)*bs], r.meta.extra(i)))
	}
}

// prefixHit returns the blocks of r's longest cached prefix on the GPU and
// how many blocks follow it on the CPU tier. At least one token is always
// left to compute, as in vLLM.
func (s *scheduler) prefixHit(r *request) ([]*block, int) {
	if !s.pool.caching {
		return nil, 0
	}
	n := (len(r.tokens) - 1) / s.cfg.BlockSize
	s.hashesUpTo(r, n)
	return s.pool.match(r.hashes[:n])
}

// schedule picks the work of one step starting at simulated time now: running requests first (decodes and
// the next chunks of partial prefills), preempting the most recently
// admitted when blocks run out, then waiting requests while the token
// budget, the sequence cap and the free blocks allow.
func (s *scheduler) schedule(now float64) []work {
	var plan []work
	budget := s.cfg.MaxNumBatchedTokens
	preempted := false
	for i := 0; i < len(s.running) && budget > 0; i++ {
		r := s.running[i]
		n := min(len(r.tokens)-r.numComputed, budget)
		scheduled := true
		for !s.allocate(r, n) {
			victim := s.running[len(s.running)-1]
			s.running = s.running[:len(s.running)-1]
			s.preempt(victim)
			preempted = true
			if victim == r {
				scheduled = false
				break
			}
		}
		if !scheduled {
			break
		}
		plan = append(plan, work{r: r, n: n, context: r.numComputed, decode: r.outputLen() > 0 && n == 1 && r.numComputed == len(r.tokens)-1})
		budget -= n
	}
	for !preempted && len(s.waiting) > 0 && budget > 0 && len(s.running) < s.cfg.MaxNumSeqs {
		r := s.waiting[0]
		hit, cpuHit := s.prefixHit(r)
		bs := s.cfg.BlockSize
		computed := (len(hit) + cpuHit) * bs
		n := min(len(r.tokens)-computed, budget)
		need := (computed+n+bs-1)/bs - len(hit)
		if need > s.pool.nfree-evictableAmong(hit) {
			break
		}
		s.waiting = s.waiting[1:]
		s.pool.touch(hit)
		for _, h := range r.hashes[len(hit) : len(hit)+cpuHit] {
			// Most recently used now, so the evictions below spare them.
			s.pool.lowerTouch(h)
		}
		if r.meta.reportAll {
			s.pool.reuse(hit, r.meta)
		}
		r.blocks = append(hit[:len(hit):len(hit)], s.pool.allocate(need)...)
		r.numCached = len(hit)
		s.commit(r, len(hit)+cpuHit)
		r.numComputed = computed
		s.commit(r, (computed+n)/bs)
		if !r.admitted {
			r.admitted = true
			r.scheduled = now
			r.cachedToks = computed
			s.stats.prefixQueries += len(r.tokens)
			s.stats.prefixHits += len(hit) * bs
			if s.pool.lower() {
				s.stats.externalQueries += len(r.tokens) - len(hit)*bs
				s.stats.externalHits += cpuHit * bs
			}
		}
		s.running = append(s.running, r)
		plan = append(plan, work{r: r, n: n, context: computed, loaded: cpuHit * bs})
		budget -= n
	}
	return plan
}

// allocate gives r the blocks for n more tokens and caches the blocks
// those tokens fill, as vLLM's allocate_slots does before the step runs.
func (s *scheduler) allocate(r *request, n int) bool {
	bs := s.cfg.BlockSize
	need := (r.numComputed+n+bs-1)/bs - len(r.blocks)
	if need > s.pool.nfree {
		return false
	}
	if need > 0 {
		r.blocks = append(r.blocks, s.pool.allocate(need)...)
	}
	s.commit(r, (r.numComputed+n)/bs)
	return true
}

// commit caches r's full blocks up to block index upTo.
func (s *scheduler) commit(r *request, upTo int) {
	if upTo <= r.numCached || !s.pool.caching {
		return
	}
	s.hashesUpTo(r, upTo)
	from := r.numCached
	var parent *blockHash
	if from > 0 {
		parent = &r.hashes[from-1]
	}
	meta := r.meta
	meta.first = from
	bs := s.cfg.BlockSize
	s.pool.commit(r.blocks[from:upTo], r.hashes[from:upTo], parent, r.tokens[from*bs:upTo*bs], meta)
	r.numCached = upTo
	r.offloaded = s.pool.offloadChunks(r.hashes, r.tokens, r.offloaded, upTo, r.meta)
}

// preempt frees r's blocks and puts it back at the head of the queue; it
// will recompute everything not still cached.
func (s *scheduler) preempt(r *request) {
	s.pool.free(r.blocks)
	r.blocks, r.numComputed, r.numCached = nil, 0, 0
	r.preemptions++
	s.stats.preemptions++
	s.waiting = append([]*request{r}, s.waiting...)
}

// remove takes r out of the engine and frees its blocks.
func (s *scheduler) remove(r *request) {
	s.pool.free(r.blocks)
	r.blocks = nil
	s.running = deleteReq(s.running, r)
	s.waiting = deleteReq(s.waiting, r)
}

func deleteReq(rs []*request, r *request) []*request {
	for i, x := range rs {
		if x == r {
			return append(rs[:i], rs[i+1:]...)
		}
	}
	return rs
}

// cost is the simulated duration of a step.
func (s *scheduler) cost(plan []work) float64 {
	m := s.cfg.Cost
	t := m.Step
	for _, w := range plan {
		if w.decode {
			t += m.decode(w.context)
		} else {
			t += m.prefill(w.n, w.context)
		}
		t += m.CPULoadToken * float64(w.loaded)
	}
	return t
}
