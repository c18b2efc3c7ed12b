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
// Over each window of at least Config.Window, with U uncached prompt
// tokens finished in Δt, two figures bound R_peak from below:
//
//   - Throughput, U / Δt: exact while the engine prefills all the time,
//     short when it idles or decodes. Without a better figure it counts
//     only in windows where requests were waiting at every scrape.
//   - Per-request prefill speed, U / P, where P is the time those requests
//     spent in prefill (vLLM's request_prefill_time_seconds, scaled to
//     the requests counted in U, since vLLM records it when a request
//     finishes, not when its prefill does). Prefills batched together
//     overlap, so P overstates the engine's time once several run at once;
//     but then P > Δt, and U / Δt is the better bound.
//
// A window's sample is U / min(P, Δt), the tighter bound. An engine that
// times its own prefills (llama.cpp's prompt_seconds_total) gives P
// exactly, and its samples are measurements rather than bounds: they are
// clamped only to [1, Ceiling], not to Floor, so that an engine on CPUs
// slower than any GPU default is calibrated as it is; a window of them
// ends as soon as its prompts reach MinPromptTokens, and the first one
// replaces the default. Short prompts
// prefilled at light load are dominated by a step's fixed cost, so outside
// saturation a window counts only if its prompts average MinPromptTokens
// uncached tokens. Idle windows say nothing and are skipped.
//
// Since every sample errs low, the estimate is a high quantile of the
// recent samples: it rises to a higher quantile at once and falls toward a
// lower one with an exponentially weighted moving average, within
// [Floor, Ceiling]. Until MinSamples windows count, Default stands.
// Counters that go backwards (an engine restart) start a new window.
package calibrate

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvroute/kvroute/shared/policy"
)

// Defaults.
const (
	// DefaultRate is the rate of an engine not calibrated yet, the
	// policy's.
	DefaultRate = policy.DefaultPrefillRate
	// DefaultWindow is the shortest measurement window: long enough that
	// prompts counted whole when their prefill ends (vLLM counts a prompt
	// at its first token) average out.
	DefaultWindow = 10 * time.Second
	// DefaultMinSamples is how many windows must qualify before the
	// estimate replaces the default.
	DefaultMinSamples = 3
	// DefaultMinPromptTokens is the mean uncached prompt, in tokens, that
	// makes a window count outside saturation.
	DefaultMinPromptTokens = 1024

	// samples is how many windows the quantile looks back over.
	samples = 32
	// quantile of those windows: high, since every window errs low.
	quantile = 0.9
	// smoothing is the weight of a lower quantile in the moving average.
	smoothing = 0.3
	// minRequests is the fewest requests a window must see finish their
	// prefill, so that one prompt counted whole cannot make a window.
	minRequests = 2
	// minTimedRate is the least rate a timed estimate publishes: the
	// snapshot's latency model divides by it.
	minTimedRate = 1
)

// Config sets how rates are estimated and published.
type Config struct {
	// Default is the rate, in tokens per second, published until the
	// metrics support an estimate; 0 means DefaultRate.
	Default float64
	// Floor and Ceiling bound the estimate; 0 means Default/4 and
	// Default×4.
	Floor, Ceiling float64
	// Window is the shortest measurement window; 0 means DefaultWindow.
	Window time.Duration
	// MinSamples is how many windows must qualify before the estimate is
	// used; 0 means DefaultMinSamples.
	MinSamples int
	// MinPromptTokens is the mean uncached prompt length that makes a
	// window count outside saturation; 0 means DefaultMinPromptTokens.
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
	case c.Ceiling > math.MaxFloat32:
		return c, fmt.Errorf("calibrate: ceiling %g tokens/s does not fit a snapshot", c.Ceiling)
	case c.Window < 0 || c.MinSamples < 0 || c.MinSamples > samples || c.MinPromptTokens < 0:
		return c, fmt.Errorf("calibrate: window %v, min samples %d (at most %d), min prompt tokens %d: out of range",
			c.Window, c.MinSamples, samples, c.MinPromptTokens)
	}
	return c, nil
}

// Rate is a published prefill rate.
type Rate struct {
	TokensPerSecond float64
	// Calibrated is false while the configured default stands.
	Calibrated bool
}

// rate makes a Rate from tokens per second.
func (c *Config) rate(r float64, calibrated bool) Rate {
	return Rate{TokensPerSecond: r, Calibrated: calibrated}
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
	// PrefillTime is the time the engine spent prefilling, as it times
	// itself (llama.cpp's prompt_seconds_total); 0 if it does not.
	PrefillTime float64
	// Waiting is the number of requests queued at the scrape.
	Waiting float64
}

func (o *Observation) uncached() float64 { return o.PromptTokens - o.CachedTokens }

// valid reports whether o is usable: finite, non-negative numbers.
func (o *Observation) valid() bool {
	for _, v := range []float64{o.PromptTokens, o.CachedTokens, o.Requests, o.PrefillSeconds, o.PrefillCount, o.PrefillTime, o.Waiting} {
		if !(v >= 0) || math.IsInf(v, 1) {
			return false
		}
	}
	return !o.Time.IsZero()
}

// restarted reports whether a counter went backwards from prev to o.
func (o *Observation) restarted(prev *Observation) bool {
	return o.PromptTokens < prev.PromptTokens || o.CachedTokens < prev.CachedTokens || o.Requests < prev.Requests ||
		o.PrefillSeconds < prev.PrefillSeconds || o.PrefillCount < prev.PrefillCount || o.PrefillTime < prev.PrefillTime
}

// Estimator estimates one engine's rate from its observations. It is not
// safe for concurrent use.
type Estimator struct {
	cfg        Config
	prev       *Observation
	start      *Observation // start of the current window
	saturated  bool         // requests waited at every scrape of the window
	samples    [samples]float64
	n          int // samples taken in all
	est        float64
	calibrated bool
	// timed: the engine times its own prefills, so samples are measured.
	timed bool
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
	if e.start == nil || o.restarted(e.prev) {
		e.prev, e.start, e.saturated = &o, &o, o.Waiting > 0
		return
	}
	e.prev = &o
	e.saturated = e.saturated && o.Waiting > 0
	dt := o.Time.Sub(e.start.Time)
	// An engine that times its prefills needs no long window to average
	// over, only enough prompt tokens to outweigh a step's fixed cost.
	timedEnough := o.PrefillTime > e.start.PrefillTime && o.uncached()-e.start.uncached() >= float64(e.cfg.MinPromptTokens)
	if dt < e.cfg.Window && !timedEnough {
		return
	}
	if r, ok := e.sample(e.start, &o, dt.Seconds()); ok {
		e.add(r)
	}
	e.start, e.saturated = &o, o.Waiting > 0
}

// sample measures the window from a to b, if it says anything.
func (e *Estimator) sample(a, b *Observation, dt float64) (float64, bool) {
	tokens := b.uncached() - a.uncached()
	if busy := b.PrefillTime - a.PrefillTime; busy > 0 && tokens > 0 {
		e.timed = true
		// The engine counts no requests: the window's prompts together
		// must be long enough to outweigh a step's fixed cost.
		if !e.saturated && tokens < float64(e.cfg.MinPromptTokens) {
			return 0, false
		}
		// Slots prefilling side by side each count their time, so the
		// sum overstates the engine's; a full window bounds it. A short
		// one cannot: a prompt's whole time lands in the window it
		// finishes in.
		if dt >= e.cfg.Window.Seconds() {
			busy = min(busy, dt)
		}
		return tokens / busy, true
	}
	reqs := b.Requests - a.Requests
	if !(tokens > 0) || reqs < minRequests {
		return 0, false
	}
	if !e.saturated && tokens/reqs < float64(e.cfg.MinPromptTokens) {
		return 0, false
	}
	busy := dt
	if n := b.PrefillCount - a.PrefillCount; n >= minRequests {
		busy = min(busy, (b.PrefillSeconds-a.PrefillSeconds)/n*reqs)
	} else if !e.saturated {
		return 0, false // no evidence the engine was busy
	}
	if !(busy > 0) {
		return 0, false
	}
	return tokens / busy, true
}

// add takes one window's sample.
func (e *Estimator) add(v float64) {
	e.samples[e.n%samples] = v
	e.n++
	if e.n < e.cfg.MinSamples && !e.timed {
		// A timed window is a measurement, and one is enough to start.
		return
	}
	recent := slices.Clone(e.samples[:min(e.n, samples)])
	slices.Sort(recent)
	pos := quantile * float64(len(recent)-1)
	i := int(pos)
	q := recent[i]
	if i+1 < len(recent) {
		q += (pos - float64(i)) * (recent[i+1] - q)
	}
	switch {
	case !e.calibrated || q > e.est:
		e.est, e.calibrated = q, true
	default:
		e.est += smoothing * (q - e.est)
	}
}

// Rate returns the rate to publish now.
func (e *Estimator) Rate() Rate {
	if !e.calibrated {
		return e.cfg.rate(e.cfg.Default, false)
	}
	floor := e.cfg.Floor
	if e.timed {
		floor = minTimedRate
	}
	return e.cfg.rate(min(max(e.est, floor), e.cfg.Ceiling), true)
}
