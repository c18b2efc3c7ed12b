package policy

import (
	"errors"
	"math"
	"math/bits"
	"time"

	"github.com/kvroute/kvroute/shared/approx"
	"github.com/kvroute/kvroute/shared/blockhash"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// Mode selects the load signal.
type Mode uint8

// The modes.
const (
	// ModePrefill estimates each endpoint's time to first token from the
	// uncached prompt tokens it has in flight: for prefill-bound work.
	ModePrefill Mode = iota
	// ModeDecode counts active requests against a per-endpoint cap: for
	// decode-bound work.
	ModeDecode
)

// ParseMode parses "prefill" or "decode".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "prefill":
		return ModePrefill, nil
	case "decode":
		return ModeDecode, nil
	}
	return 0, errors.New("policy: mode must be prefill or decode, not " + s)
}

// String returns "prefill" or "decode".
func (m Mode) String() string {
	if m == ModeDecode {
		return "decode"
	}
	return "prefill"
}

// Reason says why an endpoint was chosen.
type Reason uint8

// The reasons.
const (
	// ReasonFallback: nothing passed the saturation limits, or nothing is
	// eligible (then Decision.Endpoint is -1).
	ReasonFallback Reason = iota
	// ReasonAffinity: the endpoint with the longest cached prefix, not
	// saturated.
	ReasonAffinity
	// ReasonSaturatedRelease: the warm endpoint was saturated; least load.
	ReasonSaturatedRelease
	// ReasonLeastLoad: no endpoint held enough of the prompt; least load.
	ReasonLeastLoad
)

// String returns the reason code used in headers and metric labels.
func (r Reason) String() string {
	switch r {
	case ReasonAffinity:
		return "affinity"
	case ReasonSaturatedRelease:
		return "saturated-release"
	case ReasonLeastLoad:
		return "least-load"
	}
	return "fallback"
}

// Config holds the policy's parameters. Start from DefaultConfig.
type Config struct {
	Mode Mode
	// AffinityThreshold is the fraction of the prompt an endpoint must
	// hold to be warm.
	AffinityThreshold float64
	// MaxTTFTPenalty is how much longer than the best cold endpoint's the
	// warm endpoint's estimated TTFT may be before affinity is released.
	MaxTTFTPenalty time.Duration
	// MaxTTFT is the absolute ceiling on an endpoint's estimated TTFT.
	MaxTTFT time.Duration
	// PrefillRate is the prefill throughput, in tokens per second, of an
	// endpoint whose snapshot row carries none.
	PrefillRate float64
	// DecodeCap is the active-request cap of an endpoint whose snapshot row
	// carries no SignalRequests threshold.
	DecodeCap int
	// CPUDiscount is what a block cached on the CPU tier counts for
	// relative to one on the GPU, 0 to 1.
	CPUDiscount float64
	// Hysteresis is the fraction by which an endpoint's load must fall below
	// a limit it crossed before it is used for affinity again, 0 to 1.
	Hysteresis float64
	// TieTolerance: estimated TTFTs this close are a tie (prefill mode).
	TieTolerance time.Duration
	// TieRequests: loads this many requests apart are a tie (decode mode).
	TieRequests int
	// BlockBytes is the size of one hashed block of prompt text; with the
	// snapshot's bytes per token it says how many tokens a block holds.
	BlockBytes int
}

// DefaultPrefillRate is llm-d's shipped peak prefill rate, in tokens per
// second: what an endpoint no one has calibrated is taken to prefill.
const DefaultPrefillRate = 15928

// DefaultConfig returns the defaults: llm-d's for the affinity threshold,
// TTFT penalty and prefill throughput; see doc.go for the others.
func DefaultConfig() Config {
	return Config{
		Mode:              ModePrefill,
		AffinityThreshold: 0.8,
		MaxTTFTPenalty:    18 * time.Second,
		MaxTTFT:           60 * time.Second,
		PrefillRate:       DefaultPrefillRate,
		DecodeCap:         256,
		CPUDiscount:       0.8,
		Hysteresis:        0.1,
		TieTolerance:      25 * time.Millisecond,
		TieRequests:       1,
		BlockBytes:        blockhash.DefaultBlockSize,
	}
}

func (c *Config) validate() error {
	switch {
	case c.Mode > ModeDecode:
		return errors.New("policy: unknown mode")
	case !(c.AffinityThreshold >= 0 && c.AffinityThreshold <= 1):
		return errors.New("policy: affinity threshold must be 0 to 1")
	case c.MaxTTFTPenalty < 0 || c.MaxTTFT <= 0:
		return errors.New("policy: TTFT penalty must be >= 0 and the TTFT ceiling > 0")
	case !(c.PrefillRate > 0 && c.PrefillRate < math.Inf(1)):
		return errors.New("policy: prefill rate must be positive")
	case c.DecodeCap < 1:
		return errors.New("policy: decode cap must be at least 1")
	case !(c.CPUDiscount >= 0 && c.CPUDiscount <= 1):
		return errors.New("policy: CPU discount must be 0 to 1")
	case !(c.Hysteresis >= 0 && c.Hysteresis < 1):
		return errors.New("policy: hysteresis must be at least 0 and below 1")
	case c.TieTolerance < 0 || c.TieRequests < 0:
		return errors.New("policy: tie tolerances must be >= 0")
	case c.BlockBytes < 1:
		return errors.New("policy: block bytes must be at least 1")
	}
	return nil
}

// BytesPerToken returns how many bytes of prompt text a token stands for
// under snapshot m: what cachesync publishes, else the default. m may be
// nil.
func BytesPerToken(m *snapshot.Manifest) float64 {
	if m != nil && m.BytesPerToken() > 0 {
		return m.BytesPerToken()
	}
	return approx.DefaultBytesPerToken
}

// Tokens estimates the tokens of n bytes of prompt text under snapshot m
// (nil for none): at least 1.
func Tokens(n int, m *snapshot.Manifest) int {
	return max(1, int(float64(n)/BytesPerToken(m)))
}

// Local is this gateway's own load on one endpoint, which the snapshot sees
// only a sync interval later.
type Local struct {
	PrefillTokens int64 // uncached prompt tokens of requests not yet past their first token
	Requests      int64 // requests not yet finished
}

// Request is what Pick decides on.
type Request struct {
	Model  string   // the requested model or adapter; "" matches every endpoint
	Hashes []uint64 // the prompt's chained block hashes
	// PromptTokens estimates the prompt's length (see Tokens); 0 means
	// the tokens of len(Hashes) blocks.
	PromptTokens int
	// Local is indexed like the snapshot's endpoint table; missing rows
	// count as zero.
	Local []Local
	// Stale says the snapshot is older than the caller trusts for load:
	// its load figures are ignored and only Local counts. Its prefix index
	// and health are still used.
	Stale bool
	// Random breaks near-ties. Pass fresh entropy per request (a per-worker
	// xorshift, or a hash of the request id): gateways that share it would
	// stampede the same endpoint.
	Random uint64
}

// Decision is the choice and why, for debug headers and metrics.
type Decision struct {
	Endpoint       int // slot in the snapshot's endpoint table; -1 if none is eligible
	Reason         Reason
	Blocks         int           // leading prompt blocks the endpoint holds, in any tier
	GPUBlocks      int           // how many of those it holds on the GPU
	UncachedTokens int           // prompt tokens it is estimated to prefill
	TTFT           time.Duration // its estimated time to first token
	Eligible       int           // endpoints that were healthy and serve the model
	Lookups        int           // index lookups made by the prefix walk
}

// Picker applies the policy. It keeps scratch space and per-endpoint
// hysteresis state between calls, so it is not safe for concurrent use:
// each filter worker has its own.
type Picker struct {
	cfg     Config
	penalty float64 // seconds
	ceiling float64 // seconds
	tieTTFT float64 // seconds
	match   []snapshot.Match
	cands   []cand
	state   []hysteresis
}

type cand struct {
	flags    uint8
	eff      float64 // effective cached blocks, CPU blocks discounted
	uncached float64 // tokens
	tokens   float64 // uncached prefill tokens in flight, this request included
	ttft     float64 // seconds
	active   float64 // active requests, this request included
	capacity float64 // decode cap
	tau      float64 // calibrated prefill-token threshold, 0 if none
	score    float64 // what least-load minimises
	tol      float64 // how far above the best score is still a tie
}

// Candidate flags. choose selects by them rather than by a predicate
// function: an indirect call per candidate is dear in Go's Wasm code.
const (
	isEligible  = 1 << iota // healthy and serves the model
	isWarm                  // holds at least AffinityThreshold of the prompt
	isAffine                // among the longest warm matches
	isSaturated             // affine and saturated
	isHard                  // past an absolute limit (ceiling, calibrated threshold, cap)
)

// tied reports whether c's score is within its tolerance of best, allowing
// for rounding: 7/100 - 6/100 is a request apart.
func (c *cand) tied(best float64) bool { return c.score-best <= c.tol*(1+1e-9) }

type hysteresis struct {
	since    uint64 // the slot's Since when this state was recorded
	released bool   // saturated when last looked at
}

// New returns a Picker.
func New(cfg Config) (*Picker, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Picker{
		cfg:     cfg,
		penalty: cfg.MaxTTFTPenalty.Seconds(),
		ceiling: cfg.MaxTTFT.Seconds(),
		tieTTFT: cfg.TieTolerance.Seconds(),
	}, nil
}

// Pick chooses an endpoint of the snapshot v holds for request r. With no
// snapshot (v nil or not loaded) it returns Endpoint -1: the caller falls
// back to Rendezvous over its configured endpoints. It does not allocate
// once its scratch space has grown to the endpoint table.
func (p *Picker) Pick(v *snapshot.View, r *Request) Decision {
	if v == nil || !v.Loaded() {
		return Decision{Endpoint: -1}
	}
	m := v.Manifest()
	n := m.NumEndpoints()
	p.grow(n)
	model := -1
	if r.Model != "" {
		if model = m.Model(r.Model); model < 0 {
			return Decision{Endpoint: -1}
		}
	}
	d := Decision{Endpoint: -1}
	d.Lookups = v.Prefix(r.Hashes, p.match[:n])
	blockTokens := float64(p.cfg.BlockBytes) / BytesPerToken(m)
	prompt := float64(r.PromptTokens)
	if prompt <= 0 {
		prompt = float64(len(r.Hashes)) * blockTokens
	}

	// Loops range over slices of length n so that Go can drop the bounds
	// checks, which cost more than the work in Wasm.
	cands := p.cands[:n]
	maxEff := -1.0
	for i := range cands {
		c := &cands[i]
		*c = cand{}
		e := m.Endpoint(i)
		if e.Vacant() || e.Health() != snapshot.HealthHealthy || (model >= 0 && !e.Serves(model)) {
			continue
		}
		p.estimate(c, e, i, r, prompt, blockTokens)
		d.Eligible++
		if c.flags&isWarm != 0 && c.eff > maxEff {
			maxEff = c.eff
		}
		if st := &p.state[i]; st.since != e.Since() {
			*st = hysteresis{since: e.Since()}
		}
	}
	if d.Eligible == 0 {
		return d
	}

	bestCold := math.Inf(1)
	for i := range cands {
		if c := &cands[i]; c.flags&(isEligible|isWarm) == isEligible && c.ttft < bestCold {
			bestCold = c.ttft
		}
	}
	pick, reason := -1, ReasonLeastLoad
	if maxEff >= 0 {
		// Endpoints within a block of the longest match are equally warm.
		for i := range cands {
			if c := &cands[i]; c.flags&isWarm != 0 && c.eff >= maxEff-1 {
				c.flags |= isAffine
				if p.saturated(i, bestCold) {
					c.flags |= isSaturated
				}
			}
		}
		pick = choose(cands, isAffine|isSaturated, isAffine, r.Random)
		reason = ReasonAffinity
		if pick < 0 {
			reason = ReasonSaturatedRelease
		}
	}
	if pick < 0 {
		pick = choose(cands, isEligible|isHard|isSaturated, isEligible, r.Random)
	}
	if pick < 0 {
		pick, reason = choose(cands, isEligible, isEligible, r.Random), ReasonFallback
	}
	c := &cands[pick]
	d.Endpoint, d.Reason = pick, reason
	d.Blocks, d.GPUBlocks = int(p.match[pick].Blocks), int(p.match[pick].GPU)
	d.UncachedTokens = int(math.Ceil(c.uncached))
	d.TTFT = time.Duration(min(c.ttft, 1e9) * float64(time.Second))
	return d
}

func (p *Picker) grow(n int) {
	if len(p.cands) < n {
		p.match = make([]snapshot.Match, n)
		p.cands = make([]cand, n)
		state := make([]hysteresis, n)
		copy(state, p.state)
		p.state = state
	}
}

// estimate fills in the load figures of eligible endpoint e in slot i.
func (p *Picker) estimate(c *cand, e snapshot.Endpoint, i int, r *Request, prompt, blockTokens float64) {
	cfg := &p.cfg
	mt := p.match[i]
	c.flags = isEligible
	c.eff = float64(mt.GPU) + cfg.CPUDiscount*float64(mt.Blocks-mt.GPU)
	cached := min(prompt, c.eff*blockTokens)
	if cached > 0 && cached >= cfg.AffinityThreshold*prompt {
		c.flags |= isWarm
	}
	c.uncached = prompt - cached

	var local Local
	if i < len(r.Local) {
		local = r.Local[i]
	}
	c.tokens = float64(local.PrefillTokens) + c.uncached
	c.active = float64(local.Requests) + 1
	if !r.Stale {
		c.tokens += float64(e.PrefillTokens())
		c.active += float64(e.Running() + e.Waiting())
	}
	rate := e.PrefillRate()
	if rate <= 0 {
		rate = cfg.PrefillRate
	}
	c.ttft = c.tokens / rate
	c.capacity = float64(cfg.DecodeCap)
	switch sig, thr := e.Saturation(); {
	case thr <= 0:
	case sig == snapshot.SignalRequests:
		c.capacity = float64(thr)
	case sig == snapshot.SignalPrefillTokens:
		c.tau = float64(thr)
	}
	if cfg.Mode == ModeDecode {
		c.score = c.active / c.capacity
		c.tol = float64(cfg.TieRequests) / c.capacity
		if c.active > c.capacity {
			c.flags |= isHard
		}
	} else {
		c.score = c.ttft
		c.tol = p.tieTTFT
		if c.ttft > p.ceiling || (c.tau > 0 && c.tokens > c.tau) {
			c.flags |= isHard
		}
	}
}

// saturated decides whether affine endpoint i is saturated, and records it.
// An endpoint found saturated must come back below its limits by the
// hysteresis margin before it counts as unsaturated again, so that one at
// the edge does not flap between requests.
func (p *Picker) saturated(i int, bestCold float64) bool {
	c, st := &p.cands[i], &p.state[i]
	f := 1.0
	if st.released {
		f = 1 - p.cfg.Hysteresis
	}
	if p.cfg.Mode == ModeDecode {
		st.released = c.active > c.capacity*f
	} else {
		st.released = c.ttft-bestCold > p.penalty*f || c.ttft > p.ceiling*f || (c.tau > 0 && c.tokens > c.tau*f)
	}
	return st.released
}

// choose returns the candidate with the least score among those whose
// flags under mask equal want, picking uniformly at random among those
// within their tie tolerance of the best; -1 if none qualifies.
func choose(cands []cand, mask, want uint8, random uint64) int {
	best := math.Inf(1)
	for i := range cands {
		if c := &cands[i]; c.flags&mask == want && c.score < best {
			best = c.score
		}
	}
	if math.IsInf(best, 1) {
		return -1
	}
	ties := 0
	for i := range cands {
		if c := &cands[i]; c.flags&mask == want && c.tied(best) {
			ties++
		}
	}
	k, _ := bits.Mul64(mix(random), uint64(ties))
	for i := range cands {
		if c := &cands[i]; c.flags&mask == want && c.tied(best) {
			if k == 0 {
				return i
			}
			k--
		}
	}
	return -1
}
