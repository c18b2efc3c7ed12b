// Package tokenbytes learns how many bytes of rendered prompt text a token
// stands for, per model, from two counts cachesync already has: the bytes
// of the prompts the gateways report routing to an engine, and the prompt
// tokens the engine's own metrics count it prefilling.
//
// The ratio depends on the tokenizer and on the traffic: about 4 for English
// prose with a large BPE vocabulary, fewer for code, 6 or more for text
// made of rare tokens (the benchmark's random-token prompts). cachesync
// sizes an approximate index by it (an engine's KV capacity is in tokens,
// the index's in text blocks): a ratio set too low makes the index forget
// prompts the engine still holds, one too high keeps prompts it has evicted.
//
// Both counts are summed between two scrapes of an engine and the pair is
// added to its model's sums, which decay with a time constant, so the ratio
// follows the traffic as it changes. An interval in which a gateway did not
// say how long a prompt was (a gateway of an older report format, a
// conversation continued on its engine) is dropped whole, as is one in which
// the engine's counter went back (a restart). Traffic that reaches an
// engine without a gateway's report counts tokens and no bytes, and pulls
// the ratio down; so does a request reported but never prefilled the other
// way, up.
package tokenbytes

import (
	"math"
	"sync"
	"time"
)

// Bounds on a learned ratio: a byte is at most one token, and no tokenizer
// in use packs 16 bytes of prompt text into a token on average.
const (
	MinRatio = 1
	MaxRatio = 16
)

// Defaults.
const (
	// DefaultTimeConstant is how fast old intervals fade: a few minutes
	// of traffic, so a change of workload shows within minutes and one
	// odd minute does not swing the ratio.
	DefaultTimeConstant = 5 * time.Minute
	// DefaultMinTokens is the evidence a ratio needs, in prompt tokens
	// counted: a dozen long prompts or a few hundred short ones.
	DefaultMinTokens = 100_000
)

// Config tunes an Estimator. The zero value means the defaults.
type Config struct {
	TimeConstant time.Duration
	MinTokens    float64
}

// Estimator learns the ratio. It is safe for concurrent use.
type Estimator struct {
	tau       float64 // seconds
	minTokens float64

	mu     sync.Mutex
	eps    map[string]*engine
	models map[string]*sums
}

type engine struct {
	model   string
	counted float64 // the engine's prompt-token counter at its last scrape
	seen    bool    // counted holds a reading
	bytes   float64 // reported since that scrape
	unknown bool    // a prompt of unknown length was reported since
}

type sums struct {
	bytes, tokens float64
	at            time.Time
}

// New returns an Estimator.
func New(cfg Config) *Estimator {
	e := &Estimator{tau: cfg.TimeConstant.Seconds(), minTokens: cfg.MinTokens,
		eps: map[string]*engine{}, models: map[string]*sums{}}
	if e.tau <= 0 {
		e.tau = DefaultTimeConstant.Seconds()
	}
	if e.minTokens <= 0 {
		e.minTokens = DefaultMinTokens
	}
	return e
}

// Routed counts a prompt of n bytes a gateway routed to endpoint; n <= 0
// says its length is not known, which drops the engine's current interval.
// An endpoint not yet scraped (Counted) is not tracked.
func (e *Estimator) Routed(endpoint string, n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	en := e.eps[endpoint]
	switch {
	case en == nil:
		return
	case n <= 0:
		en.unknown = true
	default:
		en.bytes += float64(n)
	}
}

// Counted takes a scrape of endpoint, an engine serving model, whose
// prompt-token counter reads tokens: the interval since its last scrape
// goes into model's sums.
func (e *Estimator) Counted(endpoint, model string, tokens float64, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	en := e.eps[endpoint]
	if en == nil {
		en = &engine{}
		e.eps[endpoint] = en
	}
	if math.IsInf(tokens, 0) || math.IsNaN(tokens) {
		// Not a count: the next reading starts afresh.
		en.seen, en.bytes, en.unknown = false, 0, false
		return
	}
	delta, bytes, clean := tokens-en.counted, en.bytes, en.seen && !en.unknown && en.model == model
	en.model, en.counted, en.seen, en.bytes, en.unknown = model, tokens, true, 0, false
	if !clean || !(delta >= 0) || (delta == 0 && bytes == 0) {
		return
	}
	s := e.models[model]
	if s == nil {
		s = &sums{at: now}
		e.models[model] = s
	}
	if dt := now.Sub(s.at).Seconds(); dt > 0 {
		f := math.Exp(-dt / e.tau)
		s.bytes, s.tokens, s.at = s.bytes*f, s.tokens*f, now
	}
	s.bytes += bytes
	s.tokens += delta
}

// Ratio returns the bytes per token learned for model, within MinRatio and
// MaxRatio; false until its sums hold enough tokens, or when no byte of its
// prompts was reported.
func (e *Estimator) Ratio(model string) (float64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.models[model]
	if s == nil || s.tokens < e.minTokens || s.bytes <= 0 {
		return 0, false
	}
	return min(max(s.bytes/s.tokens, MinRatio), MaxRatio), true
}

// Forget drops endpoint (gone from discovery); its model's sums stay.
func (e *Estimator) Forget(endpoint string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.eps, endpoint)
}
