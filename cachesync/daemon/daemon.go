// Package daemon assembles cachesync: engine discovery, metric scraping and
// calibration, the precise index from KV events, the approximate index from
// gateway reports, and the snapshot service, with their metrics and a
// graceful shutdown.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kvroute/kvroute/cachesync/internal/bridge"
	"github.com/kvroute/kvroute/cachesync/internal/demand"
	"github.com/kvroute/kvroute/cachesync/internal/discovery"
	"github.com/kvroute/kvroute/cachesync/internal/index"
	"github.com/kvroute/kvroute/cachesync/internal/kvevents"
	"github.com/kvroute/kvroute/cachesync/internal/planner"
	"github.com/kvroute/kvroute/cachesync/internal/scrape"
	"github.com/kvroute/kvroute/cachesync/internal/service"
	"github.com/kvroute/kvroute/cachesync/internal/tokenbytes"
	"github.com/kvroute/kvroute/cachesync/internal/vocab"
	"github.com/kvroute/kvroute/shared/approx"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/report"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// Daemon is a configured cachesync, listening but not yet running.
type Daemon struct {
	cfg     Config
	log     *slog.Logger
	reg     *prometheus.Registry
	ix      *index.Index
	svc     *service.Server
	ln      net.Listener
	vocab   *vocab.Vocab
	source  discovery.Source
	customs []*prompt.Jinja // -chat-template-file

	scrapes       chan scrape.State
	discovered    chan struct{}
	checks        chan checkResult // finished template checks
	http          *http.Client     // for template checks
	gatewayWindow time.Duration
	// warnedTemplates is the set of differing gateway templates last
	// warned about.
	warnedTemplates []prompt.Template
	// warnedCustom is the unknown custom template last warned about.
	warnedCustom string
	// warnedShip is the last error shipping templates, once logged.
	warnedShip string

	mu      sync.Mutex // guards engines and scraper for the metrics collector
	engines map[string]*engine
	scraper *scrape.Scraper
	gone    engineStats // counters of engines removed, so totals never fall

	// listeners are the bound sockets of engines whose publishers connect,
	// by endpoint; they live as long as Run.
	listeners map[string]*kvevents.Listener
	// silence is eventSilence, shorter in tests.
	silence time.Duration
	// tokenPoll is tokenFilePoll, shorter in tests; tokenFile is the token
	// file's contents as last read.
	tokenPoll  time.Duration
	tokenFile  []byte
	models     *models
	demand     *demand.Tracker
	tokenBytes *tokenbytes.Estimator // learns bytes per token
	// learned is the bytes per token last logged per model; guarded by mu.
	learned map[string]float64
	planner *planner.Planner // guarded by mu
	moves   uint64           // groups moved; guarded by mu
}

// maxDecodePrefill is the largest share of its prefill rate an engine may
// have prefilled in a scrape interval whose inter-token latency counts for
// its decode fit.
const maxDecodePrefill = 0.1

// itlClean is how many later scrape intervals must also have prefilled
// little before an interval's inter-token latency counts. An engine counts
// a prompt's tokens when its prefill ends, so a prefill shows in the
// interval it ends in, while its steps, each stalling every decode in the
// batch, ran in the intervals before: a 7,000-token prompt at 20,000
// tokens/s is 350 ms of steps, two 250 ms scrapes. Counted at once, those
// stalled intervals fitted b2b-saas's warm-up an ITL of 31-55 ms at an idle
// batch (the engines' own is 17-20 ms) and a slope twice the truth; the
// policy, pricing 200 output tokens at it, copied prefixes to idle engines.
const itlClean = 2

// refitInterval is how often the engines' latency fits are republished.
const refitInterval = time.Second

// eventSilence is how long an engine configured for KV events may serve
// requests without sending one before cachesync says so: every request
// an engine serves with prefix caching on stores or reuses blocks.
const eventSilence = 30 * time.Second

// engine is the daemon's state for one discovered engine.
type engine struct {
	d       discovery.Engine
	precise bool // indexed from KV events
	started bool // its event bridges run
	last    scrape.State
	scraped bool
	// capacity is the engine's cache in the index's text blocks; 0 unknown.
	capacity int
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	subs     []*kvevents.Subscriber
	bridges  []*bridge.Engine
	// When its events started and how many requests it had served then;
	// silent is set once the engine has served requests for eventSilence
	// without a batch, and logged.
	eventsFrom time.Time
	servedFrom float64
	silent     bool
	template   templateState
	// decode holds the ITL samples of its last scrape intervals until
	// they are known to be clean (itlClean).
	decode []itlSample
	slots  engineSlots
}

// itlSample is one scrape interval's mean inter-token latency and batch,
// and how many clean intervals have followed it.
type itlSample struct {
	running, seconds float64
	after            int
}

// New builds the daemon's components and opens its listener.
func New(cfg Config, log *slog.Logger) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Daemon{
		cfg: cfg, log: log, reg: prometheus.NewRegistry(),
		scrapes: make(chan scrape.State, 256), discovered: make(chan struct{}),
		checks: make(chan checkResult, 16), http: newCheckClient(), gatewayWindow: gatewayWindow,
		engines: map[string]*engine{}, listeners: map[string]*kvevents.Listener{}, silence: eventSilence,
		tokenPoll: tokenFilePoll,
	}
	d.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	d.models = newModels(d.reg, d.log)
	d.demand = demand.New(demand.Config{})
	d.tokenBytes, d.learned = tokenbytes.New(tokenbytes.Config{}), map[string]float64{}
	d.planner = planner.New(planner.Config{Cooldown: cfg.MoveCooldown})
	if cfg.Tokenizer != "" {
		v, err := vocab.Load(cfg.Tokenizer)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
		d.vocab = v
		log.Info("precise index enabled", "tokenizer", v.Name(), "tokens", v.Len())
	} else {
		log.Info("no tokenizer configured: every engine is indexed from gateway reports (approximate)")
	}
	var err error
	if d.source, err = cfg.source(log); err != nil {
		return nil, err
	}
	if d.ix, err = index.New(index.Config{Interval: cfg.SyncInterval, PendingTTL: cfg.PendingTTL, Snapshot: snapshot.BuilderConfig{BytesPerToken: cfg.BytesPerToken},
		OnOutcome: d.models.outcome, OnRoute: func(e report.Entry) {
			d.demand.Record(e, time.Now())
			d.tokenBytes.Routed(string(e.Endpoint()), e.Bytes())
		},
		Registerer: d.reg, Logger: log}); err != nil {
		return nil, err
	}
	var fileTokens []string
	if cfg.ReportTokenFile != "" {
		if fileTokens, d.tokenFile, err = readTokens(cfg.ReportTokenFile); err != nil {
			return nil, err
		}
	}
	tokens := d.tokens(fileTokens)
	for _, p := range cfg.chatTemplateFiles() {
		j, err := loadTemplate(p)
		if err != nil {
			return nil, fmt.Errorf("chat-template-file: %w", err)
		}
		d.customs = append(d.customs, j)
		log.Info("custom chat template loaded", "file", p, "name", j.Name())
	}
	if p := besideTokenizer(cfg.Tokenizer); len(d.customs) == 0 && p != "" {
		// The model's own template, which engines render with unless told
		// otherwise. One kvroute cannot evaluate is no reason not to start:
		// its engines are then checked against the named templates only.
		if j, err := loadTemplate(p); err != nil {
			log.Warn("the chat template beside the tokenizer cannot be used; engines rendering with it are routed approximately", "file", p, "err", err)
		} else {
			d.customs = append(d.customs, j)
			log.Info("chat template beside the tokenizer loaded", "file", p, "name", j.Name())
		}
	}
	if d.svc, err = service.New(service.Config{
		Index: d.ix, Tokens: tokens, Registry: d.reg, Discovered: d.discovered, Logger: log, Notes: d.templateNotes,
		Engines: d.engineStatus, ReportLimits: reportLimits(cfg), Peers: cfg.peers(), CustomTemplates: d.customNames(),
	}); err != nil {
		return nil, err
	}
	if len(tokens) == 0 {
		log.Warn("no report token: POST /v1/reports is disabled, so approximate engines learn nothing, and the snapshot is open to anyone who reaches the port")
	}
	d.reg.MustRegister(&collector{d: d})
	if d.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	return d, nil
}

// Addr is the address the API listens on.
func (d *Daemon) Addr() string { return d.ln.Addr().String() }

// Run runs the daemon until ctx ends, then shuts everything down.
func (d *Daemon) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 3)
	run := func(name string, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil && !errors.Is(err, context.Canceled) {
				errc <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		}()
	}
	for _, ep := range d.cfg.Events.ListenEndpoints() {
		if _, err := d.listener(ctx, ep); err != nil {
			return err
		}
	}
	run("index", d.ix.Run)
	if d.cfg.ReportTokenFile != "" {
		run("report token file", func(ctx context.Context) error { return d.watchTokens(ctx, d.tokenFile) })
	}
	run("api", func(ctx context.Context) error { return d.svc.Serve(ctx, d.ln) })
	scraper, err := scrape.Start(ctx, scrape.Config{
		Interval: d.cfg.ScrapeInterval, Misses: d.cfg.ScrapeMisses, Calibration: d.cfg.Calibration,
		Logger: d.log, OnChange: d.onScrape,
	})
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.scraper = scraper
	d.mu.Unlock()
	sets := make(chan []discovery.Engine)
	run("discovery", func(ctx context.Context) error { return d.source.Run(ctx, sets) })
	d.log.Info("cachesync running", "listen", d.Addr())

	// Outcome reports move the latency fits between scrapes, and an idle
	// engine's scrapes change nothing: the fits are republished on a
	// clock of their own.
	refit := time.NewTicker(refitInterval)
	defer refit.Stop()
	first := true
loop:
	for {
		select {
		case <-refit.C:
			d.models.freeze()
			d.mu.Lock()
			if d.cfg.MoveGroups {
				d.plan(time.Now())
			}
			for _, e := range d.engines {
				if e.scraped {
					d.update(e)
					d.maybeCheck(ctx, e, e.last.Models)
				}
			}
			d.mu.Unlock()
			d.rejudge(ctx)
		case set := <-sets:
			d.reconcile(ctx, scraper, set)
			if first {
				first = false
				close(d.discovered)
			}
		case st := <-d.scrapes:
			d.applyScrape(ctx, st)
		case res := <-d.checks:
			d.applyCheck(ctx, res)
		case <-ctx.Done():
			break loop
		}
	}
	d.mu.Lock()
	for _, e := range d.engines {
		d.stop(e)
	}
	d.mu.Unlock()
	scraper.Wait()
	wg.Wait()
	d.log.Info("cachesync stopped")
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// onScrape runs on the scraper's goroutines; the state is applied on the
// daemon's loop, which owns the engines.
func (d *Daemon) onScrape(st scrape.State) { d.scrapes <- st }

// reconcile applies a new set of engines from discovery.
func (d *Daemon) reconcile(ctx context.Context, scraper *scrape.Scraper, set []discovery.Engine) {
	d.mu.Lock()
	defer d.mu.Unlock()
	seen := make(map[string]bool, len(set))
	addrs := make([]string, 0, len(set))
	for _, de := range set {
		seen[de.Addr] = true
		addrs = append(addrs, de.Addr)
		e, ok := d.engines[de.Addr]
		if !ok {
			d.add(de)
			continue
		}
		if e.d.Draining != de.Draining {
			e.d.Draining = de.Draining
			d.log.Info("engine draining changed", "engine", de.Addr, "draining", de.Draining)
			if e.scraped {
				d.update(e)
			} else if de.Draining {
				d.ix.UpdateEndpoint(snapshot.EndpointInfo{Addr: de.Addr, Health: snapshot.HealthDraining})
			}
		}
	}
	for addr, e := range d.engines {
		if !seen[addr] {
			d.stop(e)
			d.gone.add(e.stats())
			delete(d.engines, addr)
			d.ix.RemoveEndpoint(addr)
			d.models.forget(addr)
			d.demand.Forget(addr)
			d.tokenBytes.Forget(addr)
			d.log.Info("engine removed", "engine", addr)
		}
	}
	scraper.Set(addrs)
}

func (d *Daemon) add(de discovery.Engine) {
	e := &engine{d: de, precise: d.vocab != nil && len(de.Events) > 0}
	d.engines[de.Addr] = e
	d.models.add(de.Addr)
	health := snapshot.HealthUnknown
	if de.Draining {
		health = snapshot.HealthDraining
	}
	if err := d.ix.SetEndpoint(snapshot.EndpointInfo{Addr: de.Addr, Health: health}); err != nil {
		d.log.Error("engine rejected", "engine", de.Addr, "err", err)
		delete(d.engines, de.Addr)
		return
	}
	mode := index.Approximate
	if e.precise {
		mode = index.Precise
	}
	if err := d.ix.SetMode(de.Addr, mode); err != nil {
		d.log.Error("set index mode", "engine", de.Addr, "err", err)
	}
	d.log.Info("engine added", "engine", de.Addr, "name", de.Name, "mode", mode.String(), "event_ranks", len(de.Events))
}

// applyScrape publishes an engine's scraped state and, once its served model
// is known, starts its event bridges.
func (d *Daemon) applyScrape(ctx context.Context, st scrape.State) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.engines[st.Addr]
	if !ok {
		return
	}
	d.models.place(st.Addr, st.Models, st.KVCapacity)
	// A scrape interval's mean inter-token latency against the batch the
	// engine ran: the decode half of its latency model. Only intervals
	// in which it spent at most a tenth of its time prefilling count: a
	// step with a prefill chunk takes as long as the chunk, and a fit of
	// those would blame prefill on the batch size.
	if e.scraped {
		e.cleanITL(&e.last, &st, func(s itlSample) { d.models.itl(st.Addr, s.running, s.seconds) })
	}
	if e.scraped && restarted(&e.last, &st) {
		// Counters since the engine started went backwards: it started
		// again, with an empty cache. Reports taught the index what it
		// held before (events say so themselves).
		d.log.Info("engine restarted", "engine", st.Addr)
		if err := d.ix.Restarted(st.Addr); err != nil && !errors.Is(err, index.ErrUnknownEndpoint) {
			d.log.Warn("forget a restarted engine's entries", "engine", st.Addr, "err", err)
		}
	}
	rateMoved := !e.scraped || e.last.Rate != st.Rate
	e.last, e.scraped = st, true
	if rateMoved {
		// Uncalibrated peers publish this engine's deployment's rate.
		for _, a := range d.models.peers(st.Addr) {
			if o := d.engines[a]; o != nil && o.scraped && !o.last.Rate.Calibrated {
				d.update(o)
			}
		}
	}
	if st.Health == snapshot.HealthHealthy && len(st.Models) > 0 {
		d.tokenBytes.Counted(st.Addr, st.Models[0], st.PromptTokens, st.Scraped)
	}
	if st.KVCapacity > 0 {
		e.capacity = approx.Sizing{BytesPerToken: d.bytesPerToken(st.Models), BlockBytes: d.cfg.Hash.BlockSize}.Blocks(int64(st.KVCapacity))
		if err := d.ix.SetCapacity(st.Addr, e.capacity); err != nil && !errors.Is(err, index.ErrUnknownEndpoint) {
			d.log.Warn("set approximate capacity", "engine", st.Addr, "err", err)
		}
	}
	d.update(e)
	if e.precise && !e.started && len(st.Models) > 0 {
		d.startEvents(ctx, e, st)
	}
	if e.started && !e.silent && e.subs != nil {
		d.checkSilence(e, st)
	}
}

// checkSilence warns, once, about an engine that serves requests but sends
// no KV events: its routing silently degrades to load alone. An idle
// engine sends none and is not warned about.
func (d *Daemon) checkSilence(e *engine, st scrape.State) {
	if st.Served <= e.servedFrom || time.Since(e.eventsFrom) < d.silence {
		return
	}
	for _, sub := range e.subs {
		if sub.Stats().Batches > 0 {
			return
		}
	}
	e.silent = true
	hint := "its publisher binds (an endpoint with * or ::): check the port, or whether it connects elsewhere"
	if e.d.Events[0].Listen {
		hint = "its publisher must connect to this endpoint (an endpoint naming cachesync's host) with a topic kv@<its ip>@<model>"
	}
	d.log.Warn("engine serves requests but has sent no KV events; it is routed by load alone",
		"engine", e.d.Addr, "events", e.d.Events[0].Pub, "listen", e.d.Events[0].Listen,
		"served", st.Served-e.servedFrom, "for", time.Since(e.eventsFrom).Round(time.Second), "hint", hint)
}

// listener returns the bound socket for publishers connecting to endpoint,
// binding it on first use.
func (d *Daemon) listener(ctx context.Context, endpoint string) (*kvevents.Listener, error) {
	if l := d.listeners[endpoint]; l != nil {
		return l, nil
	}
	l, err := kvevents.Listen(ctx, endpoint, d.cfg.Topic, d.log)
	if err != nil {
		return nil, fmt.Errorf("events-listen: %w", err)
	}
	d.listeners[endpoint] = l
	d.log.Info("listening for KV-event publishers that connect", "endpoint", endpoint, "addr", l.Addr())
	return l, nil
}

// update publishes e's last scrape, with discovery's draining on top and
// its cache capacity and latency model.
func (d *Daemon) update(e *engine) {
	info := e.last.EndpointInfo()
	if r, ok := d.peerRate(e); ok {
		info.PrefillRate = r
	}
	info.IndexCapacity = e.capacity
	info.Template = e.template.renders
	info.ShowsReports = !e.precise || d.cfg.PendingTTL > 0
	info.Model = d.models.model(e.d.Addr, max(info.PrefillRate, 1))
	info.Slots = e.slots.update(&e.last, d.cfg.Hash)
	info.Pins = d.planner.Pins(e.d.Addr)
	if e.d.Draining {
		info.Health = snapshot.HealthDraining
	}
	if err := d.ix.UpdateEndpoint(info); err != nil && !errors.Is(err, index.ErrUnknownEndpoint) {
		d.log.Warn("update endpoint", "engine", e.d.Addr, "err", err)
	}
}

// cleanITL takes the scrape interval from prev to st and calls fit with
// each decode sample now known clean: its interval and the itlClean after
// it prefilled little.
func (e *engine) cleanITL(prev, st *scrape.State, fit func(itlSample)) {
	dt := st.Scraped.Sub(prev.Scraped).Seconds()
	prefilled := st.Prefilled - prev.Prefilled
	if !(dt > 0 && prefilled >= 0 && prefilled/dt <= maxDecodePrefill*max(st.Rate.TokensPerSecond, 1)) {
		e.decode = e.decode[:0] // a prefill ended: the intervals before ran its steps
		return
	}
	kept := e.decode[:0]
	for _, s := range e.decode {
		if s.after++; s.after >= itlClean {
			fit(s)
		} else {
			kept = append(kept, s)
		}
	}
	e.decode = kept
	if st.ITLCount > prev.ITLCount && st.ITLSeconds >= prev.ITLSeconds {
		mean := (st.ITLSeconds - prev.ITLSeconds) / (st.ITLCount - prev.ITLCount)
		e.decode = append(e.decode, itlSample{running: float64(st.Running+prev.Running) / 2, seconds: mean})
	}
}

// tokenRatio returns the text bytes per token model's approximate indexes
// are sized by, and whether it is learned (else it is -bytes-per-token).
func (d *Daemon) tokenRatio(model string) (float64, bool) {
	if d.cfg.LearnBytesPerToken {
		if r, ok := d.tokenBytes.Ratio(model); ok {
			return r, true
		}
	}
	return d.cfg.BytesPerToken, false
}

// bytesPerToken returns tokenRatio for an engine serving models, and logs
// a learned ratio when it is first learned or has moved by a tenth since
// it was last logged. With d.mu held.
func (d *Daemon) bytesPerToken(models []string) float64 {
	if len(models) == 0 {
		return d.cfg.BytesPerToken
	}
	r, learned := d.tokenRatio(models[0])
	if last := d.learned[models[0]]; learned && math.Abs(r-last) > last/10 {
		d.learned[models[0]] = r
		d.log.Info("learned bytes per token", "model", models[0], "bytes_per_token", math.Round(r*100)/100, "was", last)
	}
	return r
}

// restarted reports whether an engine's healthy scrape st shows it started
// again since prev: a counter that only grows while it runs went back.
// Not the uncached prompt tokens: the engine counts cache hits when it
// schedules a prompt and prompt tokens when its prefill ends, so their
// difference shrinks now and then under load, and taking that for a
// restart emptied approximate engines' entries every few seconds.
func restarted(prev, st *scrape.State) bool {
	return st.Health == snapshot.HealthHealthy &&
		(st.PromptTokens < prev.PromptTokens || st.Served < prev.Served || st.ITLCount < prev.ITLCount)
}

// peerRate is the prefill rate to publish for e while it is not
// calibrated: the median of the calibrated rates of its deployment's other
// engines (same model, same KV-cache size: the same accelerator, in all
// likelihood). An engine that has served too little to calibrate would
// otherwise go out at the configured default, which may be far from its
// peers' (a CPU engine's rate is some 60 times below the GPU default), and
// look much cheaper or dearer than they do. With d.mu held.
func (d *Daemon) peerRate(e *engine) (float64, bool) {
	if e.last.Rate.Calibrated {
		return 0, false
	}
	var rates []float64
	for _, a := range d.models.peers(e.d.Addr) {
		if o := d.engines[a]; o != nil && o.scraped && o.last.Rate.Calibrated {
			rates = append(rates, o.last.Rate.TokensPerSecond)
		}
	}
	if len(rates) == 0 {
		return 0, false
	}
	slices.Sort(rates)
	return rates[len(rates)/2], true
}

// startEvents subscribes to each rank's KV events through a bridge into the
// engine's precise index entries.
func (d *Daemon) startEvents(ctx context.Context, e *engine, st scrape.State) {
	e.started = true
	sink, err := d.ix.Sink(e.d.Addr)
	if err != nil {
		d.log.Error("precise index sink", "engine", e.d.Addr, "err", err)
		return
	}
	var sinks func(int) bridge.Sink
	if len(e.d.Events) == 1 {
		sinks = func(int) bridge.Sink { return sink }
	} else {
		sinks = newRanks(sink, len(e.d.Events)).rank
	}
	runCtx := ctx
	ctx, e.cancel = context.WithCancel(ctx)
	e.eventsFrom, e.servedFrom = time.Now(), st.Served
	model := st.Models[0]
	capacity := 0
	if st.NumBlocks > 0 {
		// A CPU tier, if any, is not in the metrics; leave it room.
		capacity = 2 * st.NumBlocks
	}
	for i, ev := range e.d.Events {
		log := d.log.With("engine", e.d.Addr, "rank", ev.Rank)
		br, err := bridge.New(bridge.Config{Model: model, Vocab: d.vocab, Hash: d.cfg.Hash, Capacity: capacity, Logger: log}, sinks(i))
		cfg := kvevents.Config{Endpoint: ev.Pub, ReplayEndpoint: ev.Replay, Topic: d.cfg.Topic, Logger: log}
		if err == nil && ev.Listen {
			cfg.Engine = e.d.Addr
			cfg.Listener, err = d.listener(runCtx, ev.Pub)
		}
		if err == nil {
			var sub *kvevents.Subscriber
			sub, err = kvevents.New(cfg, br)
			if err == nil {
				e.bridges = append(e.bridges, br)
				e.subs = append(e.subs, sub)
				e.wg.Add(1)
				go func() {
					defer e.wg.Done()
					if err := sub.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
						log.Error("KV events stopped", "err", err)
					}
				}()
				continue
			}
		}
		log.Error("cannot follow KV events; indexing the engine from reports instead", "err", err)
		d.stop(e)
		e.precise = false
		d.ix.SetMode(e.d.Addr, index.Approximate)
		return
	}
	d.log.Info("following KV events", "engine", e.d.Addr, "model", model, "ranks", len(e.d.Events))
}

func (d *Daemon) stop(e *engine) {
	if e.cancel != nil {
		e.cancel()
		e.wg.Wait()
		e.cancel = nil
	}
}

// source builds the configured discovery source.
func (c *Config) source(log *slog.Logger) (discovery.Source, error) {
	switch {
	case c.Engines != "":
		es, err := discovery.ParseStatic(c.Engines, c.Events)
		if err != nil {
			return nil, err
		}
		return &discovery.Static{Engines: es}, nil
	case c.DNSName != "":
		return &discovery.DNS{Name: c.DNSName, Port: c.DNSPort, Events: c.Events, Logger: log}, nil
	}
	var rc *rest.Config
	var err error
	if c.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes configuration: %w", err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	if c.K8sInferencePool != "" {
		dyn, err := dynamic.NewForConfig(rc)
		if err != nil {
			return nil, fmt.Errorf("kubernetes client: %w", err)
		}
		ns, name, _ := strings.Cut(c.K8sInferencePool, "/")
		return &discovery.InferencePool{Dynamic: dyn, Client: client, Namespace: ns, Name: name, Events: c.Events, Logger: log}, nil
	}
	ns, name, _ := strings.Cut(c.K8sService, "/")
	return &discovery.Kubernetes{Client: client, Namespace: ns, Service: name, PortName: c.K8sPort, Events: c.Events, Logger: log}, nil
}
