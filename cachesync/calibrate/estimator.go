// Package calibrate finds an engine's peak prefill rate R_peak, in tokens
// per second, and from it the saturation threshold τ = R_peak × T_max that
// the routing policy applies to uncached prompt tokens in flight (llm-d's
// "sticky until saturated" calibration).
//
// Estimator does it online, from the counters an engine's /metrics page
// carries; Probe does it offline, by timing B-token prefills against one
// engine, for the `cachesync calibrate` command.
//
// # The online estimate
//
// Two measurements bound R_peak from below, each over windows of at least
// Config.Window:
//
//   - Saturated throughput: uncached prompt tokens finished per second in
//     windows where requests were waiting at every scrape, so the engine
//     never idled. It falls short of R_peak when decoding shares the steps
//     (decode-bound load also queues).
//   - Per-request prefill speed: uncached prompt tokens over the summed
//     per-request prefill times (vLLM's request_prefill_time_seconds).
//     Prefills batched together overlap, so the summed time overstates
//     the engine's time and the rate falls short by the overlap; it is
//     close to R_peak only for long prompts prefilled one at a time, so
//     windows whose prompts average under MinPromptTokens uncached tokens,
//     where the fixed cost of a step dominates, are not used.
//
// Idle windows say nothing and are skipped. Since both measurements err
// low, the estimate is a high quantile of the recent windows, smoothed
// with an exponentially weighted moving average and kept within
// [Floor, Ceiling]; until MinSamples windows qualify, Default stands.
// Counters that go backwards (an engine restart) restart the windows.
package calibrate

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Defaults.
const (
	// DefaultRate is llm-d's shipped peak prefill rate, in tokens per
	// second (the router's defaults, 15928 tokens/s × 18 s).
	DefaultRate = 15928
	// DefaultTMax is the largest tolerated prefill backlog, in time.
	DefaultTMax = 18 * time.Second
	// DefaultWindow is the shortest measurement window: long enough that
	// prompts counted whole when their prefill ends (vLLM counts a prompt
	// at its first token) average out.
	DefaultWindow = 10 * time.Second
	// DefaultMinSamples is how many windows must qualify before the
	// estimate replaces the default.
	DefaultMinSamples = 3
	// DefaultMinPromptTokens is the mean uncached prompt, in tokens, that
	// makes a per-request window count.
	DefaultMinPromptTokens = 1024

	// samples is how many windows the quantile looks back over.
	samples = 32
	// quantile of those windows: high, since every window errs low.
	quantile = 0.9
	// smoothing is the weight of a new quantile in the moving average.
	smoothing = 0.3
	// minRequests is the fewest requests a window must see finish their
	// prefill, so that one prompt counted whole cannot make a window.
	minRequests = 2
)

// Config sets how rates are estimated and published.
type Config struct {
	// Default is the rate, in tokens per second, published until the
	// metrics support an estimate; 0 means DefaultRate.
	Default float64
	// Floor and Ceiling bound the estimate; 0 means Default/4 and
	// Default×4.
	Floor, Ceiling float64
	// TMax turns a rate into a threshold; 0 means DefaultTMax.
	TMax time.Duration
	// Window is the shortest measurement window; 0 means DefaultWindow.
	Window time.Duration
	// MinSamples is how many windows must qualify before the estimate is
	// used; 0 means DefaultMinSamples.
	MinSamples int
	// MinPromptTokens is the mean uncached prompt length that makes a
	// per-request window count; 0 means DefaultMinPromptTokens.
	MinPromptTokens int
}

// WithDefaults returns c with zero fields set to their defaults, or an
// error for values that make no sense.
func (c Config) WithDefaults() (Config, error) {
	if c.Default == 0 {
		c.Default = DefaultRate
	}
	if c.Floor == 0 {
		c.Floor = c.Default / 4
	}
	if c.Ceiling == 0 {
		c.Ceiling = c.Default * 4
	}
	if c.TMax == 0 {
		c.TMax = DefaultTMax
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.MinSamples == 0 {
		c.MinSamples = DefaultMinSamples
	}
	if c.MinPromptTokens == 0 {
		c.MinPromptTokens = DefaultMinPromptTokens
	}
	switch {
	case !(c.Floor > 0) || !(c.Floor <= c.Default) || !(c.Default <= c.Ceiling) || math.IsInf(c.Ceiling, 0):
		return c, fmt.Errorf("calibrate: want 0 < floor %g <= default %g <= ceiling %g tokens/s", c.Floor, c.Default, c.Ceiling)
	case c.TMax < 0 || c.Window < 0 || c.MinSamples < 0 || c.MinSamples > samples || c.MinPromptTokens < 0:
		return c, fmt.Errorf("calibrate: T_max %v, window %v, min samples %d (at most %d), min prompt tokens %d: out of range",
			c.TMax, c.Window, c.MinSamples, samples, c.MinPromptTokens)
	case c.Ceiling*c.TMax.Seconds() > math.MaxUint32:
		return c, errors.New("calibrate: ceiling × T_max overflows a threshold")
	}
	return c, nil
}

// Rate is a published prefill rate.
type Rate struct {
	TokensPerSecond float64
	// Threshold is TokensPerSecond × T_max, in uncached prompt tokens.
	Threshold int
	// Calibrated is false while the configured default stands.
	Calibrated bool
}

// rate makes a Rate from tokens per second.
func (c *Config) rate(r float64, calibrated bool) Rate {
	return Rate{TokensPerSecond: r, Threshold: int(math.Round(r * c.TMax.Seconds())), Calibrated: calibrated}
}

// Observation is one scrape of an engine's metrics. The token, request
// and time figures are counters since the engine started.
type Observation struct {
	Time time.Time
	// PromptTokens counts prompt tokens whose prefill finished, cached or
	// not; CachedTokens counts those of them served from a cache.
	PromptTokens, CachedTokens float64
	// Requests counts requests whose prefill finished (first tokens).
	Requests float64
	// PrefillSeconds sums per-request prefill times over PrefillCount
	// requests; both stay 0 if the engine does not report them.
	PrefillSeconds, PrefillCount float64
	// Waiting is the number of requests queued at the scrape.
	Waiting float64
}

func (o *Observation) uncached() float64 { return o.PromptTokens - o.CachedTokens }

// valid reports whether o is usable: finite, non-negative numbers.
func (o *Observation) valid() bool {
	for _, v := range []float64{o.PromptTokens, o.CachedTokens, o.Requests, o.PrefillSeconds, o.PrefillCount, o.Waiting} {
		if !(v >= 0) || math.IsInf(v, 1) {
			return false
		}
	}
	return !o.Time.IsZero()
}

// restarted reports whether a counter went backwards from prev to o.
func (o *Observation) restarted(prev *Observation) bool {
	return o.PromptTokens < prev.PromptTokens || o.CachedTokens < prev.CachedTokens || o.Requests < prev.Requests ||
		o.PrefillSeconds < prev.PrefillSeconds || o.PrefillCount < prev.PrefillCount
}

// Estimator estimates one engine's rate from its observations. It is not
// safe for concurrent use.
type Estimator struct {
	cfg              Config
	prev             *Observation
	sat              *Observation // start of the saturated window; nil when not saturated
	req              *Observation // start of the per-request window
	satRing, reqRing ring
	est              float64
	calibrated       bool
}

// ring holds one measurement's recent windows.
type ring struct {
	v [samples]float64
	n int // windows taken in all
}

// quantile returns the quantile of the recent windows, if there are at
// least need of them.
func (r *ring) quantile(need int) (float64, bool) {
	if r.n < need || r.n == 0 {
		return 0, false
	}
	recent := slices.Clone(r.v[:min(r.n, samples)])
	slices.Sort(recent)
	pos := quantile * float64(len(recent)-1)
	i := int(pos)
	q := recent[i]
	if i+1 < len(recent) {
		q += (pos - float64(i)) * (recent[i+1] - q)
	}
	return q, true
}

// NewEstimator returns an Estimator for cfg, with defaults filled in.
func NewEstimator(cfg Config) (*Estimator, error) {
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return nil, err
	}
	return &Estimator{cfg: cfg}, nil
}

// Observe takes one scrape, in time order. Observations that are not
// finite, or not later than the last, are ignored.
func (e *Estimator) Observe(o Observation) {
	if !o.valid() || (e.prev != nil && !o.Time.After(e.prev.Time)) {
		return
	}
	if e.prev != nil && o.restarted(e.prev) {
		e.sat, e.req = nil, nil
	}
	e.prev = &o
	if e.req == nil {
		e.req = &o
	}
	if o.Waiting == 0 {
		e.sat = nil
	} else if e.sat == nil {
		e.sat = &o
	}
	if e.sat != nil && o.Time.Sub(e.sat.Time) >= e.cfg.Window {
		if tokens := o.uncached() - e.sat.uncached(); tokens > 0 && o.Requests-e.sat.Requests >= minRequests {
			e.add(&e.satRing, tokens/o.Time.Sub(e.sat.Time).Seconds())
		}
		e.sat = &o
	}
	if o.Time.Sub(e.req.Time) >= e.cfg.Window {
		tokens := o.uncached() - e.req.uncached()
		secs := o.PrefillSeconds - e.req.PrefillSeconds
		reqs := o.Requests - e.req.Requests
		if tokens > 0 && secs > 0 && o.PrefillCount-e.req.PrefillCount >= minRequests && reqs > 0 &&
			tokens/reqs >= float64(e.cfg.MinPromptTokens) {
			e.add(&e.reqRing, tokens/secs)
		}
		e.req = &o
	}
}

// add takes one window's measurement into r. Both measurements err low,
// so the estimate follows the higher of their quantiles.
func (e *Estimator) add(r *ring, v float64) {
	r.v[r.n%samples] = v
	r.n++
	qs, okS := e.satRing.quantile(e.cfg.MinSamples)
	qr, okR := e.reqRing.quantile(e.cfg.MinSamples)
	if !okS && !okR {
		return
	}
	q := max(qs, qr)
	if !e.calibrated {
		e.est, e.calibrated = q, true
	} else {
		e.est += smoothing * (q - e.est)
	}
}

// Rate returns the rate to publish now.
func (e *Estimator) Rate() Rate {
	if !e.calibrated {
		return e.cfg.rate(e.cfg.Default, false)
	}
	return e.cfg.rate(min(max(e.est, e.cfg.Floor), e.cfg.Ceiling), true)
}
