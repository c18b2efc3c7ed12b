package policy

import (
	"errors"
	"math"
	"time"

	"github.com/kvroute/kvroute/shared/approx"
	"github.com/kvroute/kvroute/shared/blockhash"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// Mode selects what a request's predicted latency counts.
type Mode uint8

// The modes.
const (
	// ModeAuto prices a request's whole predicted latency, time to first
	// token plus its output tokens' decoding: whichever of prefill and
	// decode is the pool's bottleneck weighs most, request by request.
	ModeAuto Mode = iota
	// ModePrefill prices the time to first token alone.
	ModePrefill
	// ModeDecode prices the decoding alone (the time to first token breaks
	// ties): for decode-bound work.
	ModeDecode
)

// ParseMode parses "auto", "prefill" or "decode".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "auto":
		return ModeAuto, nil
	case "prefill":
		return ModePrefill, nil
	case "decode":
		return ModeDecode, nil
	}
	return 0, errors.New("policy: mode must be auto, prefill or decode, not " + s)
}

// String returns "auto", "prefill" or "decode".
func (m Mode) String() string {
	switch m {
	case ModePrefill:
		return "prefill"
	case ModeDecode:
		return "decode"
	}
	return "auto"
}

// Reason says why an endpoint was chosen.
type Reason uint8

// The reasons.
const (
	// ReasonFallback: nothing is eligible (Decision.Endpoint is -1).
	ReasonFallback Reason = iota
	// ReasonAffinity: the endpoint holding the longest cached prefix.
	ReasonAffinity
	// ReasonSaturatedRelease: an endpoint held more of the prompt, but its
	// load priced it out: the request spilled to a less warm one.
	ReasonSaturatedRelease
	// ReasonLeastLoad: no endpoint held any of the prompt; placed by load
	// and cache headroom.
	ReasonLeastLoad
	// ReasonMoved: cachesync's planner pinned the prompt's group to an
	// endpoint holding less of it than another (snapshot.Manifest.Pinned):
	// the group is being moved there.
	ReasonMoved
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
	case ReasonMoved:
		return "moved"
	}
	return "fallback"
}

// DefaultPrefillRate is llm-d's shipped peak prefill rate, in tokens per
// second: what an endpoint no one has calibrated is taken to prefill.
const DefaultPrefillRate = 15928

// Config holds the policy's parameters. Start from DefaultConfig.
type Config struct {
	Mode Mode
	// PrefillRate is the prefill throughput, in tokens per second, of an
	// endpoint whose snapshot row carries none.
	PrefillRate float64
	// CPUDiscount is what a block cached on the CPU tier counts for
	// relative to one on the GPU, 0 to 1.
	CPUDiscount float64
	// OthersWeight prices the delay a request's own prefill and decode add
	// to the requests sharing an endpoint with it, against its own
	// latency; 0 to 10 (0 is a selfish choice).
	OthersWeight float64
	// EvictionWeight prices the cached blocks a request would push out of
	// an endpoint's cache, as seconds of someone's future prefill; 0 to 10.
	EvictionWeight float64
	// TieTolerance: prices this close are a tie, broken at random, so that
	// gateways sharing a snapshot do not all pick the same endpoint.
	TieTolerance time.Duration
	// SLOTTFT and SLOTPOT, when set, make the choice the best-cached
	// endpoint predicted to meet them, and the least-priced otherwise;
	// a request may set its own (Request.SLOTTFT, Request.SLOTPOT).
	SLOTTFT, SLOTPOT time.Duration
	// DefaultOutputTokens is how many tokens a request that does not say
	// (max_tokens) is taken to generate.
	DefaultOutputTokens int
	// BlockBytes is the size of one hashed block of prompt text; with the
	// snapshot's bytes per token it says how many tokens a block holds.
	BlockBytes int
}

// DefaultConfig returns the defaults; doc.go gives the reasons.
func DefaultConfig() Config {
	return Config{
		Mode:                ModeAuto,
		PrefillRate:         DefaultPrefillRate,
		CPUDiscount:         0.8,
		OthersWeight:        1,
		EvictionWeight:      1,
		TieTolerance:        5 * time.Millisecond,
		DefaultOutputTokens: 256,
		BlockBytes:          blockhash.DefaultBlockSize,
	}
}

func (c *Config) validate() error {
	switch {
	case c.Mode > ModeDecode:
		return errors.New("policy: unknown mode")
	case !(c.PrefillRate > 0 && c.PrefillRate < math.Inf(1)):
		return errors.New("policy: prefill rate must be positive")
	case !(c.CPUDiscount >= 0 && c.CPUDiscount <= 1):
		return errors.New("policy: CPU discount must be 0 to 1")
	case !(c.OthersWeight >= 0 && c.OthersWeight <= 10):
		return errors.New("policy: others weight must be 0 to 10")
	case !(c.EvictionWeight >= 0 && c.EvictionWeight <= 10):
		return errors.New("policy: eviction weight must be 0 to 10")
	case c.TieTolerance < 0 || c.SLOTTFT < 0 || c.SLOTPOT < 0:
		return errors.New("policy: tie tolerance and SLOs must be >= 0")
	case c.DefaultOutputTokens < 1:
		return errors.New("policy: default output tokens must be at least 1")
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
	// AtLoad is how many requests this gateway had in flight at the
	// endpoint when the snapshot's load figures were read (its engine's
	// running and waiting requests, as of cachesync's last scrape), if
	// AtLoadKnown. The rest of the engine's count is other gateways' load,
	// to which the policy adds Requests, this gateway's as of now. Not
	// known, the engine's count and Requests are taken as overlapping.
	AtLoad      int64
	AtLoadKnown bool
	// Blocks is how many of this request's leading blocks the endpoint
	// will hold once the prefills this gateway recently sent it are done:
	// the snapshot shows them only a prefill and a sync later, and a
	// request sharing the prefix that comes meanwhile must see them.
	Blocks int
	// Pending is the blocks of new prompts this gateway sent the endpoint
	// since the snapshot was built: its cache holds them, or soon will,
	// and the snapshot does not show them yet. They count in how full its
	// cache is when a new prefix is placed.
	Pending int
	// PendingPrefixes is how many of those were prompts new to the
	// endpoint: prefixes the snapshot's Prefixes does not count yet.
	PendingPrefixes int
	// StepAge and StepLength are the engine's step clock as this gateway's
	// streams show it: how long ago the engine's last step ended (a token
	// reached a stream) and how long that step took (the gap between a
	// stream's last two tokens), in seconds. StepLength 0: not known.
	StepAge, StepLength float64
	// StepLead is how long before a step's end a request must be sent to
	// join the next step, in seconds, as the gateway learned it; one sent
	// later waits a step more.
	StepLead float64
}

// Request is what Pick decides on.
type Request struct {
	Model  string   // the requested model or adapter; "" matches every endpoint
	Hashes []uint64 // the prompt's chained block hashes, its first ones at least
	// Blocks is how many full blocks the prompt has, hashed or not: a caller
	// may hash only its head, and more once an endpoint holds all of that
	// (Decision.Deepest); 0 means len(Hashes).
	Blocks int
	// PromptTokens estimates the prompt's length (see Tokens); 0 means
	// the tokens of len(Hashes) blocks.
	PromptTokens int
	// OutputTokens is what the request asks to generate at most; 0 means
	// Config.DefaultOutputTokens.
	OutputTokens int
	// SLOTTFT and SLOTPOT override the configured SLOs when set.
	SLOTTFT, SLOTPOT time.Duration
	// Local is indexed like the snapshot's endpoint table; missing rows
	// count as zero.
	Local []Local
	// Allowed, when not nil, restricts the choice to the slots it marks
	// true (a subset a trusted filter in front named); indexed like the
	// snapshot's endpoint table, missing rows are not allowed.
	Allowed []bool
	// Stale says the snapshot is older than the caller trusts for load:
	// its load figures are ignored and only Local counts. Its prefix index
	// and health are still used.
	Stale bool
	// Random breaks near-ties. Pass fresh entropy per request (a per-worker
	// xorshift, or a hash of the request id): gateways that share it would
	// stampede the same endpoint.
	Random uint64
	// Now is when the request is routed: the Picker remembers, from one
	// request to the next, how long each endpoint's decode load has been
	// past the saturation bar (Decode saturation, in the package doc).
	// Zero remembers nothing: an endpoint past the bar is saturated at
	// once.
	Now time.Time
}

// Terms are one candidate's priced terms, for explanations.
type Terms struct {
	Endpoint       int           // slot; -1 for none
	CachedTokens   int           // prompt tokens it holds, CPU-tier ones discounted
	UncachedTokens int           // prompt tokens it would prefill
	Backlog        int           // uncached prompt tokens ahead of this request there
	Running        int           // requests in its batch, this gateway's included
	Waiting        int           // requests in its queue
	Wait           time.Duration // what the engine's step under way has left to run
	TTFT           time.Duration // predicted time to first token
	ITL            time.Duration // predicted inter-token latency
	Others         time.Duration // delay its work would add to the requests sharing the endpoint
	Eviction       time.Duration // price of the cached blocks it would evict
	CopyMargin     time.Duration // added to a copy's price: what it must undercut the holders by
	Price          time.Duration // what the choice minimised
	// Prefixes and FillPercent are what placement of a prompt new to the
	// pool weighs after the price: the prefixes the endpoint draws traffic
	// with (placements since the snapshot included) and its cache's fill
	// (pending prefills included), -1 when its capacity is unknown.
	Prefixes    int
	FillPercent int
	// DecodeSaturated: its predicted inter-token latency was past
	// decodeSaturation times the pool's lowest, in ModeAuto without SLOs.
	DecodeSaturated bool
}

// Decision is the choice and why, for debug headers and metrics.
type Decision struct {
	Endpoint       int // slot in the snapshot's endpoint table; -1 if none is eligible
	Reason         Reason
	Blocks         int // leading prompt blocks the endpoint holds, in any tier
	GPUBlocks      int // how many of those it holds on the GPU
	UncachedTokens int // prompt tokens it is estimated to prefill
	Eligible       int // endpoints that were healthy and serve the model
	// DecodeSaturated is how many of them were saturated by their decode
	// load (ModeAuto without SLOs): passed over while another could take
	// the request.
	DecodeSaturated int
	Lookups         int // index lookups made by the prefix walk
	// Deepest is the most of Request.Hashes any endpoint's index entries
	// hold: when it is all of them and the prompt has more blocks, the
	// match may go on past them.
	Deepest int
	// Chosen and RunnerUp are the terms of the chosen endpoint and of the
	// next best (Endpoint -1 when there is none).
	Chosen, RunnerUp Terms
	// MeetsSLO is false when SLOs are in force and no endpoint is
	// predicted to meet them: the caller may shed the request.
	MeetsSLO bool
}

// Picker applies the policy. It keeps scratch space between calls, so it
// is not safe for concurrent use: each filter worker has its own.
type Picker struct {
	cfg   Config
	match []snapshot.Match
	cands []cand
	over  []overload // per slot, since when its decode load has been past the bar
	n     int        // endpoints of the last Pick's snapshot, for Fallbacks
}

// New returns a Picker.
func New(cfg Config) (*Picker, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Picker{cfg: cfg}, nil
}

// Pick chooses an endpoint of the snapshot v holds for request r. With no
// snapshot (v nil or not loaded) it returns Endpoint -1: the caller falls
// back to Rendezvous over its configured endpoints. It does not allocate
// once its scratch space has grown to the endpoint table.
func (p *Picker) Pick(v *snapshot.View, r *Request) Decision {
	d := Decision{Endpoint: -1, Chosen: Terms{Endpoint: -1}, RunnerUp: Terms{Endpoint: -1}, MeetsSLO: true}
	p.n = 0
	if v == nil || !v.Loaded() {
		return d
	}
	m := v.Manifest()
	n := m.NumEndpoints()
	p.grow(n)
	p.n = n
	model := -1
	if r.Model != "" {
		if model = m.Model(r.Model); model < 0 {
			return d
		}
	}
	d.Lookups = v.Prefix(r.Hashes, p.match[:n])
	if m.HasSlots() {
		// An engine of a prompt per slot holds what its slots hold: the
		// index shows what reports sent there, evicted or not.
		for i := range p.match[:n] {
			if _, ok := m.SlotHolding(i, r.Hashes); !ok {
				if _, total := m.SlotsHeld(i); total > 0 {
					p.match[i] = snapshot.Match{}
				}
			}
		}
	}
	for i := range p.match[:n] {
		d.Deepest = max(d.Deepest, int(p.match[i].Blocks))
	}
	blocks := max(len(r.Hashes), r.Blocks)
	for i := range min(n, len(r.Local)) {
		if b := int32(min(r.Local[i].Blocks, blocks)); b > p.match[i].Blocks {
			p.match[i].Blocks, p.match[i].GPU = b, b
		}
	}
	job := p.job(m, r)
	// Loops range over slices of length n so that Go can drop the bounds
	// checks, which cost more than the work in Wasm.
	cands, match := p.cands[:n], p.match[:n]
	// The pool's two deepest holders of the prompt: a candidate's blocks
	// beyond its own match that another holds would be a copy.
	top, second, topAt := int32(0), int32(0), -1
	for i := range cands {
		c := &cands[i]
		*c = cand{}
		e := m.Endpoint(i)
		if e.Vacant() || e.Health() != snapshot.HealthHealthy || (model >= 0 && !e.Serves(model)) ||
			(r.Allowed != nil && (i >= len(r.Allowed) || !r.Allowed[i])) {
			continue
		}
		c.eligible = true
		d.Eligible++
		if b := match[i].Blocks; b > top {
			top, second, topAt = b, top, i
		} else if b > second {
			second = b
		}
	}
	if d.Eligible == 0 {
		return d
	}
	for i := range cands {
		if c := &cands[i]; c.eligible {
			held := top
			if i == topAt {
				held = second
			}
			c.slotsHeld, c.slots = m.SlotsHeld(i)
			p.price(c, m.Endpoint(i), match[i], held, localOf(r, i), r.Stale, &job)
		}
	}
	job.most = mostCached(cands)
	if p.cfg.Mode == ModeAuto && !job.slo() {
		d.DecodeSaturated = p.saturateDecode(m, cands, r.Now)
	}
	placeNew(cands, &job)
	placeCopies(cands, &job)
	pin := pinnedTo(m, r.Hashes, cands)
	pick, runner, meets := p.choose(cands, &job, r.Random, pin)
	c := &cands[pick]
	d.Endpoint, d.MeetsSLO = pick, meets
	d.Reason = reason(cands, pick, &job)
	if pick == pin && d.Reason == ReasonSaturatedRelease {
		d.Reason = ReasonMoved
	}
	d.Blocks, d.GPUBlocks = int(p.match[pick].Blocks), int(p.match[pick].GPU)
	d.UncachedTokens = int(math.Ceil(c.uncached))
	d.Chosen = c.terms(pick)
	if runner >= 0 {
		d.RunnerUp = cands[runner].terms(runner)
	}
	return d
}

func localOf(r *Request, i int) Local {
	if i < len(r.Local) {
		return r.Local[i]
	}
	return Local{}
}

func (p *Picker) grow(n int) {
	if len(p.cands) < n {
		p.match = make([]snapshot.Match, n)
		p.cands = make([]cand, n)
		p.over = append(p.over, make([]overload, n-len(p.over))...)
	}
}
