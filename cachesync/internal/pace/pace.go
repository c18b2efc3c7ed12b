// Package pace tells an engine that runs slower than its peers: a
// throttled GPU, a noisy neighbour, a degraded host.
//
// cachesync fits one latency model per deployment (engines serving the
// same model on the same KV-cache size), so that engines are compared by
// their load and not by the noise of separate fits; an engine that slows
// down alone moves its deployment's fit by its share of the samples, late,
// and looks to the policy just as fast as its peers. Its pace is the
// median ratio of its inter-token latency over its last Samples
// decode-only scrape intervals to what the deployment's model predicted
// for them, over the same median of its peers: the model's own error,
// which all share, cancels. A pace within Band of 1 is noise and scales
// nothing; past it, the engine's ITL model is scaled by how far past
// (Slowdown), so a slowed engine is priced as slow as it runs, with no
// step at the band's edge. Only slowdowns are priced:
// an engine faster than its peers is one the shared fit already favours
// by its lighter load, and a median of a few samples is no reason to
// prefer it further.
//
// Inter-token latency only, not time to first token. A decoding step's
// length is the engine's speed; a request's time to first token is also
// where it fell in a burst, and the gateway's step clock already sees a
// slowed engine's longer steps in its wait. Paced on time to first token
// too, on the mixed workload's bursts three of four healthy engines were
// priced 1.4-2.1x slower in turn.
package pace

import (
	"slices"
	"time"

	"github.com/kvroute/kvroute/shared/predict"
)

// Samples is how many ratios an engine's pace is the median of: a
// slowdown shows once it is in half of them (a slowed engine's
// decoding intervals come at the scrape interval, and fewer as its traffic
// leaves), and one odd interval moves nothing.
const Samples = 16

// MinSamples is the fewest ratios a median is read from.
const MinSamples = 8

// MaxAge is how long a ratio counts. An engine priced as slow draws
// little traffic, and so few new samples: its old ones expire, it is
// priced as its peers again, and the traffic that comes back measures it
// anew (as Envoy's outlier detection ejects a host for a while, not for
// good).
const MaxAge = time.Minute

// Band is how far from its peers' an engine's pace may be before it is
// priced: a median of 16 intervals strays by a few percent, and an
// engine's place in the routing (which groups it serves, how much it
// prefills between its decode-only intervals) moves it by more. No
// healthy engine's pace left the band in the b2b-saas, mixed and
// decode-heavy bench runs of 2026-12-05.
const Band = 0.25

// Engine is one engine's recent ratios of observed to predicted
// inter-token latency. It is not safe for concurrent use.
type Engine struct {
	r ring
}

// Add records an interval's observed over predicted inter-token latency,
// at now.
func (e *Engine) Add(ratio float64, now time.Time) { e.r.add(ratio, now) }

// Slowdown returns the factor by which e's inter-token latency runs slower
// than its peers' at now, past Band: 1 when it does not, or when e has too
// few recent samples to tell. Peers with too few are left out; with none
// left, the deployment's model is the reference.
func Slowdown(e *Engine, peers []*Engine, now time.Time) float64 {
	mine, ok := e.r.median(now)
	if !ok {
		return 1
	}
	var theirs []float64
	for _, p := range peers {
		if m, ok := p.r.median(now); ok {
			theirs = append(theirs, m)
		}
	}
	ref := 1.0 // the deployment's model, when no peer can tell
	if len(theirs) > 0 {
		ref = median(theirs)
	}
	if !(ref > 0) {
		return 1
	}
	return max(1, mine/ref/(1+Band))
}

// Scale returns m with its inter-token latency scaled by factor: the fit's,
// or fallback's while the fit has too few samples (predict.Model.Resolve).
// The scaled part counts as fitted: it is no longer the fallback's.
func Scale(m predict.Model, fallback *predict.Model, factor float64) predict.Model {
	if factor == 1 {
		return m
	}
	if m.ITLSamples < predict.MinSamples {
		m.ITLCoef = fallback.ITLCoef
	}
	for i := range m.ITLCoef {
		m.ITLCoef[i] *= float32(factor)
	}
	m.ITLSamples = max(m.ITLSamples, predict.MinSamples)
	return m
}

// ring is the last Samples ratios and when each came.
type ring struct {
	r    [Samples]float64
	at   [Samples]time.Time
	next int
}

func (r *ring) add(x float64, now time.Time) {
	if !(x > 0) || x > 1e6 {
		return
	}
	r.r[r.next], r.at[r.next] = x, now
	r.next = (r.next + 1) % Samples
}

// median returns the median of the ratios of the last MaxAge before now,
// if there are MinSamples of them.
func (r *ring) median(now time.Time) (float64, bool) {
	var buf [Samples]float64
	s := buf[:0]
	for i, x := range r.r {
		if x > 0 && now.Sub(r.at[i]) <= MaxAge {
			s = append(s, x)
		}
	}
	if len(s) < MinSamples {
		return 0, false
	}
	return median(s), true
}

// median sorts s and returns its median.
func median(s []float64) float64 {
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}
