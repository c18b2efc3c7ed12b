package policy

import (
	"math"
	"math/bits"
	"slices"

	"github.com/kvroute/kvroute/shared/snapshot"
)

// choose picks among the candidates placeNew and placeCopies left roomy.
// Without SLOs: the least price, near ties (within Config.TieTolerance)
// broken by random among those holding the most of the prompt, of those
// not saturated by their decode load (saturateDecode) if any. With SLOs:
// of the candidates predicted to meet them, the best cached (within a
// block), by least price among those; if none meets them, the least price
// (meets false). An endpoint holding less of the prompt than the most any
// holds must meet them with sloRoom to spare to be chosen for them; one
// that meets them without is still one that meets them (meets true). It
// also returns the runner-up: the least price among the others, -1 if
// there is none. Before all that, the endpoint the request's group is
// pinned to (pin, -1 for none) takes it if it follows the pin (follows).
func (p *Picker) choose(cands []cand, j *job, random uint64, pin int) (pick, runner int, meets bool) {
	tol := p.cfg.TieTolerance.Seconds()
	slo := j.slo()
	pick = -1
	if pin >= 0 && follows(cands, pin, j) {
		pick = pin
	}
	if slo && pick < 0 {
		best := -1.0
		for i := range cands {
			c := &cands[i]
			c.sel = c.roomy && c.meets(j, sloRoom)
			if c.sel && c.cached > best {
				best = c.cached
			}
		}
		if best >= 0 {
			for i := range cands {
				c := &cands[i]
				c.sel = c.sel && c.cached >= best-j.blockTokens
			}
			pick = least(cands, tol, j.blockTokens, random)
		}
		if pick < 0 {
			// Kept at its holder for want of room to spare, a request
			// another endpoint would serve within the SLOs is not one to
			// shed.
			for i := range cands {
				if c := &cands[i]; c.roomy && c.meets(j, 0) {
					meets = true
					break
				}
			}
		}
	}
	meets = meets || !slo || pick >= 0
	for _, calm := range [2]bool{true, false} {
		if pick >= 0 {
			break
		}
		for i := range cands {
			c := &cands[i]
			c.sel = c.roomy && !(calm && c.saturated)
		}
		pick = least(cands, tol, j.blockTokens, random)
	}
	runner = -1
	for i := range cands {
		if c := &cands[i]; c.eligible && i != pick && (runner < 0 || c.price < cands[runner].price) {
			runner = i
		}
	}
	return pick, runner, meets
}

// pinnedTo returns the candidate the group of a prompt of hashes is
// pinned to in m, -1 if none.
func pinnedTo(m *snapshot.Manifest, hashes []uint64, cands []cand) int {
	if !m.HasPins() {
		return -1
	}
	key, ok := snapshot.GroupKey(hashes)
	if !ok {
		return -1
	}
	if t, ok := m.Pinned(key); ok && t < len(cands) {
		return t
	}
	return -1
}

// follows reports whether candidate t takes a request of a group pinned to
// it: it is eligible, not saturated by its decode load, meets the
// request's SLOs, and its first token is predicted within two cold
// prefills of the whole prompt of the quickest endpoint's: its own, which
// the move pays once, and one of queue. The planner moved the group for
// the decode load it brings over minutes; this request's own price, which
// a move's first request pays a cold prefill in, cannot weigh that
// (saturate.go says why), so the pin overrides the price, the copy rules
// and placement. It does not override what the pool's state of the moment
// says against it: then the request is routed as if unpinned, and the
// planner drops a pin its group's requests do not follow.
func follows(cands []cand, t int, j *job) bool {
	c := &cands[t]
	if !c.eligible || c.saturated || !c.meets(j, 0) {
		return false
	}
	for i := range cands {
		if q := &cands[i]; q.eligible && c.ttft > q.ttft+2*c.cold {
			return false
		}
	}
	return true
}

// sloRoom is the share of an SLO by which an endpoint holding less of the
// prompt than another must beat it to take the request for the SLO's
// sake: about the latency model's median error at steady load (6-11% in
// the bench). Without it, predictions a few milliseconds either side of a
// 50 ms TPOT SLO moved requests from their holder to copies priced two to
// eight times as dear, and those copies' prefills pushed the batches they
// joined over.
const sloRoom = 0.1

// least returns the selected candidate with the least price, picking
// uniformly at random among those within tol of it that hold the most of
// the prompt of those (within block tokens); -1 if none is selected. The
// tolerance spreads simultaneous first requests of different prefixes; it
// must not make a copy on a coin toss: in a b2b-saas warm-up an idle
// engine priced 2 ms above the holder, margin and all, won the toss and
// split a group for the rest of the run. Selection is a field, not a
// predicate: an indirect call per candidate is dear in Go's Wasm code.
func least(cands []cand, tol, block float64, random uint64) int {
	best := math.Inf(1)
	for i := range cands {
		if c := &cands[i]; c.sel && c.price < best {
			best = c.price
		}
	}
	if math.IsInf(best, 1) {
		return -1
	}
	limit := best + tol*(1+1e-9)
	most := -1.0
	for i := range cands {
		if c := &cands[i]; c.sel && c.price <= limit {
			most = max(most, c.cached)
		}
	}
	floor := most - block
	ties := 0
	for i := range cands {
		if c := &cands[i]; c.sel && c.price <= limit && c.cached >= floor {
			ties++
		}
	}
	k, _ := bits.Mul64(mix(random), uint64(ties))
	for i := range cands {
		if c := &cands[i]; c.sel && c.price <= limit && c.cached >= floor {
			if k == 0 {
				return i
			}
			k--
		}
	}
	return -1
}

// reason classifies a choice: affinity when the chosen endpoint holds
// (within a block) the most of the prompt of any, least-load when none
// holds any, saturated-release when a warmer one was priced out.
func reason(cands []cand, pick int, j *job) Reason {
	switch {
	case j.most < j.blockTokens:
		return ReasonLeastLoad
	case cands[pick].cached >= j.most-j.blockTokens:
		return ReasonAffinity
	}
	return ReasonSaturatedRelease
}

// Fallbacks appends to dst, cheapest first, up to n eligible endpoints of
// the last Pick other than its choice: where a retry should go next. It
// does not allocate once dst has room.
func (p *Picker) Fallbacks(dst []int, d *Decision, n int) []int {
	if d.Endpoint < 0 {
		return dst
	}
	start := len(dst)
	for len(dst)-start < n {
		next := -1
		cands := p.cands[:p.n]
		for i := range cands {
			c := &cands[i]
			if !c.eligible || i == d.Endpoint || slices.Contains(dst[start:], i) {
				continue
			}
			if next < 0 || c.price < cands[next].price {
				next = i
			}
		}
		if next < 0 {
			break
		}
		dst = append(dst, next)
	}
	return dst
}
