package daemon

import (
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/cachesync/internal/fit"
	"github.com/kvroute/kvroute/cachesync/internal/pace"
	"github.com/kvroute/kvroute/shared/predict"
	"github.com/kvroute/kvroute/shared/report"
)

// models fits the engines' latency models (shared/predict): time to first
// token from the gateways' outcome reports, inter-token latency from each
// engine's own histogram against its batch. Engines serving the same model
// on the same KV-cache size are taken to be one deployment on one kind of
// accelerator and share a fit: it learns from all of them at once, and the
// policy compares them by their load, not by the noise of separate fits.
// It also measures the prediction error the gateways saw.
type models struct {
	mu    sync.Mutex
	group map[string]string // engine address -> its deployment's key; "" until scraped
	fits  map[string]*fit.Model
	// published are the fits as of the last freeze, which every engine's
	// snapshot row carries until the next: rows are rewritten one by one,
	// as their engines are scraped, and a live fit would give two engines
	// of one deployment different models for up to a refit interval. The
	// ITL fit crossing predict.MinSamples did so on every b2b-saas warm-up:
	// one engine's row at the default 10 ms, another's at the fitted 17 ms,
	// a difference the policy priced at 1.4 s over 200 output tokens and
	// copied a prefix for.
	published map[string]fit.Model
	// base is each engine's model as its row last carried it before its
	// pace scaled it, resolved against its default: what its deployment
	// predicts for it, which its observed ITL is paced against once the
	// ITL fit is used (a default is a guess, wrong for every engine alike,
	// and with no peer's samples to cancel it would be blamed on one).
	base  map[string]predict.Model
	paces map[string]*pace.Engine
	// slowed are the engines logged as slowed: from a factor of
	// logSlowed until it is back to 1, so that a pace at the band's edge
	// does not log at every scrape.
	slowed map[string]bool
	log    *slog.Logger
	recent []float64 // the last relative TTFT errors, for the median
	next   int

	errs  prometheus.Histogram
	mdape prometheus.GaugeFunc
}

// logSlowed is the slowdown factor from which an engine is logged as slow.
const logSlowed = 1.1

// recentErrors is how many outcomes the median error covers.
const recentErrors = 1024

func newModels(reg prometheus.Registerer, log *slog.Logger) *models {
	m := &models{group: map[string]string{}, fits: map[string]*fit.Model{}, published: map[string]fit.Model{},
		base: map[string]predict.Model{}, paces: map[string]*pace.Engine{}, slowed: map[string]bool{}, log: log}
	m.errs = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "kvroute_cachesync", Name: "ttft_prediction_error_ratio",
		Help:    "|predicted - observed| / observed time to first token of routed requests, as the gateways report them.",
		Buckets: []float64{0.05, 0.1, 0.15, 0.25, 0.5, 1, 2, 5},
	})
	m.mdape = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "kvroute_cachesync", Name: "ttft_prediction_median_error_ratio",
		Help: "Median |predicted - observed| / observed TTFT over the last 1,024 routed requests.",
	}, m.median)
	reg.MustRegister(m.errs, m.mdape)
	return m
}

// deployment names the fit an engine shares: its first served model and
// its KV-cache size in tokens.
func deployment(models []string, kvTokens int) string {
	if len(models) == 0 {
		return ""
	}
	return models[0] + "|" + strconv.Itoa(kvTokens)
}

// fitOf returns addr's fit, nil while its deployment is unknown; m.mu is
// held.
func (m *models) fitOf(addr string) *fit.Model {
	g := m.group[addr]
	if g == "" {
		return nil
	}
	f := m.fits[g]
	if f == nil {
		f = new(fit.Model)
		m.fits[g] = f
	}
	return f
}

// outcome takes one outcome record (the index's builder loop calls it).
func (m *models) outcome(addr string, o report.Outcome) {
	if !(o.Observed > 0) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.fitOf(addr)
	if f == nil {
		return // not an engine this cachesync follows, or not scraped yet
	}
	f.AddTTFT(o.Features, o.Observed)
	if o.Predicted > 0 {
		e := abs(o.Predicted-o.Observed) / o.Observed
		m.errs.Observe(e)
		if len(m.recent) < recentErrors {
			m.recent = append(m.recent, e)
		} else {
			m.recent[m.next] = e
			m.next = (m.next + 1) % recentErrors
		}
	}
}

// itl takes a scrape interval's mean inter-token latency, in which the
// engine mostly decoded.
func (m *models) itl(addr string, running, seconds float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f := m.fitOf(addr); f != nil {
		f.AddITL(running, seconds)
	}
	if b, ok := m.base[addr]; ok && b.ITLSamples >= predict.MinSamples {
		m.paceOf(addr).Add(seconds/b.ITL(running), time.Now())
	}
}

// paceOf returns addr's pace; m.mu is held.
func (m *models) paceOf(addr string) *pace.Engine {
	p := m.paces[addr]
	if p == nil {
		p = new(pace.Engine)
		m.paces[addr] = p
	}
	return p
}

// slowdownLocked returns how much slower than its deployment's other
// engines addr decodes (pace.Slowdown); m.mu is held.
func (m *models) slowdownLocked(addr string) float64 {
	own := m.paces[addr]
	g := m.group[addr]
	if own == nil || g == "" {
		return 1
	}
	var peers []*pace.Engine
	for a, ag := range m.group {
		if p := m.paces[a]; ag == g && a != addr && p != nil {
			peers = append(peers, p)
		}
	}
	return pace.Slowdown(own, peers, time.Now())
}

// slowdown is slowdownLocked for the metrics.
func (m *models) slowdown(addr string) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.slowdownLocked(addr)
}

// add starts following an engine, whose deployment is known once it is
// scraped (place); forget stops.
func (m *models) add(addr string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.group[addr]; !ok {
		m.group[addr] = ""
	}
}

// place records the deployment a scrape found the engine serving.
func (m *models) place(addr string, models []string, kvTokens int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.group[addr]; ok {
		m.group[addr] = deployment(models, kvTokens)
	}
}

// deploymentOf returns addr's deployment, "" until it is known.
func (m *models) deploymentOf(addr string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.group[addr]
}

// peers returns the other engines of addr's deployment, once it is known.
func (m *models) peers(addr string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.group[addr]
	if g == "" {
		return nil
	}
	var out []string
	for a, ag := range m.group {
		if ag == g && a != addr {
			out = append(out, a)
		}
	}
	return out
}

func (m *models) forget(addr string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.group, addr)
	delete(m.base, addr)
	delete(m.paces, addr)
	delete(m.slowed, addr)
	// A deployment's fit outlives its engines only while some engine
	// still shares it.
	live := make(map[string]bool, len(m.group))
	for _, g := range m.group {
		live[g] = true
	}
	for g := range m.fits {
		if !live[g] {
			delete(m.fits, g)
		}
	}
}

// freeze publishes every deployment's fit as it stands (see published).
func (m *models) freeze() {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.published)
	for g, f := range m.fits {
		m.published[g] = *f
	}
}

// model returns the engine's published model, held near the default for
// its prefill rate, its ITL scaled by how much slower the engine decodes
// than its deployment's others (pace).
func (m *models) model(addr string, rate float64) predict.Model {
	m.mu.Lock()
	defer m.mu.Unlock()
	prior := predict.Default(rate)
	mdl := prior
	if f, ok := m.published[m.group[addr]]; ok {
		mdl = f.Fit(prior)
	}
	if _, ok := m.group[addr]; ok {
		m.base[addr] = mdl.Resolve(&prior)
	}
	factor := m.slowdownLocked(addr)
	if slowed := m.slowed[addr]; !slowed && factor >= logSlowed || slowed && factor == 1 {
		m.slowed[addr] = !slowed
		if !slowed {
			m.log.Warn("engine decodes slower than its deployment's others: its ITL model is scaled", "engine", addr,
				"factor", factor)
		} else {
			m.log.Info("engine back to its deployment's pace", "engine", addr)
		}
	}
	return pace.Scale(mdl, &prior, factor)
}

func (m *models) median() float64 {
	m.mu.Lock()
	s := slices.Clone(m.recent)
	m.mu.Unlock()
	if len(s) == 0 {
		return 0
	}
	slices.Sort(s)
	return s[len(s)/2]
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}
