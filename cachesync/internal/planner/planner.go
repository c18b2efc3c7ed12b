// Package planner moves prompt groups between the endpoints of a pool so
// that the decoding they bring is spread evenly.
//
// A group is placed by its first request, which cannot tell how long its
// answers will run, and affinity keeps it where it landed: on b2b-saas the
// engine that drew four long-answering groups decoded 6-7% above the
// pool's mean for the rest of the run, and a stage lasts until its
// busiest engine is done. No single request's price can undo that: a
// move's first request pays a cold prefill now for decode time saved by
// every later request of its group. The planner can: it sees each group's
// demand (cachesync/internal/demand), and when the busiest endpoint of a
// pool runs more than Threshold above the mean it moves one group, or
// swaps two, between it and another endpoint, whichever lowers the
// busier of the two the most. A move is a pin (snapshot.EndpointInfo.Pins)
// that the policy follows while the target can take the group's requests.
// A move waits for room: an endpoint takes a moved group only while its
// engine queues nothing and its KV cache is neither nearly full
// (Config.Room) nor filling.
//
// It moves at most once per Cooldown in a pool, and not at all for ten
// minutes (restFor) after a pin there was dropped; a group at most once
// per ten minutes; only groups that recur (MinRequests); only a
// group whose requests go to one endpoint (a hot prefix spread over
// several is the policy's to spread); and only for a gain of MinGain of
// the mean, by the figures of a random half of the groups' requests and
// again by the other half's: each move costs the target a cold prefill of
// the group's prefix.
package planner

import (
	"math"
	"slices"
	"time"

	"github.com/kvroute/kvroute/cachesync/internal/demand"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// Config sets the planner's thresholds. The zero value means the defaults.
type Config struct {
	// Threshold: a pool is planned for when its busiest endpoint's demand
	// is more than this share above the mean. Default 0.05: the best
	// placement of b2b-saas's groups (equal traffic, 100-200-token
	// answers) leaves 2-3%. A map with two engines 4% above the mean
	// serves 2% fewer tokens a second than that, but planning from 3%
	// moved a group every cooldown, each move a cold prefill under load.
	Threshold float64
	// MinGain is the least share of the mean a move must take off the
	// busier of its two endpoints. Default 0.02.
	MinGain float64
	// Cooldown is the least time between two moves in a pool: the demand
	// figures need about a time constant to show a move's effect. Default
	// 30 s.
	Cooldown time.Duration
	// Settle is how long after a pool's first demand its first move may
	// come. Default twice the Cooldown: 30 s into a simulated b2b-saas
	// warm-up its groups had been seen 1-6 times each, and planning then
	// left the busiest endpoint 10-25% busier in 7 runs of 100
	// (TestSimulatedPool).
	Settle time.Duration
	// MinRequests is how many requests (decayed over the demand's long time
	// constant) a group must have brought to be moved. Default 4.
	MinRequests float64
	// FollowWithin is how long after a move its group's requests must
	// have shifted to the target (half its demand there) for the pin to
	// stay. Default 60 s: twice the demand's time constant, by which a
	// group that followed shows 86% of its demand at the target.
	FollowWithin time.Duration
	// MaxPins bounds the pins of one endpoint (snapshot.MaxPins).
	MaxPins int
	// Sureness is how many standard errors of the loads it changes a
	// move's gain must exceed. Default 1.25, with each shrunk rate's
	// variance as estimates gives it: TestSimulatedPool evens 35 of its 40
	// b2b-saas pools that begin more than 5% unbalanced, and no plan of
	// TestSimulatedUnequalGroups leaves code-gen's busiest endpoint busier.
	// Run once over three more hundred seeds each (not kept): 28-36 evened
	// and still no losing plan; at 1, 3 losing plans in 400 code-gen pools;
	// at 1.5, as few as 25 of 34 b2b-saas pools evened.
	Sureness float64
	// Room is the most KV-cache usage at which an endpoint takes a moved
	// group (a move's target, either end of a swap), and then only with no
	// request waiting and its usage not rising (filling). Default 0.8. The
	// group's first request there prefills its whole prefix cold, and until
	// the requests of the groups it had end, the engine holds their
	// prefixes and the new one; on a full cache the batch's next decode
	// steps find no blocks and the engine preempts. b2b-saas's engines ran
	// 77% full at 24 req/s, where swaps cost nothing the bench could see,
	// and 90% at 48, where one preempted 120 requests and put that stage's
	// TTFT p90 at 3.8 s (a group's prefix is 11% of the cache there).
	// Past the room, a move waits for a quieter minute.
	Room float64
}

func (c *Config) defaults() {
	if c.Threshold <= 0 {
		c.Threshold = 0.05
	}
	if c.MinGain <= 0 {
		c.MinGain = 0.02
	}
	if c.Cooldown <= 0 {
		c.Cooldown = 30 * time.Second
	}
	if c.Settle <= 0 {
		c.Settle = 2 * c.Cooldown
	}
	if c.MinRequests <= 0 {
		c.MinRequests = 4
	}
	if c.FollowWithin <= 0 {
		c.FollowWithin = 2 * demand.DefaultTimeConstant
	}
	if c.MaxPins <= 0 {
		c.MaxPins = snapshot.MaxPins
	}
	if c.Sureness <= 0 {
		c.Sureness = 1.25
	}
	if c.Room <= 0 {
		c.Room = 0.8
	}
}

// Endpoint is an endpoint of a pool as the planner sees it: its address
// and the load its engine last reported, which says whether it has room
// for a moved group (Config.Room). An engine that reports no KV-cache
// usage (llama-server) reads empty: only its queue can stop a move.
type Endpoint struct {
	Addr         string
	Waiting      int     // requests queued at the engine
	KVCacheUsage float64 // the fraction of its KV-cache blocks in use
}

// A cache filling is one whose usage reads more than fillingBy above its
// mean over fillTime, about the life of a request: its batch is growing,
// and what it holds now says little of what it will hold when a moved
// group's first requests land. On b2b-saas a swap made about 4 s into the 48
// req/s stage, its targets' caches 78% full on their way to 90%,
// preempted 350 requests in that stage.
const (
	fillingBy = 0.05
	fillTime  = 5 * time.Second
)

// usageMean is an endpoint's KV-cache usage averaged over fillTime.
type usageMean struct {
	mean float64
	at   time.Time
}

// homeShare is the share of a group's demand one endpoint must draw for
// the group to count as that endpoint's, and movable.
const homeShare = 0.9

// maxMembers bounds the groups of one endpoint a plan considers moving,
// the most demanding first: swaps are tried pairwise.
const maxMembers = 64

// Planner keeps the pins. It is not safe for concurrent use.
type Planner struct {
	cfg   Config
	pins  map[uint64]pin
	pools map[string]*poolState
	// resting are the groups moved, or whose pin was dropped, and when:
	// not moved again for restFor.
	resting map[uint64]time.Time
	usage   map[string]*usageMean // by endpoint
}

// restFor is how long a group is left where it is after a move, or after
// its requests did not follow a pin (then where the policy puts it). Each
// move costs a cold prefill, and under load a stall of the batch it lands
// in; the figures that chose it are estimates, and the smallest group of a
// pool is every swap's best partner: with 30 s between moves, a quick
// ladder saw one group swapped five times in three minutes, and lost its
// knee. What kept a group from its target (a saturated batch, a long
// queue) lasts too.
const restFor = 10 * time.Minute

type pin struct {
	endpoint string
	since    time.Time
}

type poolState struct {
	first, last time.Time // first demand seen, last move
	// dropped is when a pin in the pool was last dropped: its group's
	// requests did not follow, so the pool had no room for a move (the
	// target saturated or queued), and for restFor it makes none. On
	// mixed, of three swaps in five minutes two had their pins dropped
	// and one was planned at the instant of such a drop: each swap a pair
	// of cold prefills under load.
	dropped time.Time
}

// New returns a Planner.
func New(cfg Config) *Planner {
	cfg.defaults()
	return &Planner{cfg: cfg, pins: map[uint64]pin{}, pools: map[string]*poolState{}, resting: map[uint64]time.Time{},
		usage: map[string]*usageMean{}}
}

// Move is one group moved, or a move undone.
type Move struct {
	Pool     string
	Key      uint64
	From, To string
	Rate     float64 // the group's demand, output tokens per second
	// Dropped: the group's pin to From is dropped, since its requests did
	// not follow it (To is empty), and the group is left to the policy.
	Dropped bool
}

// Plan looks at every pool (name to its endpoints that can take
// requests) with the groups' demand as of now, drops the pins that no
// longer hold, and makes at most one move or swap per pool. It returns the
// moves made, and the pins dropped because their groups did not follow.
func (p *Planner) Plan(now time.Time, groups []demand.Group, pools map[string][]Endpoint) []Move {
	poolOf := map[string]string{}
	for name, eps := range pools {
		for _, e := range eps {
			poolOf[e.Addr] = name
			p.observe(e, now)
		}
	}
	for addr := range p.usage {
		if poolOf[addr] == "" {
			delete(p.usage, addr)
		}
	}
	seen := make(map[uint64]bool, len(groups))
	for _, g := range groups {
		seen[g.Key] = true
	}
	for k, pn := range p.pins {
		if !seen[k] || poolOf[pn.endpoint] == "" {
			delete(p.pins, k)
		}
	}
	for k, at := range p.resting {
		if now.Sub(at) > restFor {
			delete(p.resting, k)
		}
	}
	var out []Move
	names := make([]string, 0, len(pools))
	for name := range pools {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if len(pools[name]) < 2 {
			continue
		}
		out = p.planPool(now, name, pools[name], groups, out)
	}
	return out
}

// member is a group that may move: homed at one endpoint, recurring, not
// resting.
type member struct {
	gi   int // its index in the plan's groups
	home int // endpoint index
}

// place is where a group's demand falls in a pool's plan: at its home (an
// endpoint index), or split by its shares (home -1, frac per endpoint), or
// nowhere (home -2: outside the pool, or pinned in another).
type place struct {
	home int
	frac []float64
}

// candidate is a move, or a swap of g (from a to b) and h (from b to a).
type candidate struct{ g, h, a, b int }

func (p *Planner) planPool(now time.Time, name string, eps []Endpoint, groups []demand.Group, out []Move) []Move {
	idx := make(map[string]int, len(eps))
	roomy := make([]bool, len(eps))
	for i, e := range eps {
		idx[e.Addr] = i
		roomy[i] = e.Waiting == 0 && e.KVCacheUsage <= p.cfg.Room &&
			e.KVCacheUsage <= p.usage[e.Addr].mean+fillingBy
	}
	whole := p.estimates(groups, idx, -1)
	places := make([]place, len(groups))
	homed := make([]int, len(eps))
	var members []member
	for gi, g := range groups { // the most demanding first
		places[gi].home = -2
		if whole[gi].rate <= 0 {
			continue
		}
		home, best, bestRate, inPool := -1, -1, 0.0, 0.0
		for _, s := range g.Shares {
			if i, ok := idx[s.Endpoint]; ok {
				inPool += s.Rate
				if s.Rate > bestRate {
					best, bestRate = i, s.Rate
				}
			}
		}
		if pn, ok := p.pins[g.Key]; ok {
			i, in := idx[pn.endpoint]
			switch {
			case !in:
				continue // pinned in another pool
			case now.Sub(pn.since) > p.cfg.FollowWithin && shareAt(g, pn.endpoint) < 0.5:
				// Its requests do not follow the pin: the target cannot
				// take them (saturated, slow); let the policy have them.
				delete(p.pins, g.Key)
				p.resting[g.Key] = now
				if st := p.pools[name]; st != nil {
					st.dropped = now
				}
				out = append(out, Move{Pool: name, Key: g.Key, From: pn.endpoint, Rate: whole[gi].rate, Dropped: true})
			default:
				home = i
			}
		}
		if home < 0 && best >= 0 && bestRate >= homeShare*inPool {
			home = best
		}
		places[gi].home = home
		if home >= 0 {
			if _, rests := p.resting[g.Key]; !rests && g.Requests >= p.cfg.MinRequests && homed[home] < maxMembers {
				homed[home]++
				members = append(members, member{gi, home})
			}
			continue
		}
		places[gi].frac = make([]float64, len(eps))
		for _, s := range g.Shares {
			if i, ok := idx[s.Endpoint]; ok {
				places[gi].frac[i] = s.Rate / inPool
			}
		}
	}
	if load, _ := loads(places, whole, len(eps)); slices.Max(load) <= 0 {
		return out
	}
	st := p.pools[name]
	if st == nil {
		st = &poolState{first: now}
		p.pools[name] = st
	}
	if now.Sub(st.first) < p.cfg.Settle || (!st.last.IsZero() && now.Sub(st.last) < p.cfg.Cooldown) ||
		(!st.dropped.IsZero() && now.Sub(st.dropped) < restFor) {
		return out
	}
	// A move is chosen on one half of the groups' requests and must hold
	// on the other: the best of many candidate moves is the one whose
	// figures read highest by chance, and a half it was not chosen on
	// carries none of that luck.
	halves := [2][]estimate{p.estimates(groups, idx, 0), p.estimates(groups, idx, 1)}
	for h := range halves {
		c, ok := p.choose(places, members, halves[h], roomy)
		if !ok || !p.holds(c, places, members, halves[1-h], len(eps)) {
			continue
		}
		g := members[c.g]
		a, b := eps[c.a].Addr, eps[c.b].Addr
		if !p.pin(groups[g.gi].Key, b, now) {
			return out
		}
		out = append(out, Move{Pool: name, Key: groups[g.gi].Key, From: a, To: b, Rate: whole[g.gi].rate})
		if c.h >= 0 {
			m := members[c.h]
			if p.pin(groups[m.gi].Key, a, now) {
				out = append(out, Move{Pool: name, Key: groups[m.gi].Key, From: b, To: a,
					Rate: whole[m.gi].rate})
			}
		}
		st.last = now
		return out
	}
	return out
}

// observe folds e's KV-cache usage as of now into its mean.
func (p *Planner) observe(e Endpoint, now time.Time) {
	u := p.usage[e.Addr]
	if u == nil {
		p.usage[e.Addr] = &usageMean{e.KVCacheUsage, now}
		return
	}
	if dt := now.Sub(u.at); dt > 0 {
		u.mean += (1 - math.Exp(-dt.Seconds()/fillTime.Seconds())) * (e.KVCacheUsage - u.mean)
		u.at = now
	}
}

// loads returns each endpoint's demand, and the variance of its estimate,
// with the groups placed as places says.
func loads(places []place, est []estimate, n int) (load, variance []float64) {
	load, variance = make([]float64, n), make([]float64, n)
	for gi, pl := range places {
		switch {
		case pl.home >= 0:
			load[pl.home] += est[gi].rate
			variance[pl.home] += est[gi].variance
		case pl.frac != nil:
			for i, f := range pl.frac {
				load[i] += f * est[gi].rate
				variance[i] += f * f * est[gi].variance
			}
		}
	}
	return load, variance
}

// choose returns the best move or swap off the busiest endpoint by the
// estimates est, if the pool is unbalanced past the threshold and one
// gains enough, onto an endpoint with room for it (roomy, by endpoint).
//
// The best single move and the best swap are each judged by the busier of
// their two endpoints after them; a swap must beat the single move by the
// gain too, since it costs two cold prefills (with no single move, it must
// gain twice MinGain). Every move must gain more than Sureness standard
// errors of the two loads it changes, so that what it evens out is the
// groups' answers and traffic, not the estimates' noise.
func (p *Planner) choose(places []place, members []member, est []estimate, roomy []bool) (candidate, bool) {
	n := len(roomy)
	load, loadVar := loads(places, est, n)
	mean := 0.0
	for _, l := range load {
		mean += l
	}
	mean /= float64(n)
	a := 0
	for i := range load {
		if load[i] > load[a] {
			a = i
		}
	}
	if mean <= 0 || load[a] <= mean*(1+p.cfg.Threshold) {
		return candidate{}, false
	}
	gain := p.cfg.MinGain * mean
	single, swap := load[a]-gain, load[a]-gain
	best, bestSwap := candidate{g: -1, h: -1}, candidate{g: -1}
	for b := range n {
		if b == a || !roomy[b] {
			continue
		}
		sure := load[a] - p.cfg.Sureness*math.Sqrt(loadVar[a]+loadVar[b])
		for gi, g := range members {
			if g.home != a {
				continue
			}
			rg := est[g.gi].rate
			if m := max(load[a]-rg, load[b]+rg); m < single && m < sure {
				single, best = m, candidate{g: gi, h: -1, a: a, b: b}
			}
			for hi, h := range members {
				rh := est[h.gi].rate
				if h.home != b || rh >= rg || !roomy[a] {
					continue
				}
				if m := max(load[a]-rg+rh, load[b]+rg-rh); m < swap && m < sure {
					swap, bestSwap = m, candidate{g: gi, h: hi, a: a, b: b}
				}
			}
		}
	}
	if bestSwap.g >= 0 && swap < single-gain {
		return bestSwap, true
	}
	return best, best.g >= 0
}

// holds reports whether c, by the estimates est, lowers the pool's busiest
// endpoint by at least MinGain of the mean.
func (p *Planner) holds(c candidate, places []place, members []member, est []estimate, n int) bool {
	load, _ := loads(places, est, n)
	before, mean := slices.Max(load), 0.0
	for _, l := range load {
		mean += l
	}
	mean /= float64(n)
	rg := est[members[c.g].gi].rate
	load[c.a] -= rg
	load[c.b] += rg
	if c.h >= 0 {
		rh := est[members[c.h].gi].rate
		load[c.a] += rh
		load[c.b] -= rh
	}
	return mean > 0 && before-slices.Max(load) >= p.cfg.MinGain*mean
}

// estimate is a group's long-run demand in one pool, output tokens per
// second, and the variance of that estimate.
type estimate struct{ rate, variance float64 }

// estimates returns the long-run demand of each group in the pool of
// endpoints idx, in groups' order (zero for a group outside it), from all
// of its requests (half -1) or from one half of them (Group.Halves).
//
// A recurring group's arrival rate is shrunk toward the pool's mean by as
// much as the rates' spread is Poisson noise (an empirical-Bayes estimate):
// groups of equal traffic then differ only by their answers, which a few
// dozen requests measure well, while a group that really draws more keeps
// its own rate. The rates are estimated over minutes; at 0.5 requests a
// second a group's count still swings by a tenth, more than the spread of
// answers the planner is for.
//
// How far to shrink is itself an estimate, from a handful of groups, so
// a shrunk rate is not as sure as the pool's mean: its variance is
// Morris's (1983), which keeps a share of the group's own deviation. Taken
// as the shrunk Poisson variance alone (weight² of it), a pool whose groups
// really differ by less than the noise (code-gen sends the same 96
// prompts each stage, its groups 10 to 14 of them) read as equal groups
// known to a few percent, and 6 of 22 plans on simulated code-gen pools
// left the busiest engine busier (TestSimulatedUnequalGroups).
func (p *Planner) estimates(groups []demand.Group, idx map[string]int, half int) []estimate {
	out := make([]estimate, len(groups))
	samples := make([]demand.Sample, len(groups))
	var sum, sumSq, noise float64
	n := 0
	for gi, g := range groups {
		inPool := 0.0
		for _, s := range g.Shares {
			if _, ok := idx[s.Endpoint]; ok {
				inPool += s.Rate
			}
		}
		if inPool <= 0 || g.Rate <= 0 {
			continue
		}
		out[gi].rate = inPool / g.Rate // the pool's fraction, for now
		samples[gi] = g.Sample
		if half >= 0 {
			samples[gi] = g.Halves[half]
			if samples[gi].Requests <= 0 {
				// None of the group's requests fell in this half: its
				// arrivals read nothing (shrunk like any), its answers
				// are the whole's, as unsure as one answer.
				samples[gi].Answer, samples[gi].AnswerVar = g.Answer, g.Answer*g.Answer
			}
		}
		if g.Requests >= seenAgain {
			n++
			sum += samples[gi].Arrivals
			sumSq += samples[gi].Arrivals * samples[gi].Arrivals
			noise += samples[gi].ArrivalsVar
		}
	}
	weight := 1.0 // of a group's own rate against the pool's mean
	mean := 0.0
	if n >= minShrunk {
		mean = sum / float64(n)
		spread := (sumSq - float64(n)*mean*mean) / float64(n-1)
		noise /= float64(n)
		if excess := max(spread-noise, 0); excess+noise > 0 {
			weight = excess / (excess + noise)
		}
	}
	for gi := range groups {
		f, s := out[gi].rate, samples[gi]
		if f <= 0 {
			continue
		}
		if n >= minShrunk && groups[gi].Requests >= seenAgain {
			dev, shrink := s.Arrivals-mean, 1-weight
			s.Arrivals = mean + weight*dev
			s.ArrivalsVar = s.ArrivalsVar*(1-float64(n-1)/float64(n)*shrink) +
				2/float64(n-3)*shrink*shrink*dev*dev
		}
		rate, v := s.Demand()
		out[gi] = estimate{f * rate, f * f * v}
	}
	return out
}

// seenAgain is the fewest requests (decayed) of a group whose rate is
// shrunk toward its pool's: a group seen once may be a prompt that never
// comes back, and its rate is its own. Not MinRequests: a group that has
// not yet come MinRequests times reads low by chance as often as any, and
// left unshrunk it made its endpoint look light (a simulated pool whose
// four least-counted groups shared an endpoint drew a group there that
// left it the busiest).
const seenAgain = 2

// minShrunk is the fewest recurring groups whose spread of arrival rates
// is worth reading; with fewer, each keeps its own. At least 4: the
// shrunk rates' variance divides by the count less 3.
const minShrunk = 4

// pin pins key to endpoint unless the endpoint has MaxPins already, and
// rests the group.
func (p *Planner) pin(key uint64, endpoint string, now time.Time) bool {
	n := 0
	for _, pn := range p.pins {
		if pn.endpoint == endpoint {
			n++
		}
	}
	if n >= p.cfg.MaxPins {
		return false
	}
	p.pins[key] = pin{endpoint, now}
	p.resting[key] = now
	return true
}

func shareAt(g demand.Group, endpoint string) float64 {
	for _, s := range g.Shares {
		if s.Endpoint == endpoint && g.Rate > 0 {
			return s.Rate / g.Rate
		}
	}
	return 0
}

// Pins returns the keys of the groups pinned to endpoint, sorted.
func (p *Planner) Pins(endpoint string) []uint64 {
	var out []uint64
	for k, pn := range p.pins {
		if pn.endpoint == endpoint {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
