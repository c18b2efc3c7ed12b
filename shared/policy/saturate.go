package policy

import (
	"time"

	"github.com/kvroute/kvroute/shared/snapshot"
)

// saturateDecode marks, in ModeAuto with no SLO stated, the candidates
// whose batch, once its queue is in it, is predicted an inter-token
// latency more than decodeSaturation times the pool's lowest: saturated by
// their decode load. While cachesync's planner is moving groups (the
// manifest holds a pin), the ratio must also have lasted as long as the
// pool's quickest batch takes to turn over (lasting). choose passes them
// over while any other may take the request, and a saturated holder keeps
// no copier waiting (keepsCopiers), so a holder stays sticky until its
// batch runs that much slower than another endpoint's.
//
// The price cannot see this by itself: it prices one request, and a copy's
// prefill, which stalls every request decoding at the copier, is paid now
// while the decode load it relieves is paid by every later request of the
// prefix. Where a prefix's answers are long, that load lasts: on mixed
// (answers of 20 to 1,500 tokens), an engine holding groups whose answers
// ran long had 215 requests decoding at 97 ms a token while another had
// 120 at 62 ms, and the holder still priced lower than a copy; its
// requests all missed a 50 ms TPOT. A stated TPOT SLO moved them (the
// kvroute-slo arm); without one, this ratio does.
//
// It is the batch's ITL, not the request's time per token (meets): a
// copier's own cold prefill is its price's business, not a sign of its
// load. And its queue counts: an engine whose cache is too full to admit
// its queue runs a small batch fast; compared by its running requests
// alone, it made every other endpoint look saturated, drew the pool's
// traffic, and thrashed (on mixed at 64 req/s, 523 requests to it against
// 122 to two others, its hit rate 67%, TTFT p90 188 s).
//
// Whether the ratio lasts is remembered per slot (Picker.over), as of
// r.Now, pins or not, so that a load that began before the first pin has
// its age; a zero Now remembers nothing. It returns how many it marked.
func (p *Picker) saturateDecode(m *snapshot.Manifest, cands []cand, now time.Time) int {
	best := -1.0
	for i := range cands {
		if c := &cands[i]; c.eligible && (best < 0 || c.loaded < best) {
			best = c.loaded
		}
	}
	lasts := int64(decodeHorizon * best * float64(time.Second))
	at, moving := now.UnixNano(), m.HasPins()
	n := 0
	for i := range cands {
		c := &cands[i]
		if !c.eligible {
			continue
		}
		ratio := c.loaded / best
		c.saturated = ratio > decodeSaturation
		if !now.IsZero() {
			lasted := p.over[i].lasting(m.Endpoint(i).Since(), ratio, at, lasts)
			if moving {
				c.saturated = lasted
			}
		}
		if c.saturated {
			n++
		}
	}
	return n
}

// decodeSaturation is how many times the pool's lowest predicted ITL an
// endpoint's may be before it counts as saturated. In every workload of
// the bench but mixed, the chosen endpoint's predicted ITL was within 1.15
// of the runner-up's in 99% of decisions (1.11 on b2b-saas, 1.12 on the
// 60% sweep); on mixed, over 1.3 in 3-18%.
const decodeSaturation = 1.3

// decodeCalm is the ratio below which an endpoint's batch is back among
// the others' (the 1.15 above): between it and decodeSaturation, a
// lasting load that a burst's lull dips under the bar keeps its clock.
const decodeCalm = 1.15

// overload is what a Picker remembers of one slot's decode load: since
// when its ratio to the pool's lowest ITL has been past decodeSaturation
// without falling under decodeCalm (zero: it is not), for the endpoint
// that took the slot at generation slot.
type overload struct {
	slot uint64
	from int64 // Unix nanoseconds, as are seen and lasting's times
	// seen is the last observation: a load not seen for a turnover (the
	// endpoint ineligible, for this request or for its health, or no
	// traffic) cannot be said to have lasted.
	seen int64
}

// lasting records the slot's ratio as of now and reports whether it has
// been past decodeSaturation for lasts.
//
// A load that passes is not one to release requests from a holder for:
// each release copies a prefix to another endpoint, which then draws its
// traffic for good. Just after a group moved between two b2b-saas engines
// (policy item 11), the cold prefills it brought them ran their batches
// 1.30-1.41 times the quickest's for 4-12 s, and every request released
// then went to an engine holding none of its prompt, at two to four times
// the holder's price: the groups were split for the rest of the run, and
// the knee fell from 64 req/s to 56 and 24. The pool's quickest batch
// turns over in about a chat answer's decoding at its ITL
// (decodeHorizon); a load that outlasts that is the answers of what the
// endpoint holds, not a stall draining.
//
// Without moves the wait is not asked: the stalls it sits out were a
// move's, and elsewhere it only delays relieving a load that lasts (on
// mixed, auto's goodput with it read 0.91-1.00x without, in three pairs of
// runs, mostly the warm-up's placement).
func (o *overload) lasting(slot uint64, ratio float64, now, lasts int64) bool {
	if o.slot != slot || now-o.seen > lasts {
		*o = overload{slot: slot}
	}
	o.seen = now
	switch {
	case ratio > decodeSaturation:
		if o.from == 0 {
			o.from = now
		}
	case ratio < decodeCalm:
		o.from = 0
	}
	return ratio > decodeSaturation && now-o.from >= lasts
}
