package daemon

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/cachesync/internal/fit"
	"github.com/kvroute/kvroute/shared/predict"
	"github.com/kvroute/kvroute/shared/report"
)

// models fits every engine's latency model (shared/predict): time to first
// token from the gateways' outcome reports, inter-token latency from the
// engine's own histogram against its batch size. It also measures the
// prediction error the gateways saw.
type models struct {
	mu     sync.Mutex
	fits   map[string]*fit.Model
	recent []float64 // the last relative TTFT errors, for the median
	next   int

	errs  prometheus.Histogram
	mdape prometheus.GaugeFunc
}

// recentErrors is how many outcomes the median error covers.
const recentErrors = 1024

func newModels(reg prometheus.Registerer) *models {
	m := &models{fits: map[string]*fit.Model{}}
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

func (m *models) fitOf(addr string) *fit.Model {
	f := m.fits[addr]
	if f == nil {
		f = new(fit.Model)
		m.fits[addr] = f
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
	f := m.fits[addr]
	if f == nil {
		return // not an engine this cachesync follows
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

// itl takes a scrape interval's mean inter-token latency.
func (m *models) itl(addr string, running, kv, seconds float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fitOf(addr).AddITL(running, kv, seconds)
}

// add starts following an engine; forget stops.
func (m *models) add(addr string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fitOf(addr)
}

func (m *models) forget(addr string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.fits, addr)
}

// model returns the engine's fitted model, held near the default for its
// prefill rate.
func (m *models) model(addr string, rate float64) predict.Model {
	m.mu.Lock()
	defer m.mu.Unlock()
	prior := predict.Default(rate)
	f := m.fits[addr]
	if f == nil {
		return prior
	}
	return f.Fit(prior)
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
