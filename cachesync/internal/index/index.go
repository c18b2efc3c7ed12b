// Package index is cachesync's single owner of the snapshot: it takes
// changes from many goroutines (an event bridge per engine, the report
// handler, discovery, the metrics scraper) and publishes them as snapshot
// images, at most once per interval and only when something changed.
//
// # Writers never wait for a build
//
// Block changes from an engine's KV events go into a queue per endpoint
// (Sink) and routing reports into a queue of batches (Report); the builder
// loop (Run) applies the queues and builds under the index's lock, so an
// event bridge appends under a lock of its own and goes back to its socket
// while a large snapshot is encoded. Queues are bounded: a writer that
// finds its queue full applies it itself, waiting for the lock, which slows
// the producer instead of growing memory. Endpoint changes (SetEndpoint,
// SetMode, SetCapacity, RemoveEndpoint) are rare and apply at once under
// the lock.
//
// # Precise and approximate endpoints
//
// Each endpoint is in one mode. A precise endpoint's entries come from its
// engine's KV events, which describe its cache exactly but only once a
// prompt's blocks are computed: a second request for a new prefix that
// arrives while the first is still queued or prefilling would see nobody
// holding it and be placed elsewhere, splitting the prefix at birth. So a
// routing report naming a precise endpoint adds the blocks its engine does
// not hold yet as pending, for Config.PendingTTL: the engine's own event
// storing a block confirms it, and a pending block no event confirmed in
// time is removed. A block the engine evicted is not made pending again
// for a TTL: requests routed by a view older than the eviction would
// otherwise renew it forever. The snapshot keeps one bit per endpoint,
// block and tier, and the index tells the two sources apart by the pending
// set, so a report can never remove what the engine stored, nor keep what
// it did not. An approximate endpoint's entries come from reports through
// shared/approx, sized by SetCapacity. Switching modes clears the
// endpoint's entries.
package index

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/shared/approx"
	"github.com/kvroute/kvroute/shared/report"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// Mode says where an endpoint's index entries come from.
type Mode uint8

// The modes.
const (
	// Approximate endpoints learn from the gateways' routing reports.
	Approximate Mode = iota
	// Precise endpoints learn from their engine's KV events, through a
	// Sink.
	Precise
)

// String returns "approximate" or "precise".
func (m Mode) String() string {
	if m == Precise {
		return "precise"
	}
	return "approximate"
}

// Defaults for Config.
const (
	DefaultInterval = 100 * time.Millisecond
	// DefaultCapacity is the approximate capacity, in text blocks, of an
	// endpoint whose KV-cache size is not known yet.
	DefaultCapacity = approx.DefaultCapacity
	// DefaultMaxPending bounds the changes queued per precise endpoint.
	DefaultMaxPending = 1 << 16
	// DefaultMaxPendingHashes bounds the hashes of queued report batches.
	DefaultMaxPendingHashes = 1 << 22
)

// Config configures an Index. The zero value means the defaults.
type Config struct {
	// Interval is the least time between two builds; 0 means
	// DefaultInterval.
	Interval time.Duration
	// Snapshot shapes the snapshots. A zero FirstGeneration is seeded
	// from the clock (in microseconds), so that a restarted cachesync
	// never reuses a generation a fetcher holds.
	Snapshot snapshot.BuilderConfig
	// DefaultCapacity is the approximate capacity of an endpoint until
	// SetCapacity; 0 means DefaultCapacity.
	DefaultCapacity int
	// MaxPending bounds the block changes queued per precise endpoint; 0
	// means DefaultMaxPending.
	MaxPending int
	// MaxPendingHashes bounds the hashes of queued report batches; 0 means
	// DefaultMaxPendingHashes.
	MaxPendingHashes int
	// PendingTTL is how long a block a routing report says a precise
	// endpoint is computing counts before its engine's events confirm it;
	// 0 (or negative) leaves precise endpoints to their events alone.
	PendingTTL time.Duration
	// OnOutcome, if set, receives the outcome records of report batches
	// (what requests' first tokens took), from the builder loop.
	OnOutcome func(endpoint string, o report.Outcome)
	// OnRoute, if set, receives the routing records of report batches
	// that name an endpoint the index knows, from the builder loop; the
	// entry aliases the batch and must not be kept.
	OnRoute func(e report.Entry)
	// Registerer, if set, receives the index's metrics.
	Registerer prometheus.Registerer
	// Logger logs endpoint changes; nil means slog.Default().
	Logger *slog.Logger
}

// Index is safe for concurrent use.
type Index struct {
	interval    time.Duration
	defaultCap  int
	onOutcome   func(string, report.Outcome)
	onRoute     func(report.Entry)
	pendingTTL  time.Duration
	now         func() time.Time // time.Now; tests step it
	maxPending  int
	maxReported int
	log         *slog.Logger
	m           *metrics

	mu      sync.Mutex // guards the fields below and endpoint fields marked so
	b       *snapshot.Builder
	approx  *approx.Index
	eps     map[string]*endpoint
	changed bool
	hashes  []uint64 // scratch for report hashes
	// Scratch for countPrefixes: a prefix's traffic over its holders, the
	// held prefixes' rates, and each endpoint's share-weighted count.
	rootRates map[uint64]float64
	heldRoots []heldRoot
	shares    map[*endpoint]float64

	rmu      sync.Mutex // guards reports
	reports  []report.Batch
	rhashes  int
	rspare   []report.Batch
	wake     chan struct{}
	wakeSent atomic.Bool

	pendingN atomic.Int64 // pending blocks over all endpoints, for the builder loop's timer

	img   atomic.Pointer[snapshot.Image]
	stats atomic.Pointer[Stats]
	// decided counts the reported routing decisions by reason code
	// (report.Reasons).
	decided [len(report.Reasons)]atomic.Uint64
}

type endpoint struct {
	addr string

	// Guarded by Index.mu.
	slot     int
	mode     Mode
	info     snapshot.EndpointInfo
	capacity int
	spare    []op
	// pending maps the blocks reports said a precise endpoint is
	// computing, which no event of its engine has confirmed yet, to when
	// they expire (Unix nanoseconds).
	pending map[uint64]int64
	// evicted maps the blocks the engine's events removed from its GPU
	// cache to when a report may make them pending again: a request
	// routed by a stale snapshot (or one the engine refused) would
	// otherwise keep an evicted prefix looking held, each report renewing
	// it, and keep attracting the requests that renew it.
	evicted map[uint64]int64
	// roots maps the first block of every prompt a report routed here to
	// how often and when last: the prefixes whose traffic the endpoint's
	// cache draws (countPrefixes).
	roots map[uint64]root

	// epoch changes (under both Index.mu and qmu) when the endpoint
	// leaves precise mode or is removed: a Sink of an older epoch is
	// stale and its changes are dropped.
	qmu   sync.Mutex
	epoch uint32
	ops   []op
}

type opKind uint8

const (
	opAdd opKind = iota
	opRemove
	opClear
)

// op is one queued block change of a precise endpoint.
type op struct {
	h    uint64
	kind opKind
	tier snapshot.Tier
}

// New returns an empty index. Run publishes its snapshots.
func New(cfg Config) (*Index, error) {
	sc := cfg.Snapshot
	if sc.FirstGeneration == 0 {
		// Microseconds: a restarted cachesync starts past every
		// generation the last one built (at most one per interval), and
		// the value stays exact as a float64 metric.
		sc.FirstGeneration = uint64(time.Now().UnixMicro())
	}
	b, err := snapshot.NewBuilder(sc)
	if err != nil {
		return nil, err
	}
	x := &Index{
		interval:    cmp.Or(cfg.Interval, DefaultInterval),
		defaultCap:  cmp.Or(cfg.DefaultCapacity, DefaultCapacity),
		maxPending:  cmp.Or(cfg.MaxPending, DefaultMaxPending),
		maxReported: cmp.Or(cfg.MaxPendingHashes, DefaultMaxPendingHashes),
		onOutcome:   cfg.OnOutcome,
		onRoute:     cfg.OnRoute,
		pendingTTL:  max(cfg.PendingTTL, 0),
		now:         time.Now,
		log:         cfg.Logger,
		b:           b,
		approx:      approx.New(),
		eps:         make(map[string]*endpoint),
		rootRates:   make(map[uint64]float64),
		shares:      make(map[*endpoint]float64),
		changed:     true, // the first build publishes even an empty index
		wake:        make(chan struct{}, 1),
	}
	switch {
	case x.interval < 0:
		return nil, errors.New("index: negative interval")
	case x.defaultCap < 1 || x.defaultCap > approx.MaxCapacity:
		return nil, errors.New("index: default capacity out of range")
	case x.maxPending < 1 || x.maxReported < 1:
		return nil, errors.New("index: pending limits must be positive")
	}
	if x.log == nil {
		x.log = slog.Default()
	}
	x.stats.Store(&Stats{})
	x.m = newMetrics(x)
	if cfg.Registerer != nil {
		if err := x.m.register(cfg.Registerer); err != nil {
			return nil, err
		}
	}
	return x, nil
}

// signal wakes the builder loop; it costs an atomic load when the loop is
// already awake.
func (x *Index) signal() {
	if !x.wakeSent.Load() && x.wakeSent.CompareAndSwap(false, true) {
		select {
		case x.wake <- struct{}{}:
		default:
		}
	}
}

// ErrUnknownEndpoint reports a call naming an endpoint the index does not
// have.
var ErrUnknownEndpoint = errors.New("index: unknown endpoint")

// SetEndpoint adds the endpoint, in approximate mode with the default
// capacity, or updates what is known of it (health, models, load). An
// update that changes nothing does not cause a build. Discovery adds
// endpoints with it.
func (x *Index) SetEndpoint(info snapshot.EndpointInfo) error {
	return x.setEndpoint(info, true)
}

// UpdateEndpoint is SetEndpoint for an endpoint the index has; otherwise
// it returns ErrUnknownEndpoint. The metrics scraper updates endpoints
// with it, so that a scrape finishing after discovery removed the endpoint
// cannot bring it back.
func (x *Index) UpdateEndpoint(info snapshot.EndpointInfo) error {
	return x.setEndpoint(info, false)
}

func (x *Index) setEndpoint(info snapshot.EndpointInfo, add bool) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	ep := x.eps[info.Addr]
	if ep == nil && !add {
		return &unknownError{info.Addr}
	}
	if ep != nil && sameInfo(&ep.info, &info) {
		return nil
	}
	slot, err := x.b.SetEndpoint(info)
	if err != nil {
		return err
	}
	if ep == nil {
		ep = &endpoint{addr: info.Addr, slot: slot, mode: Approximate, capacity: x.defaultCap}
		if _, err := x.approx.SetCapacity(slot, ep.capacity, x.b); err != nil {
			x.b.RemoveEndpoint(info.Addr)
			return err
		}
		x.eps[info.Addr] = ep
		x.log.Info("endpoint added", "endpoint", info.Addr, "slot", slot)
	}
	ep.info = info
	ep.info.Models = slices.Clone(info.Models)
	ep.info.Adapters = slices.Clone(info.Adapters)
	x.touched()
	return nil
}

// SetChatTemplates replaces the chat templates the snapshot ships
// (snapshot.Builder.SetChatTemplates); the same ones again cause no build.
func (x *Index) SetChatTemplates(ts []snapshot.ChatTemplate) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	changed, err := x.b.SetChatTemplates(ts)
	if changed {
		x.touched()
	}
	return err
}

func sameInfo(a, b *snapshot.EndpointInfo) bool {
	return a.Addr == b.Addr && slices.Equal(a.Models, b.Models) && slices.Equal(a.Adapters, b.Adapters) &&
		a.Health == b.Health && a.Running == b.Running && a.Waiting == b.Waiting &&
		a.KVCacheUsage == b.KVCacheUsage && a.PrefillTokens == b.PrefillTokens &&
		a.PrefillRate == b.PrefillRate && a.Template == b.Template && a.LoadAt.Equal(b.LoadAt) && a.ShowsReports == b.ShowsReports &&
		a.IndexCapacity == b.IndexCapacity && a.Model == b.Model && slices.Equal(a.Pins, b.Pins)
}

// touched records a change; x.mu is held.
func (x *Index) touched() {
	x.changed = true
	x.signal()
}

func (x *Index) lookup(addr string) (*endpoint, error) {
	ep := x.eps[addr]
	if ep == nil {
		return nil, &unknownError{addr}
	}
	return ep, nil
}

type unknownError struct{ addr string }

func (e *unknownError) Error() string   { return ErrUnknownEndpoint.Error() + " " + e.addr }
func (e *unknownError) Is(t error) bool { return t == ErrUnknownEndpoint }

// RemoveEndpoint drops the endpoint and every entry of it, as when
// discovery loses it. Its Sinks go stale. It reports whether the endpoint
// was known.
func (x *Index) RemoveEndpoint(addr string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	ep := x.eps[addr]
	if ep == nil {
		return false
	}
	// Reports queued before the removal describe the endpoint that goes;
	// applied later they would land on one re-added at the same address.
	x.applyReports()
	x.invalidate(ep)
	if ep.mode == Approximate {
		x.approx.Forget(ep.slot)
	}
	x.b.RemoveEndpoint(addr)
	delete(x.eps, addr)
	x.touched()
	x.log.Info("endpoint removed", "endpoint", addr)
	return true
}

// invalidate drops the endpoint's queued changes and makes its Sinks stale;
// x.mu is held.
func (x *Index) invalidate(ep *endpoint) {
	ep.qmu.Lock()
	ep.epoch++
	ep.ops = nil
	ep.qmu.Unlock()
	ep.spare = nil
	x.pendingN.Add(-int64(len(ep.pending)))
	ep.pending, ep.evicted = nil, nil
}

// SetMode switches the endpoint to mode m, clearing its entries if that is
// a change. Sinks taken in precise mode go stale when it leaves it.
func (x *Index) SetMode(addr string, m Mode) error {
	if m != Approximate && m != Precise {
		return errors.New("index: unknown mode " + strconv.Itoa(int(m)))
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	ep, err := x.lookup(addr)
	if err != nil || ep.mode == m {
		return err
	}
	x.applyReports()
	x.invalidate(ep)
	if ep.mode == Approximate {
		x.approx.Forget(ep.slot)
	}
	x.b.ClearEndpoint(ep.slot)
	if m == Approximate {
		if _, err := x.approx.SetCapacity(ep.slot, ep.capacity, x.b); err != nil {
			return err
		}
	}
	ep.mode = m
	x.touched()
	x.log.Info("endpoint mode", "endpoint", addr, "mode", m.String())
	return nil
}

// Restarted empties an approximate endpoint's entries: its engine started
// again with an empty cache, and nothing but its counters says so (a
// precise endpoint's own events clear it). Precise endpoints are left as
// they are.
func (x *Index) Restarted(addr string) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	ep, err := x.lookup(addr)
	if err != nil || ep.mode != Approximate {
		return err
	}
	x.applyReports()
	x.approx.Forget(ep.slot)
	x.b.ClearEndpoint(ep.slot)
	if _, err := x.approx.SetCapacity(ep.slot, ep.capacity, x.b); err != nil {
		return err
	}
	x.touched()
	return nil
}

// SetCapacity sets how many text blocks the endpoint's approximate set
// holds (approx.Sizing converts a KV-cache size); shrinking evicts. It
// applies in approximate mode and is remembered in precise mode.
func (x *Index) SetCapacity(addr string, blocks int) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	ep, err := x.lookup(addr)
	if err != nil || ep.capacity == blocks {
		return err
	}
	if blocks < 1 || blocks > approx.MaxCapacity {
		return errors.New("index: capacity " + strconv.Itoa(blocks) + " out of range")
	}
	ep.capacity = blocks
	if ep.mode == Approximate {
		c, err := x.approx.SetCapacity(ep.slot, blocks, x.b)
		if err != nil {
			return err
		}
		x.m.evicted.Add(float64(c.Evicted))
		if c.Evicted > 0 {
			x.touched()
		}
	}
	return nil
}

// Sink returns the writer for the engine events of a precise endpoint,
// for one goroutine at a time. It goes stale, dropping what it is given,
// once the endpoint leaves precise mode or is removed, so a bridge left
// running for an old incarnation cannot write into a new one.
func (x *Index) Sink(addr string) (*Sink, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	ep, err := x.lookup(addr)
	if err != nil {
		return nil, err
	}
	if ep.mode != Precise {
		return nil, errors.New("index: endpoint " + addr + " is not in precise mode")
	}
	return &Sink{x: x, ep: ep, epoch: ep.epoch}, nil
}

// Sink queues one precise endpoint's block changes.
type Sink struct {
	x     *Index
	ep    *endpoint
	epoch uint32
}

// Add records that the engine holds block h in tier t.
func (s *Sink) Add(h uint64, t snapshot.Tier) { s.push(op{h: h, kind: opAdd, tier: t}) }

// Remove records that the engine no longer holds block h in tier t.
func (s *Sink) Remove(h uint64, t snapshot.Tier) { s.push(op{h: h, kind: opRemove, tier: t}) }

// Clear records that the engine holds nothing: it cleared its cache or
// restarted.
func (s *Sink) Clear() { s.push(op{kind: opClear}) }

func (s *Sink) push(o op) {
	ep := s.ep
	ep.qmu.Lock()
	if ep.epoch != s.epoch {
		ep.qmu.Unlock()
		s.x.m.stale.Inc()
		return
	}
	if o.kind == opClear {
		ep.ops = ep.ops[:0] // what came before is cleared anyway
	}
	ep.ops = append(ep.ops, o)
	full := len(ep.ops) >= s.x.maxPending
	ep.qmu.Unlock()
	if full {
		s.x.mu.Lock()
		s.x.applyOps(ep)
		s.x.mu.Unlock()
	}
	s.x.signal()
}

// applyOps applies the endpoint's queued changes; x.mu is held. The queue
// is double-buffered: pushes go on into the spare while the taken buffer is
// applied, so the two must never be one array.
func (x *Index) applyOps(ep *endpoint) {
	ep.qmu.Lock()
	ops := ep.ops
	if len(ops) == 0 {
		ep.qmu.Unlock()
		return
	}
	ep.ops, ep.spare = ep.spare[:0], nil
	ep.qmu.Unlock()
	// Ops are only queued in precise mode and dropped on leaving it, so
	// the slot is the endpoint's.
	confirmed := 0
	now := x.now().UnixNano()
	for _, o := range ops {
		switch o.kind {
		case opAdd:
			_ = x.b.Add(ep.slot, o.h, o.tier)
			if o.tier == snapshot.TierGPU && x.settle(ep, o.h) {
				confirmed++
			}
		case opRemove:
			_ = x.b.Remove(ep.slot, o.h, o.tier)
			if o.tier == snapshot.TierGPU {
				x.settle(ep, o.h)
				x.noteEvicted(ep, o.h, now)
			}
		case opClear:
			x.b.ClearEndpoint(ep.slot)
			x.pendingN.Add(-int64(len(ep.pending)))
			ep.pending = nil
		}
	}
	x.m.ops.Add(float64(len(ops)))
	x.m.pending.WithLabelValues("confirmed").Add(float64(confirmed))
	ep.spare = ops[:0]
	x.changed = true
}

// settle takes h out of the endpoint's pending set, where the engine's
// own event now speaks for it, and reports whether it was there; x.mu is
// held.
func (x *Index) settle(ep *endpoint, h uint64) bool {
	if _, ok := ep.pending[h]; !ok {
		return false
	}
	delete(ep.pending, h)
	x.pendingN.Add(-1)
	return true
}

// noteEvicted remembers, for the pending TTL, that ep's engine dropped h;
// x.mu is held. The set is bounded by the endpoint's capacity: past it an
// eviction goes unremembered, as it did before there was a set.
func (x *Index) noteEvicted(ep *endpoint, h uint64, now int64) {
	if x.pendingTTL == 0 {
		return
	}
	if ep.evicted == nil {
		ep.evicted = make(map[uint64]int64)
	}
	if len(ep.evicted) < ep.capacity {
		ep.evicted[h] = now + int64(x.pendingTTL)
	}
}

// addPending adds the blocks of a report naming precise endpoint ep that
// its engine does not hold yet as pending, and renews those already
// pending; x.mu is held. It returns how many it added. The pending set is
// bounded by the endpoint's capacity.
func (x *Index) addPending(ep *endpoint, hashes []uint64, now int64) int {
	expires := now + int64(x.pendingTTL)
	if ep.pending == nil {
		ep.pending = make(map[uint64]int64)
	}
	added := 0
	for _, h := range hashes {
		if _, ok := ep.pending[h]; ok {
			ep.pending[h] = expires
			continue
		}
		if len(ep.pending) >= ep.capacity || x.b.Holds(ep.slot, h, snapshot.TierGPU) {
			continue
		}
		if t, ok := ep.evicted[h]; ok && t > now {
			continue
		}
		_ = x.b.Add(ep.slot, h, snapshot.TierGPU)
		ep.pending[h] = expires
		added++
	}
	x.pendingN.Add(int64(added))
	return added
}

// PrefixWindow is how long a prefix counts in its endpoint's Prefixes after
// a report last routed a prompt of it there. A prefix that draws no
// traffic for a minute brings the endpoint no load, and a one-off prompt
// is not a prefix anyone comes back for; both stop counting even while
// the engine still holds their blocks.
const PrefixWindow = time.Minute

// MaxPrefixes bounds the prefixes counted per endpoint. Every build looks
// at each, and an endpoint drawing more distinct prefixes a minute than
// this is placed by how full its cache is (its count ties at the bound).
const MaxPrefixes = 4096

// root is one prefix's traffic to one endpoint: its rate of reports,
// decayed with PrefixWindow for its time constant, as of the last.
type root struct {
	rate float64
	last int64
}

// at returns r's rate at now.
func (r root) at(now int64) float64 {
	return r.rate * math.Exp(-float64(now-r.last)/float64(PrefixWindow))
}

// noteRoot records that a report routed a prompt whose first block is h to
// ep; x.mu is held.
func (x *Index) noteRoot(ep *endpoint, h uint64, now int64) {
	if ep.roots == nil {
		ep.roots = make(map[uint64]root)
	}
	r, ok := ep.roots[h]
	if ok || len(ep.roots) < MaxPrefixes {
		ep.roots[h] = root{rate: r.at(now) + 1, last: now}
	}
}

// countPrefixes sets every endpoint's Prefixes: the prefixes reported there
// within PrefixWindow that its index entries hold, each counted by the
// endpoint's share of its traffic among the endpoints holding it, and the
// sum rounded. A prefix spread over two engines draws half its traffic to
// each; a copy made once (a request sent elsewhere while its holder was
// busy, a warm-up) draws next to none, and counted whole it made its
// holder look one prefix fuller than it was: a new prefix then went
// elsewhere, and a pool of 16 groups split 5/4/4/3. One reported but not
// held yet (its engine's event has not come) stays, to count once it is.
// Older ones are forgotten. x.mu is held; it reports whether any changed.
func (x *Index) countPrefixes(now int64) bool {
	clear(x.rootRates)
	clear(x.shares)
	x.heldRoots = x.heldRoots[:0]
	for _, ep := range x.eps {
		for h, r := range ep.roots {
			switch {
			case r.last <= now-int64(PrefixWindow):
				delete(ep.roots, h)
			case x.b.Holds(ep.slot, h, snapshot.TierGPU) || x.b.Holds(ep.slot, h, snapshot.TierCPU):
				rate := r.at(now)
				x.rootRates[h] += rate
				x.heldRoots = append(x.heldRoots, heldRoot{ep: ep, h: h, rate: rate})
			}
		}
	}
	for _, hr := range x.heldRoots {
		x.shares[hr.ep] += hr.rate / x.rootRates[hr.h]
	}
	changed := false
	for _, ep := range x.eps {
		if x.b.SetPrefixes(ep.slot, int(math.Round(x.shares[ep]))) {
			changed = true
		}
	}
	return changed
}

// heldRoot is a prefix reported to ep that its index entries hold, with
// its rate there.
type heldRoot struct {
	ep   *endpoint
	h    uint64
	rate float64
}

// expirePending removes the pending blocks of ep that no event confirmed
// in time; x.mu is held.
func (x *Index) expirePending(ep *endpoint, now int64) {
	for h, t := range ep.evicted {
		if t <= now {
			delete(ep.evicted, h)
		}
	}
	expired := 0
	for h, t := range ep.pending {
		if t <= now {
			_ = x.b.Remove(ep.slot, h, snapshot.TierGPU)
			delete(ep.pending, h)
			expired++
		}
	}
	if expired > 0 {
		x.pendingN.Add(-int64(expired))
		x.m.pending.WithLabelValues("expired").Add(float64(expired))
		x.changed = true
	}
}

// Report queues a parsed batch of routing reports for the builder loop.
// The batch keeps its bytes. If too many hashes are queued, Report applies
// the queue itself.
func (x *Index) Report(bt report.Batch) {
	if bt.Len() == 0 {
		return
	}
	x.rmu.Lock()
	x.reports = append(x.reports, bt)
	x.rhashes += bt.NumHashes()
	full := x.rhashes >= x.maxReported
	x.rmu.Unlock()
	if full {
		x.mu.Lock()
		x.applyReports()
		x.mu.Unlock()
	}
	x.signal()
}

// applyReports applies the queued report batches; x.mu is held.
func (x *Index) applyReports() {
	x.rmu.Lock()
	batches := x.reports
	x.reports, x.rhashes = x.rspare[:0], 0
	x.rmu.Unlock()
	var applied, unknown, precise, outcomes, hashes, added, evicted, pending int
	var decided [len(report.Reasons)]uint64
	now := x.now().UnixNano()
	for i, bt := range batches {
		for e := range bt.Records() {
			if !e.IsOutcome() {
				decided[e.ReasonCode()]++
			}
			if e.IsOutcome() {
				outcomes++
				if x.onOutcome != nil {
					x.onOutcome(string(e.Endpoint()), e.Outcome())
				}
				continue
			}
			ep := x.eps[string(e.Endpoint())]
			if ep == nil {
				unknown++
				continue
			}
			if x.onRoute != nil {
				x.onRoute(e)
			}
			if e.NumHashes() > 0 {
				x.noteRoot(ep, e.Hash(0), now)
			}
			switch {
			case ep.mode != Approximate && x.pendingTTL == 0:
				precise++
				continue
			case ep.mode != Approximate:
				x.hashes = e.AppendHashes(x.hashes[:0])
				pending += x.addPending(ep, x.hashes, now)
				precise++
				continue
			}
			x.hashes = e.AppendHashes(x.hashes[:0])
			c, err := x.approx.Touch(ep.slot, x.hashes, x.b)
			if err != nil {
				// The endpoint table and the approximate sets move
				// together under x.mu; this is a bug, not input.
				x.log.Error("applying a report", "endpoint", ep.addr, "err", err)
			}
			applied++
			hashes += len(x.hashes)
			added += c.Added
			evicted += c.Evicted
		}
		batches[i] = report.Batch{} // let the body go
	}
	x.rspare = batches[:0]
	for i, n := range decided {
		x.decided[i].Add(n)
	}
	m := x.m
	m.records.WithLabelValues("applied").Add(float64(applied))
	m.records.WithLabelValues("unknown_endpoint").Add(float64(unknown))
	m.records.WithLabelValues("outcome").Add(float64(outcomes))
	m.records.WithLabelValues("precise_endpoint").Add(float64(precise))
	m.pending.WithLabelValues("added").Add(float64(pending))
	m.hashes.Add(float64(hashes))
	m.added.Add(float64(added))
	m.evicted.Add(float64(evicted))
	if added+evicted+pending > 0 {
		x.changed = true
	}
}

// Run builds snapshots until ctx is done: after a change, as soon as the
// interval since the last build has passed.
func (x *Index) Run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	// Pending blocks expire without anything else changing: while there
	// are some, the loop looks at them every second.
	sweep := time.NewTicker(time.Second)
	defer sweep.Stop()
	x.signal() // the first build
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-x.wake:
		case <-sweep.C:
			if x.pendingN.Load() == 0 {
				continue
			}
		}
		if d := time.Until(x.lastBuildTime().Add(x.interval)); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				timer.Stop()
				return nil
			case <-timer.C:
			}
		}
		// Clear the flag before taking the queues: a change queued
		// from now on wakes the loop again.
		x.wakeSent.Store(false)
		x.Publish()
	}
}

func (x *Index) lastBuildTime() time.Time {
	return x.Stats().Built
}

// Publish applies every queued change and, if anything changed since the
// last build, builds a new snapshot at once. It returns the latest image,
// nil if none was ever built. Run calls it; tests and shutdown may too.
func (x *Index) Publish() *snapshot.Image {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.applyReports()
	now := x.now().UnixNano()
	for _, ep := range x.eps {
		if ep.mode == Precise {
			x.applyOps(ep)
			x.expirePending(ep, now)
		}
	}
	if x.countPrefixes(now) {
		x.changed = true
	}
	if !x.changed {
		return x.img.Load()
	}
	start := time.Now()
	im := x.b.Build(start)
	took := time.Since(start)
	x.changed = false
	st := &Stats{
		Generation:    im.Generation(),
		Endpoints:     len(x.eps),
		Entries:       x.b.Entries(),
		ApproxEntries: x.approx.Entries(),
		Size:          im.Size(),
		BuildTime:     took,
		Built:         start,
		Builds:        x.Stats().Builds + 1,
	}
	for _, ep := range x.eps {
		if ep.mode == Precise {
			st.Precise++
		}
	}
	x.stats.Store(st)
	x.img.Store(im)
	x.m.buildTime.Observe(took.Seconds())
	return im
}

// Image returns the latest snapshot, nil before the first build.
func (x *Index) Image() *snapshot.Image { return x.img.Load() }

// Stats describes the latest build.
type Stats struct {
	Generation    uint64
	Endpoints     int // endpoints in the table
	Precise       int // of which in precise mode
	Entries       int // block hashes indexed
	ApproxEntries int // hashes held by approximate sets (each also indexed)
	Size          int // bytes of the image, all parts
	BuildTime     time.Duration
	Built         time.Time // when the build started; zero before the first
	Builds        uint64
}

// Decisions returns how many routing decisions the gateways have reported,
// by reason ("unknown" for gateways of report format 2, which do not say).
func (x *Index) Decisions() map[string]uint64 {
	out := make(map[string]uint64, len(report.Reasons))
	for i, r := range report.Reasons {
		if r == "" {
			r = "unknown"
		}
		out[r] = x.decided[i].Load()
	}
	return out
}

// Stats returns the figures of the latest build.
func (x *Index) Stats() Stats { return *x.stats.Load() }
