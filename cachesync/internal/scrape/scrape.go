// Package scrape polls each engine's Prometheus /metrics page and its
// /v1/models list, tracks the engine's health, and calibrates its prefill
// rate from the metrics (see package calibrate), for the snapshot's
// endpoint table.
//
// One poller per engine scrapes on an interval, with a timeout, while a
// shared semaphore bounds the scrapes in flight. An engine that fails
// Misses scrapes in a row turns unhealthy, and healthy again at the first
// success. Set replaces the set of engines; the pollers of engines that
// left stop at once.
package scrape

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/cachesync/internal/calibrate"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// Defaults.
const (
	DefaultInterval       = time.Second
	DefaultMisses         = 3
	DefaultModelsInterval = 30 * time.Second
	DefaultConcurrency    = 16
	// maxBody bounds a /metrics page or models list; vLLM's page is tens
	// of kilobytes.
	maxBody = 8 << 20
)

// Config sets up a Scraper.
type Config struct {
	// Interval between scrapes of one engine; 0 means DefaultInterval.
	Interval time.Duration
	// Timeout of one scrape (metrics and, when due, models); 0 means
	// Interval.
	Timeout time.Duration
	// Misses is how many scrapes in a row must fail before an engine is
	// unhealthy; 0 means DefaultMisses.
	Misses int
	// ModelsInterval is how often /v1/models is read again; 0 means
	// DefaultModelsInterval. It is also read after every recovery.
	ModelsInterval time.Duration
	// Concurrency bounds the scrapes in flight; 0 means
	// DefaultConcurrency.
	Concurrency int
	// Calibration configures each engine's prefill-rate estimator.
	Calibration calibrate.Config
	// Client sends the requests; nil means a client of its own.
	Client *http.Client
	// Now stamps scrapes for calibration; nil means time.Now. Tests
	// pass a simulated engine's clock.
	Now    func() time.Time
	Logger *slog.Logger // nil means slog.Default()
	// OnChange, if set, is called with an engine's new state after a
	// scrape changes what the snapshot would show (not the scrape time or
	// miss count). Calls come from the pollers' goroutines, concurrently.
	OnChange func(State)
}

// State is what the scraper knows about one engine.
type State struct {
	Addr   string
	Health snapshot.Health
	Kind   Kind
	// Models and Adapters are the served base models and LoRA adapters.
	Models, Adapters []string
	Running, Waiting int
	KVCacheUsage     float64
	// BlockSize, NumBlocks and KVCapacity (tokens) size the KV cache, for
	// approximate indexes; 0 when the engine does not say.
	BlockSize, NumBlocks, KVCapacity int
	// Rate is the prefill rate to publish, calibrated or default.
	Rate calibrate.Rate
	// Served counts the requests the engine has taken past their first
	// token since it started: work it did, whatever its load gauges say
	// between two scrapes.
	Served float64
	// ITLSeconds and ITLCount are the engine's inter-token latency
	// histogram's sum and count since it started.
	ITLSeconds, ITLCount float64
	// Prefilled counts the uncached prompt tokens the engine has computed
	// since it started.
	Prefilled float64
	// PromptTokens counts every prompt token the engine has taken, cached
	// or not. Like Served and ITLCount it only grows while the engine runs
	// (Prefilled, a difference of two counters the engine updates at
	// different moments, may not), so a drop in one of them means the
	// engine started again.
	PromptTokens float64
	// Misses counts the failed scrapes since the last success.
	Misses int
	// Err is the last scrape's error, "" after a success.
	Err string
	// Scraped is when the last successful scrape ended.
	Scraped time.Time
	// Slots are a llama.cpp engine's sequence slots, nil for any other
	// engine or when its /slots cannot be read.
	Slots []Slot
}

// EndpointInfo maps s onto the snapshot's endpoint row. PrefillTokens is
// the daemon's own in-flight estimate, and a draining engine's health is
// discovery's to set.
func (s State) EndpointInfo() snapshot.EndpointInfo {
	return snapshot.EndpointInfo{
		Addr:         s.Addr,
		Models:       s.Models,
		Adapters:     s.Adapters,
		Health:       s.Health,
		Running:      s.Running,
		Waiting:      s.Waiting,
		KVCacheUsage: s.KVCacheUsage,
		PrefillRate:  s.Rate.TokensPerSecond,
		LoadAt:       s.Scraped,
	}
}

// shows reports whether s and o show the same in a snapshot.
func (s *State) shows(o *State) bool {
	return s.Health == o.Health && s.Kind == o.Kind && slices.Equal(s.Models, o.Models) &&
		slices.Equal(s.Adapters, o.Adapters) && s.Running == o.Running && s.Waiting == o.Waiting &&
		s.KVCacheUsage == o.KVCacheUsage && s.BlockSize == o.BlockSize && s.NumBlocks == o.NumBlocks &&
		s.KVCapacity == o.KVCapacity && s.Rate == o.Rate && s.Served == o.Served && slices.Equal(s.Slots, o.Slots)
}

// Stats are the scraper's running totals and current counts, for export
// as Prometheus metrics.
type Stats struct {
	Scrapes       uint64  // scrapes finished, failed ones included
	Failures      uint64  // scrapes that failed
	ScrapeSeconds float64 // time spent in scrapes, in all
	HealthChanges uint64
	// Engines counts the engines by health now.
	Engines map[snapshot.Health]int
}

// Scraper polls a changing set of engines.
type Scraper struct {
	cfg Config
	log *slog.Logger
	ctx context.Context
	sem chan struct{}
	wg  sync.WaitGroup

	mu      sync.Mutex
	pollers map[string]*poller

	scrapes, failures, nanos, changes atomic.Uint64
}

// Start returns a Scraper with no engines; Set gives it some. Its pollers
// run until ctx ends.
func Start(ctx context.Context, cfg Config) (*Scraper, error) {
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = cfg.Interval
	}
	if cfg.Misses == 0 {
		cfg.Misses = DefaultMisses
	}
	if cfg.ModelsInterval == 0 {
		cfg.ModelsInterval = DefaultModelsInterval
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.Interval < 0 || cfg.Timeout < 0 || cfg.Misses < 0 || cfg.ModelsInterval < 0 || cfg.Concurrency < 0 {
		return nil, fmt.Errorf("scrape: interval %v, timeout %v, misses %d, models interval %v, concurrency %d: must not be negative",
			cfg.Interval, cfg.Timeout, cfg.Misses, cfg.ModelsInterval, cfg.Concurrency)
	}
	var err error
	if cfg.Calibration, err = cfg.Calibration.WithDefaults(); err != nil {
		return nil, fmt.Errorf("scrape: %w", err)
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: cfg.Timeout}).DialContext,
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     max(3*cfg.Interval, 30*time.Second),
		}}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Scraper{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "scrape"),
		ctx:     ctx,
		sem:     make(chan struct{}, cfg.Concurrency),
		pollers: map[string]*poller{},
	}, nil
}

// Set makes addrs (ip:port) the engines to poll: pollers start for new
// ones and stop for those left out, whose state is dropped.
func (s *Scraper) Set(addrs []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return
	}
	want := map[string]bool{}
	for _, a := range addrs {
		want[a] = true
		if s.pollers[a] != nil {
			continue
		}
		est, _ := calibrate.NewEstimator(s.cfg.Calibration) // the config was checked by Start
		ctx, cancel := context.WithCancel(s.ctx)
		p := &poller{s: s, addr: a, cancel: cancel, est: est, log: s.log.With("engine", a),
			state: State{Addr: a, Rate: est.Rate()}}
		s.pollers[a] = p
		s.wg.Add(1)
		go p.run(ctx)
	}
	for a, p := range s.pollers {
		if !want[a] {
			p.cancel()
			delete(s.pollers, a)
		}
	}
}

// States returns every engine's state, sorted by address.
func (s *Scraper) States() []State {
	s.mu.Lock()
	out := make([]State, 0, len(s.pollers))
	for _, p := range s.pollers {
		out = append(out, p.state)
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b State) int { return strings.Compare(a.Addr, b.Addr) })
	return out
}

// State returns one engine's state.
func (s *Scraper) State(addr string) (State, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.pollers[addr]; p != nil {
		return p.state, true
	}
	return State{}, false
}

// Stats returns the running totals.
func (s *Scraper) Stats() Stats {
	st := Stats{
		Scrapes:       s.scrapes.Load(),
		Failures:      s.failures.Load(),
		ScrapeSeconds: time.Duration(s.nanos.Load()).Seconds(),
		HealthChanges: s.changes.Load(),
		Engines:       map[snapshot.Health]int{},
	}
	s.mu.Lock()
	for _, p := range s.pollers {
		st.Engines[p.state.Health]++
	}
	s.mu.Unlock()
	return st
}

// Wait returns once every poller has stopped, after the context given to
// Start ends.
func (s *Scraper) Wait() { s.wg.Wait() }

// poller scrapes one engine.
type poller struct {
	s      *Scraper
	addr   string
	cancel context.CancelFunc
	log    *slog.Logger

	// Owned by the poller's goroutine.
	est           *calibrate.Estimator
	modelsAt      time.Time
	modelsFailing bool
	// props is a llama.cpp engine's /props, read with its models: its
	// metrics do not give its cache size.
	props props
	// slotsFailing: the last /slots read failed (logged once).
	slotsFailing bool

	state State // guarded by s.mu
}

func (p *poller) run(ctx context.Context) {
	defer p.s.wg.Done()
	interval := p.s.cfg.Interval
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.scrape(ctx)
		// Up to 10% jitter keeps engines found together from being
		// scraped in lockstep.
		t.Reset(interval - time.Duration(rand.Int64N(int64(interval)/10+1)))
	}
}

// scrape polls the engine once and updates its state.
func (p *poller) scrape(ctx context.Context) {
	s := p.s
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return
	}
	start := time.Now()
	s.mu.Lock()
	st := p.state
	s.mu.Unlock()
	m, err := p.fetchMetrics(ctx)
	at := s.cfg.Now()
	var models, adapters []string
	var modelsErr error
	if err == nil && (st.Models == nil || st.Health != snapshot.HealthHealthy || at.Sub(p.modelsAt) >= s.cfg.ModelsInterval) {
		models, adapters, modelsErr = p.fetchModels(ctx)
		if modelsErr == nil && m.Kind == KindLlamaCpp {
			p.props, modelsErr = p.fetchProps(ctx)
		}
	}
	var slots []Slot
	var slotsErr error
	if err == nil && m.Kind == KindLlamaCpp {
		slots, slotsErr = p.fetchSlots(ctx)
	}
	<-s.sem
	if ctx.Err() != nil {
		return // the engine left, or the daemon is stopping: not the engine's fault
	}
	s.scrapes.Add(1)
	s.nanos.Add(uint64(time.Since(start)))

	if err != nil {
		s.failures.Add(1)
		st.Misses++
		st.Err = err.Error()
		if st.Misses >= s.cfg.Misses {
			st.Health = snapshot.HealthUnhealthy
		}
		p.update(st)
		return
	}
	switch {
	case modelsErr != nil:
		if !p.modelsFailing {
			p.log.Warn("reading /v1/models failed; keeping the models last read", "models", st.Models, "err", modelsErr)
		}
		p.modelsFailing = true
	case models != nil:
		if p.modelsFailing {
			p.log.Info("read /v1/models again", "models", models)
		}
		st.Models, st.Adapters, p.modelsAt, p.modelsFailing = models, adapters, at, false
	}
	p.est.Observe(m.Observation(at))
	st.Health = snapshot.HealthHealthy
	st.Kind = m.Kind
	st.Running, st.Waiting, st.KVCacheUsage = m.Running, m.Waiting, m.KVCacheUsage
	st.BlockSize, st.NumBlocks, st.KVCapacity = m.BlockSize, m.NumBlocks, m.KVCapacity
	if m.Kind == KindLlamaCpp {
		st.KVCapacity = p.props.cacheTokens
		switch {
		case slotsErr != nil && !p.slotsFailing:
			// Started with --no-slots or without the prompts shown, say:
			// its requests are routed without naming a slot.
			p.log.Info("reading the prompts of the engine's slots failed; routing to it without naming them", "err", slotsErr)
		case slotsErr == nil && p.slotsFailing:
			p.log.Info("read /slots again")
		}
		p.slotsFailing = slotsErr != nil
		st.Slots = slots
	}
	st.Rate = p.est.Rate()
	st.Served = m.Requests
	st.ITLSeconds, st.ITLCount = m.ITLSeconds, m.ITLCount
	st.Prefilled = max(0, m.PromptTokens-m.CachedTokens)
	st.PromptTokens = m.PromptTokens
	st.Misses, st.Err, st.Scraped = 0, "", at
	p.update(st)
}

// update publishes a new state, unless the engine has left.
func (p *poller) update(st State) {
	s := p.s
	s.mu.Lock()
	if s.pollers[p.addr] != p {
		s.mu.Unlock()
		return
	}
	old := p.state
	p.state = st
	s.mu.Unlock()

	if old.Health != st.Health {
		s.changes.Add(1)
		switch st.Health {
		case snapshot.HealthUnhealthy:
			p.log.Warn("engine unhealthy", "misses", st.Misses, "err", st.Err)
		case snapshot.HealthHealthy:
			p.log.Info("engine healthy", "kind", st.Kind, "models", st.Models, "adapters", st.Adapters)
		}
	}
	if old.Rate.Calibrated != st.Rate.Calibrated || (st.Rate.Calibrated && changedMuch(old.Rate.TokensPerSecond, st.Rate.TokensPerSecond)) {
		p.log.Info("prefill rate", "tokens_per_second", int(st.Rate.TokensPerSecond), "calibrated", st.Rate.Calibrated)
	}
	if s.cfg.OnChange != nil && !old.shows(&st) {
		s.cfg.OnChange(st)
	}
}

// changedMuch reports a change of more than 5%, worth a log line.
func changedMuch(a, b float64) bool { return b > a*1.05 || b < a*0.95 }

func (p *poller) get(ctx context.Context, path, accept string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, p.s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", accept)
	resp, err := p.s.cfg.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("GET %s: %w", path, err)
	case resp.StatusCode != http.StatusOK:
		// The body often says what to fix (llama-server: "Start it with
		// `--metrics`").
		return nil, fmt.Errorf("GET %s: %s: %s", path, resp.Status, excerpt(body))
	case len(body) > maxBody:
		return nil, fmt.Errorf("GET %s: response over %d bytes", path, maxBody)
	}
	return body, nil
}

func (p *poller) fetchMetrics(ctx context.Context) (Metrics, error) {
	// Ask for the text format: the protobuf and OpenMetrics formats
	// parse differently.
	body, err := p.get(ctx, "/metrics", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	if err != nil {
		return Metrics{}, err
	}
	m, err := Parse(body)
	if err != nil {
		return Metrics{}, fmt.Errorf("GET /metrics: %w", err)
	}
	return m, nil
}

// fetchProps reads a llama-server's /props: its slots, and the context
// each slot holds, which together are its KV cache in tokens.
func (p *poller) fetchProps(ctx context.Context) (props, error) {
	body, err := p.get(ctx, "/props", "application/json")
	if err != nil {
		return props{}, err
	}
	return parseProps(body)
}

func (p *poller) fetchModels(ctx context.Context) ([]string, []string, error) {
	body, err := p.get(ctx, "/v1/models", "application/json")
	if err != nil {
		return nil, nil, err
	}
	return parseModels(body)
}
