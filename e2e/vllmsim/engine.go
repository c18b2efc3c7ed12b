// Package vllmsim simulates a vLLM inference engine for tests, demos and
// benchmarks. It speaks vLLM's interfaces byte for byte where a router can
// tell the difference: the OpenAI-compatible HTTP API, Prometheus metrics
// with vLLM's names, and KV-cache events over ZeroMQ in vLLM's msgpack
// layout with the replay socket. Inside, it renders chat requests with the
// model's real Jinja template, tokenizes with a real BPE vocabulary, keeps a
// block-level prefix cache with vLLM's hashing, eviction and optional CPU
// tier, and schedules with continuous batching and chunked prefill under a
// documented cost model, so that cache hits, queueing and saturation show
// in time to first token as they would on a GPU.
package vllmsim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Engine is one running simulated engine.
type Engine struct {
	cfg Config // with defaults and, after the first start, concrete ports
	tok tokenizer
	tpl atomic.Pointer[chatTemplate] // nil: the model has no chat template
	log *slog.Logger

	pubSpec  endpointSpec
	replayEP string
	unwatch  func() bool // stops closing the engine with Start's context

	renders atomic.Uint64 // render requests served, for their ids

	// slowdown multiplies every step's cost (SetSlowdown), as bits of a
	// float64; 0 means 1.
	slowdown atomic.Uint64

	responses responseStore // the Responses API's, for previous_response_id

	mu      sync.Mutex // guards sched, and run against Close/Restart
	sched   *scheduler
	pub     *publisher
	enc     *eventEncoder
	metrics *metrics
	srv     *http.Server
	addr    string
	events  string // PUB endpoint as a local peer reaches it
	replay  string

	submit chan arrival
	abort  chan *request
	quit   chan struct{}
	done   chan struct{}
	t0     time.Time
	// The loop's simulated time, guarded by mu: the start and end of the
	// step running, equal while idle.
	stepFrom, stepTo float64
}

// Start starts an engine: its HTTP server, its ZeroMQ sockets if KV events
// are enabled, and its scheduler loop. Cancelling ctx closes it.
func Start(ctx context.Context, cfg Config) (*Engine, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	tok, err := loadTokenizer()
	if err != nil {
		return nil, err
	}
	tpl, err := newChatTemplate(cfg.ChatTemplate, cfg.Model)
	if err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, tok: tok, log: cfg.Logger.With("engine", cfg.Model)}
	e.tpl.Store(tpl)
	if cfg.KVEvents.Publisher == "zmq" {
		e.pubSpec = pubEndpoint(cfg.KVEvents.Endpoint)
		e.replayEP = cfg.KVEvents.ReplayEndpoint
	}
	if err := e.start(); err != nil {
		return nil, err
	}
	e.unwatch = context.AfterFunc(ctx, func() { e.Close() })
	return e, nil
}

// StartN starts n engines from cfg on free loopback ports: HTTP, and when
// cfg enables KV events, a bound PUB and a replay ROUTER each. On error it
// closes those already started.
func StartN(ctx context.Context, n int, cfg Config) ([]*Engine, error) {
	cfg.Host, cfg.Port = "127.0.0.1", 0
	if cfg.KVEvents.EnableKVCacheEvents {
		cfg.KVEvents.Endpoint = "tcp://127.0.0.1:*"
		cfg.KVEvents.ReplayEndpoint = "tcp://127.0.0.1:*"
	}
	var es []*Engine
	for range n {
		e, err := Start(ctx, cfg)
		if err != nil {
			for _, e := range es {
				e.Close()
			}
			return nil, err
		}
		es = append(es, e)
	}
	return es, nil
}

// start brings up everything a process start would: empty cache, seq 0,
// fresh metrics. Ports chosen by the first start are kept.
func (e *Engine) start() error {
	cfg := &e.cfg
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)))
	if err != nil {
		return fmt.Errorf("vllmsim: listen: %w", err)
	}
	cfg.Port = ln.Addr().(*net.TCPAddr).Port
	e.addr = ln.Addr().String()

	var pub *publisher
	if cfg.KVEvents.Publisher == "zmq" {
		pub, err = newPublisher(e.log, e.pubSpec, e.replayEP, cfg.KVEvents, !cfg.ReplayWithoutTopic)
		if err != nil {
			ln.Close()
			return err
		}
		// Keep the ports across restarts, as a restarted pod would.
		if e.pubSpec.bind {
			e.pubSpec.addr = pub.pubEP
		}
		if e.replayEP != "" {
			e.replayEP = pub.replayEP
		}
	}

	e.mu.Lock()
	e.sched = newScheduler(cfg)
	e.pub = pub
	e.enc = newEventEncoder(cfg.Encoding, cfg.BatchAsMap, cfg.BytesHashes)
	e.metrics = newMetrics(cfg)
	if pub != nil {
		e.events, e.replay = pub.pubEP, pub.replayEP
	}
	e.submit = make(chan arrival, 256)
	e.abort = make(chan *request, 256)
	e.quit = make(chan struct{})
	e.done = make(chan struct{})
	e.t0 = time.Now()
	e.stepFrom, e.stepTo = 0, 0
	e.srv = &http.Server{Handler: e.routes(), ReadHeaderTimeout: 10 * time.Second}
	srv, quit, done := e.srv, e.quit, e.done
	e.mu.Unlock()

	go e.run(quit, done)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			e.log.Error("http server stopped", "err", err)
		}
	}()
	e.log.Info("engine started", "http", e.addr, "events", e.events, "replay", e.replay)
	return nil
}

// stop ends the loop and drops every connection and socket, as a process
// exit would.
func (e *Engine) stop() error {
	e.mu.Lock()
	quit, done, srv, pub := e.quit, e.done, e.srv, e.pub
	e.quit = nil
	e.mu.Unlock()
	if quit == nil {
		return nil
	}
	close(quit)
	<-done
	errs := []error{srv.Close()}
	if pub != nil {
		errs = append(errs, pub.close())
	}
	return errors.Join(errs...)
}

// Close stops the engine. In-flight requests fail.
func (e *Engine) Close() error {
	e.unwatch()
	return e.stop()
}

// Restart stops the engine and starts it again on the same ports, as a
// restarted vLLM process: the cache is empty, event sequence numbers start
// again at 0, the replay buffer and the metrics are new, and no event tells
// subscribers about the lost cache.
func (e *Engine) Restart() error {
	if err := e.stop(); err != nil {
		e.log.Warn("restart: stop", "err", err)
	}
	return e.start()
}

// Redeploy restarts the engine as Restart does, serving the chat template
// spec names (Config.ChatTemplate) from then on: a redeploy with another
// --chat-template.
func (e *Engine) Redeploy(chatTemplate string) error {
	tpl, err := newChatTemplate(chatTemplate, e.cfg.Model)
	if err != nil {
		return err
	}
	if err := e.stop(); err != nil {
		e.log.Warn("redeploy: stop", "err", err)
	}
	e.cfg.ChatTemplate = chatTemplate
	e.tpl.Store(tpl)
	return e.start()
}

// SetSlowdown makes every step from the next on take f times its cost
// model's time (f >= 1: a throttled GPU, a noisy neighbour, a degraded
// link between tensor-parallel ranks); 1 restores the model.
func (e *Engine) SetSlowdown(f float64) {
	e.slowdown.Store(math.Float64bits(max(f, 1)))
}

func (e *Engine) slowFactor() float64 {
	if b := e.slowdown.Load(); b != 0 {
		return math.Float64frombits(b)
	}
	return 1
}

// Addr returns the HTTP address as host:port.
func (e *Engine) Addr() string { return e.addr }

// URL returns the HTTP base URL, e.g. http://127.0.0.1:8000.
func (e *Engine) URL() string { return "http://" + e.addr }

// EventsEndpoint returns the endpoint a subscriber connects to for KV events
// (for a PUB that connects, the endpoint it connects to), or "" when events
// are off.
func (e *Engine) EventsEndpoint() string { return e.events }

// ReplayEndpoint returns the replay ROUTER endpoint, or "".
func (e *Engine) ReplayEndpoint() string { return e.replay }

// Config returns the engine's configuration with defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// ResetPrefixCache drops every cached GPU block and publishes
// AllBlocksCleared, as vLLM's /reset_prefix_cache does; the CPU tier keeps
// its copies unless external is set (?reset_external=true), which removes
// them with BlockRemoved events. Like vLLM it refuses, returning false,
// while requests hold blocks.
func (e *Engine) ResetPrefixCache(external bool) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sched == nil || !e.sched.pool.reset(external) {
		return false
	}
	e.publish(e.sched.pool.takeEvents())
	return true
}

// Block is a cached KV block.
type Block struct {
	Hash      uint64 // as published: the last 8 bytes of the SHA-256, big-endian
	Parent    uint64 // the previous block's hash; 0 with HasParent false for a first block
	HasParent bool
	TokenIDs  []int
	Medium    string // "GPU" or "CPU"
}

// CachedBlocks returns every block the engine's prefix cache holds, GPU
// tier first (free blocks in eviction order, then blocks held by requests),
// then the CPU tier from least to most recently used.
func (e *Engine) CachedBlocks() []Block {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sched == nil {
		return nil
	}
	p := e.sched.pool
	var out []Block
	add := func(b *block) {
		if b.hashed {
			out = append(out, Block{Hash: b.hash.uint64(), Parent: b.parent.uint64(), HasParent: b.hasParent,
				TokenIDs: append([]int(nil), b.tokens...), Medium: mediumGPU})
		}
	}
	for b := p.head.next; b != &p.head; b = b.next {
		add(b)
	}
	for i := range p.blocks {
		if !p.blocks[i].free {
			add(&p.blocks[i])
		}
	}
	if p.chunks != nil {
		seen := map[blockHash]bool{}
		for c := p.chunks.head.next; c != &p.chunks.head; c = c.next {
			for i, h := range c.hashes {
				if seen[h] {
					continue
				}
				seen[h] = true
				blk := Block{Hash: h.uint64(), TokenIDs: append([]int(nil), c.tokens[i*p.blockSize:(i+1)*p.blockSize]...), Medium: mediumCPU}
				switch {
				case i > 0:
					blk.Parent, blk.HasParent = c.hashes[i-1].uint64(), true
				case c.parent != nil:
					blk.Parent, blk.HasParent = c.parent.uint64(), true
				}
				out = append(out, blk)
			}
		}
	}
	if p.cpu != nil {
		for c := p.cpu.head.next; c != &p.cpu.head; c = c.next {
			blk := Block{Hash: c.hash.uint64(), TokenIDs: append([]int(nil), c.tokens...), Medium: mediumCPU}
			if c.parent != nil {
				blk.Parent, blk.HasParent = c.parent.uint64(), true
			}
			out = append(out, blk)
		}
	}
	return out
}

// Hit is how much of a request the cache would serve if it arrived now.
type Hit struct {
	PromptTokens int // tokens of the rendered prompt
	GPUTokens    int // served from the GPU prefix cache
	CPUTokens    int // served from the CPU tier after them
}

// Probe renders a request body for path (/v1/chat/completions or
// /v1/completions, one prompt) exactly as the HTTP handler would and
// reports its cache hit without running or changing anything.
func (e *Engine) Probe(path string, body []byte) (Hit, error) {
	reqs, apiErr := e.parse(path, body)
	if apiErr != nil {
		return Hit{}, errors.New(apiErr.Message)
	}
	if len(reqs.prompts) != 1 {
		return Hit{}, errors.New("vllmsim: probe takes one prompt")
	}
	r := e.newRequest(reqs, 0)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sched == nil {
		return Hit{}, errors.New("vllmsim: engine closed")
	}
	gpu, cpu := e.sched.prefixHit(r)
	bs := e.cfg.BlockSize
	return Hit{PromptTokens: len(r.tokens), GPUTokens: len(gpu) * bs, CPUTokens: cpu * bs}, nil
}

// Queue is what the engine has to do before a request arriving now gets
// its first token: the true state an oracle router reads.
type Queue struct {
	Running, Waiting int
	// PrefillTokens are the prompt tokens admitted or waiting requests
	// still have to prefill (a waiting request's cache hit counted as it
	// stands now).
	PrefillTokens int
	// Decoding are running requests past their prefill, and Context their
	// tokens in all: each step decodes one token of each.
	Decoding, Context int
}

// Queue returns the engine's queue now.
func (e *Engine) Queue() Queue {
	e.mu.Lock()
	defer e.mu.Unlock()
	var q Queue
	if e.sched == nil {
		return q
	}
	s := e.sched
	bs := e.cfg.BlockSize
	q.Running, q.Waiting = len(s.running), len(s.waiting)
	for _, r := range s.running {
		if r.numComputed < r.promptLen {
			q.PrefillTokens += r.promptLen - r.numComputed
		} else {
			q.Decoding++
			q.Context += len(r.tokens)
		}
	}
	for _, r := range s.waiting {
		gpu, cpu := s.prefixHit(r)
		q.PrefillTokens += max(0, r.promptLen-(len(gpu)+cpu)*bs)
	}
	return q
}

// SimTime returns the simulated time since the engine (re)started: what
// the wall clock maps to while the engine keeps pace, but never past the
// end of the step running, so that it lags with the engine when the host
// is too slow for the time scale. Rates read from the metrics against it
// are the simulated hardware's, however busy the host. Without pacing
// (time scale 0) it is the sum of the costs of the steps run or running.
func (e *Engine) SimTime() time.Duration {
	e.mu.Lock()
	from, to := e.stepFrom, e.stepTo
	e.mu.Unlock()
	if e.cfg.TimeScale == 0 {
		return time.Duration(to * float64(time.Second))
	}
	v := max(e.vnow(time.Now()), from)
	if to > from {
		v = min(v, to)
	}
	return time.Duration(v * float64(time.Second))
}

// vnow converts a wall-clock time to simulated seconds since the start.
func (e *Engine) vnow(t time.Time) float64 {
	if e.cfg.TimeScale == 0 {
		return math.Inf(1)
	}
	return t.Sub(e.t0).Seconds() / e.cfg.TimeScale
}

// wall converts simulated seconds to a wall-clock time.
func (e *Engine) wall(v float64) time.Time {
	return e.t0.Add(time.Duration(v * e.cfg.TimeScale * float64(time.Second)))
}

// publish encodes and sends one batch of events. Callers hold e.mu.
func (e *Engine) publish(events []kvEvent) {
	if e.pub == nil || len(events) == 0 {
		return
	}
	ts := float64(time.Now().UnixNano()) / 1e9
	payload, err := e.enc.encode(ts, events, e.cfg.DataParallelRank)
	if err != nil {
		e.log.Error("kv events", "err", err)
		return
	}
	e.pub.publish(payload)
}

// arrival is a request waiting for the loop to take it, with the wall time
// it arrived.
type arrival struct {
	rs []*request
	at time.Time
}

// run is the engine loop: one iteration per step. Simulated time v
// advances by each step's cost; with a time scale, each step ends no
// earlier than its simulated end maps to on the wall clock.
func (e *Engine) run(quit, done chan struct{}) {
	defer close(done)
	s := e.sched
	var v, stepStart float64
	admit := func(a arrival) {
		// A request that arrived during the last step waits for its end,
		// as in vLLM; its arrival is when it came, within that step.
		at := min(max(e.vnow(a.at), stepStart), v)
		for _, r := range a.rs {
			if r.out == nil { // aborted before it got here
				continue
			}
			r.arrival = at
			s.waiting = append(s.waiting, r)
		}
	}
	drain := func() {
		for {
			select {
			case a := <-e.submit:
				admit(a)
			case r := <-e.abort:
				e.finish(r, "abort", v)
			default:
				return
			}
		}
	}
	for {
		e.mu.Lock()
		drain()
		var plan []work
		if len(s.running)+len(s.waiting) > 0 {
			plan = e.scheduleStep(v)
		}
		e.metrics.step(s)
		end := v
		if len(plan) > 0 {
			end += s.cost(plan) * e.slowFactor()
		}
		e.stepFrom, e.stepTo = v, end
		e.mu.Unlock()

		if len(plan) == 0 {
			select {
			case a := <-e.submit:
				if e.cfg.TimeScale > 0 {
					v = max(v, e.vnow(time.Now()))
				}
				stepStart = v
				e.mu.Lock()
				e.stepFrom, e.stepTo = v, v
				admit(a)
				e.mu.Unlock()
			case r := <-e.abort:
				e.mu.Lock()
				e.finish(r, "abort", v)
				e.mu.Unlock()
			case <-quit:
				e.failAll()
				return
			}
			continue
		}

		if e.cfg.TimeScale > 0 {
			if d := time.Until(e.wall(end)); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-quit:
					t.Stop()
					e.failAll()
					return
				}
			}
		} else {
			select {
			case <-quit:
				e.failAll()
				return
			default:
			}
		}
		e.mu.Lock()
		e.complete(plan, end)
		e.mu.Unlock()
		stepStart, v = v, end
	}
}

// scheduleStep plans a step at simulated time v and publishes the events
// it caused. Callers hold e.mu.
func (e *Engine) scheduleStep(v float64) []work {
	plan := e.sched.schedule(v)
	e.publish(e.sched.pool.takeEvents())
	return plan
}

// complete applies a finished step at simulated time end: every request
// whose known tokens are all computed samples its next token.
func (e *Engine) complete(plan []work, end float64) {
	m := e.metrics
	for _, w := range plan {
		r := w.r
		if r.out == nil { // aborted during the step
			continue
		}
		r.numComputed += w.n
		if r.numComputed < len(r.tokens) {
			continue
		}
		tok := fillerToken(r.outputLen())
		r.tokens = append(r.tokens, tok)
		if r.outputLen() == 1 {
			r.firstToken = end
			m.ttft.Observe(end - r.arrival)
			m.queue.Observe(r.scheduled - r.arrival)
			m.promptTokens.Add(float64(r.promptLen))
		} else {
			m.itl.Observe(end - r.lastToken)
		}
		r.lastToken = end
		m.generationTokens.Inc()
		r.out.push(tok)
		if r.outputLen() >= r.maxOutput {
			e.finish(r, r.reason, end)
		}
	}
	e.publish(e.sched.pool.takeEvents())
	// As vLLM makes its scheduler stats after applying a step's outputs: a
	// client that has read its last token never scrapes itself running.
	m.step(e.sched)
}

// finish takes r out of the engine and closes its stream. Callers hold e.mu.
func (e *Engine) finish(r *request, reason string, v float64) {
	if r.out == nil {
		return
	}
	e.sched.remove(r)
	r.out.done(reason, r.cachedToks)
	r.out = nil
	e.log.Debug("request finished", "id", r.id, "reason", reason, "prompt", r.promptLen, "cached", r.cachedToks,
		"output", r.outputLen(), "preemptions", r.preemptions, "latency", v-r.arrival)
	e.metrics.success.WithLabelValues(reason).Inc()
	if reason != "abort" {
		// Like vLLM, the prefill time (first scheduled to first token) is
		// recorded when the request finishes, not when its prefill does.
		e.metrics.prefill.Observe(r.firstToken - r.scheduled)
		e.metrics.e2e.Observe(v - r.arrival)
		e.metrics.requestPrompt.Observe(float64(r.promptLen))
		e.metrics.requestGeneration.Observe(float64(r.outputLen()))
	}
}

// failAll ends every request when the engine stops.
func (e *Engine) failAll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range append(append([]*request(nil), e.sched.running...), e.sched.waiting...) {
		r.out.done("abort", r.cachedToks)
		r.out = nil
	}
	e.sched.running, e.sched.waiting = nil, nil
	for {
		select {
		case a := <-e.submit:
			for _, r := range a.rs {
				if r.out != nil {
					r.out.done("abort", 0)
					r.out = nil
				}
			}
		default:
			return
		}
	}
}

// enqueue hands requests to the loop, or fails them if the engine stopped.
func (e *Engine) enqueue(ctx context.Context, rs []*request) error {
	e.mu.Lock()
	submit, quit := e.submit, e.quit
	e.mu.Unlock()
	if quit == nil {
		return errors.New("engine is not running")
	}
	select {
	case submit <- arrival{rs, time.Now()}:
		return nil
	case <-quit:
		return errors.New("engine is not running")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// cancel asks the loop to abort r; a finished request is left alone.
func (e *Engine) cancel(r *request) {
	e.mu.Lock()
	abort, quit := e.abort, e.quit
	e.mu.Unlock()
	if quit == nil {
		return
	}
	select {
	case abort <- r:
	case <-quit:
	}
}
