// Package demand learns, from the gateways' routing reports, how much
// decoding each prefix group brings to each endpoint: the output tokens its
// requests ask for, per second, decayed over a time constant.
//
// Which groups share an engine decides the last few percent of a pool's
// throughput, and a group's first request, which places it, cannot tell
// how long its answers will run. The planner (cachesync/internal/planner)
// moves groups by these figures; operators see each endpoint's total as a
// metric.
//
// A group is the requests whose prompts share their first
// snapshot.GroupDepth blocks: a tenant's system prompt, a document's head
// (snapshot.GroupKey).
//
// The decayed rate is what an operator reads, and it is mostly the noise of
// how many requests happened to come: at 0.5 requests a second a group's
// 30 s figure swings by a quarter. So each group also keeps, over a longer
// time constant, its arrival rate and the mean and variance of the answers
// its requests ask for, apart, with the variance of each estimate: what the
// planner needs to tell a long-answering group from a lucky run of
// arrivals. It keeps them twice more, each over a random half of the
// group's requests: the planner picks the best of many moves, so the one
// it picks is the one whose figures read highest by chance, and a move is
// checked on the half it was not chosen on.
package demand

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/shared/policy"
	"github.com/kvroute/kvroute/shared/report"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// Defaults for Config.
const (
	// DefaultTimeConstant spans several b2b-saas stages' worth of a
	// group's requests at low rates (0.5 req/s a group at 8 req/s), so
	// that a group's five prompts have all been seen; shorter reads one
	// long answer as a long-answering group.
	DefaultTimeConstant = 30 * time.Second
	// DefaultLongTimeConstant is the window of a group's arrival rate and
	// answer length: a group's answers are a property of its prompts, and
	// its share of the traffic changes over minutes, not seconds. At
	// 0.5 requests a second it holds about 150 of a group's requests.
	DefaultLongTimeConstant = 5 * time.Minute
	// DefaultMaxGroups bounds the groups tracked; past it the least
	// demanding are dropped.
	DefaultMaxGroups = 1 << 16
)

// Config configures a Tracker. The zero value means the defaults.
type Config struct {
	TimeConstant     time.Duration
	LongTimeConstant time.Duration
	MaxGroups        int
	// DefaultOutputTokens is what a request that states no max_tokens is
	// taken to ask for. Default: the policy's (shared/policy).
	DefaultOutputTokens int
}

// Tracker accumulates demand. It is safe for concurrent use.
type Tracker struct {
	tau      float64 // seconds
	long     float64 // seconds
	maxG     int
	defOut   float64
	mu       sync.Mutex
	groups   map[uint64]*group
	eps      map[string]*level // per endpoint, over all its groups
	lastTrim int64
	// split draws the half a request counts in; a fixed seed, since it
	// need only be blind to the request.
	split *rand.Rand
}

// level is an exponentially decayed sum: value as of at (Unix ns).
type level struct {
	value float64
	at    int64
}

// add decays l to now and adds x. A report older than l's last counts
// undecayed: gateways' batches arrive a little out of order.
func (l *level) add(now int64, tau, x float64) {
	if now <= l.at {
		l.value += x
		return
	}
	l.value = l.valueAt(now, tau) + x
	l.at = now
}

// valueAt returns l's value decayed to now.
func (l *level) valueAt(now int64, tau float64) float64 {
	if now <= l.at {
		return l.value
	}
	return l.value * math.Exp(-float64(now-l.at)/1e9/tau)
}

type group struct {
	eps    map[string]*level
	whole  sums
	halves [2]sums
	first  int64 // when the group was first seen
}

// sums are the long-run sums of a group's requests, or of a half of them:
// requests, their output tokens and its square, and the squared weights
// (decayed twice as fast), which give the sample's effective size.
type sums struct{ n, x, q, w2 level }

func (s *sums) add(ns int64, long, x float64) {
	s.n.add(ns, long, 1)
	s.x.add(ns, long, x)
	s.q.add(ns, long, x*x)
	s.w2.add(ns, long/2, 1)
}

// New returns a Tracker.
func New(cfg Config) *Tracker {
	t := &Tracker{tau: cfg.TimeConstant.Seconds(), long: cfg.LongTimeConstant.Seconds(), maxG: cfg.MaxGroups,
		defOut: float64(cfg.DefaultOutputTokens), groups: map[uint64]*group{}, eps: map[string]*level{},
		split: rand.New(rand.NewPCG(1, 2))}
	if t.tau <= 0 {
		t.tau = DefaultTimeConstant.Seconds()
	}
	if t.long <= 0 {
		t.long = DefaultLongTimeConstant.Seconds()
	}
	if t.maxG <= 0 {
		t.maxG = DefaultMaxGroups
	}
	if t.defOut <= 0 {
		t.defOut = float64(policy.DefaultConfig().DefaultOutputTokens)
	}
	return t
}

// Record counts the request of a routing record (not an outcome record):
// its prompt's group, its endpoint, the output tokens it asked for. A
// record of no hash names no group and is not counted.
func (t *Tracker) Record(e report.Entry, now time.Time) {
	if n := e.NumHashes(); n > 0 {
		t.Add(string(e.Endpoint()), e.Hash(min(n, snapshot.GroupDepth)-1), e.Output(), now)
	}
}

// Add counts one request routed to endpoint, of a prompt of group key,
// asking for output tokens (0: it did not say).
func (t *Tracker) Add(endpoint string, key uint64, output int, now time.Time) {
	x := float64(output)
	if output <= 0 {
		x = t.defOut
	}
	ns := now.UnixNano()
	t.mu.Lock()
	defer t.mu.Unlock()
	g := t.groups[key]
	if g == nil {
		if len(t.groups) >= t.maxG {
			t.trim(ns)
		}
		g = &group{eps: map[string]*level{}, first: ns}
		t.groups[key] = g
	}
	g.whole.add(ns, t.long, x)
	g.halves[t.split.IntN(2)].add(ns, t.long, x)
	l := g.eps[endpoint]
	if l == nil {
		l = &level{at: ns}
		g.eps[endpoint] = l
	}
	l.add(ns, t.tau, x)
	e := t.eps[endpoint]
	if e == nil {
		e = &level{at: ns}
		t.eps[endpoint] = e
	}
	e.add(ns, t.tau, x)
}

// trim drops the least demanding quarter of the groups; t.mu is held.
// Trimming costs a sort of every group, so it runs at most once per time
// constant: between trims the map may grow past the bound by what a time
// constant's new groups add.
func (t *Tracker) trim(now int64) {
	if float64(now-t.lastTrim) < t.tau*1e9 && len(t.groups) < 2*t.maxG {
		return
	}
	t.lastTrim = now
	type kv struct {
		key  uint64
		rate float64
	}
	all := make([]kv, 0, len(t.groups))
	for k, g := range t.groups {
		all = append(all, kv{k, g.total(now, t.tau)})
	}
	slices.SortFunc(all, func(a, b kv) int {
		if a.rate != b.rate {
			if a.rate < b.rate {
				return -1
			}
			return 1
		}
		if a.key < b.key {
			return -1
		}
		return 1
	})
	for _, x := range all[:len(all)/4+1] {
		delete(t.groups, x.key)
	}
}

func (g *group) total(now int64, tau float64) float64 {
	s := 0.0
	for _, l := range g.eps {
		s += l.valueAt(now, tau)
	}
	return s
}

// Endpoint returns the output tokens per second the requests routed to
// endpoint ask for, as of now.
func (t *Tracker) Endpoint(endpoint string, now time.Time) float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l := t.eps[endpoint]; l != nil {
		return l.valueAt(now.UnixNano(), t.tau) / t.tau
	}
	return 0
}

// Forget drops an endpoint's demand: it left the pool.
func (t *Tracker) Forget(endpoint string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.eps, endpoint)
	for k, g := range t.groups {
		delete(g.eps, endpoint)
		if len(g.eps) == 0 {
			delete(t.groups, k)
		}
	}
}

// Share is one group's demand at one endpoint.
type Share struct {
	Endpoint string
	Rate     float64 // output tokens per second
}

// Group is one group's demand.
type Group struct {
	Key    uint64
	Rate   float64 // output tokens per second over every endpoint
	Shares []Share // by endpoint address
	// Sample is the long-run estimates from all its requests.
	Sample
	// Halves are the same from two random halves of its requests: two
	// independent estimates, each of half the group's arrivals.
	Halves [2]Sample
}

// Sample is a group's long-run estimates over the long time constant, from
// its requests or a random part of them.
type Sample struct {
	// Requests is how many requests were seen within about the long time
	// constant (decayed like the estimates): a group of one request is a
	// prompt that may never come back, and a lull of a few seconds does
	// not make a recurring group a new one.
	Requests float64
	// Each with the variance of its estimate: requests per second (the
	// variance a Poisson stream of that rate leaves in the estimate), and
	// the output tokens a request asks for on average (the variance of
	// that mean: the answers' own spread over the sample's effective
	// size).
	Arrivals, ArrivalsVar float64
	Answer, AnswerVar     float64
}

// Demand is the sample's long-run output tokens per second (Arrivals times
// Answer), with its variance.
func (s *Sample) Demand() (rate, variance float64) {
	return s.Arrivals * s.Answer, s.Answer*s.Answer*s.ArrivalsVar + s.Arrivals*s.Arrivals*s.AnswerVar
}

// sample returns the long-run estimates of s, a group first seen at first,
// as of now.
func (s *sums) sample(first, now int64, long float64) Sample {
	n := s.n.valueAt(now, long)
	x := Sample{Requests: n}
	if n <= 0 {
		return x
	}
	// The window a decayed count covers so far: a group first seen a
	// moment ago has not had the whole time constant to gather requests.
	// For Poisson arrivals of rate r the count's mean is r·w1 and its
	// variance r·w2.
	age := max(float64(now-first)/1e9, 1)
	w1 := long * -math.Expm1(-age/long)
	w2 := long / 2 * -math.Expm1(-2*age/long)
	x.Arrivals = n / w1
	x.ArrivalsVar = x.Arrivals * w2 / (w1 * w1)
	x.Answer = s.x.valueAt(now, long) / n
	// The effective size of an exponentially weighted sample; the spread
	// of one answer about the mean, with Bessel's correction for it.
	size := n * n / max(s.w2.valueAt(now, long/2), 1e-12)
	spread := max(s.q.valueAt(now, long)/n-x.Answer*x.Answer, 0)
	if size > 1 {
		spread *= size / (size - 1)
	} else {
		spread = x.Answer * x.Answer // one answer says nothing of the spread
	}
	x.AnswerVar = spread / max(size, 1)
	return x
}

// Groups returns every group's demand as of now, the most demanding first.
func (t *Tracker) Groups(now time.Time) []Group {
	ns := now.UnixNano()
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Group, 0, len(t.groups))
	for k, g := range t.groups {
		x := Group{Key: k, Sample: g.whole.sample(g.first, ns, t.long)}
		for h := range g.halves {
			x.Halves[h] = g.halves[h].sample(g.first, ns, t.long)
		}
		for ep, l := range g.eps {
			r := l.valueAt(ns, t.tau) / t.tau
			x.Rate += r
			x.Shares = append(x.Shares, Share{ep, r})
		}
		slices.SortFunc(x.Shares, func(a, b Share) int {
			if a.Endpoint < b.Endpoint {
				return -1
			}
			return 1
		})
		out = append(out, x)
	}
	slices.SortFunc(out, func(a, b Group) int {
		switch {
		case a.Rate > b.Rate:
			return -1
		case a.Rate < b.Rate:
			return 1
		case a.Key < b.Key:
			return -1
		}
		return 1
	})
	return out
}
