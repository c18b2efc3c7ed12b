// Package predict is kvroute's latency model: an endpoint's time to first
// token and inter-token latency as linear functions of what it is doing,
// fitted online by cachesync (Fitter) and evaluated by the filter on every
// request (Model.TTFT, Model.ITL) without allocating.
//
// The terms are what a continuous-batching engine spends a step on:
//
//	TTFT = a0 + a1·(uncached + backlog) + a2·running + a3·waiting + a4·wait   seconds
//	ITL  = b0 + b1·running                                                    seconds per token
//
// uncached is this request's prompt tokens the endpoint must prefill,
// backlog the uncached prompt tokens ahead of it: one term, since a token
// prefilled costs the same whoever's it is, and because routing itself
// makes the two move together (a warm endpoint has both little to prefill
// and a queue), two coefficients would split at the noise's whim and
// could price the cache at nothing. running and waiting are the endpoint's
// requests in its batch and in its queue. wait is how long the engine's
// step under way has left to run: a request that arrives mid-step is
// scheduled only at the next one, and on a fully cached prompt that wait
// is half of the time to first token. The gateway sees the engine's steps
// end in its own streams (each step sends every streaming request a
// token), so it knows the wait to a few milliseconds while it streams from
// the engine, and puts half a step for it otherwise. ITL is that of decoding steps
// that carry no prefill (a step with a prefill chunk takes as long as the
// chunk, which the policy prices through TTFT and what it costs the batch):
// cachesync fits it only from intervals in which the engine prefilled
// little. Coefficients are kept non-negative: more work never predicts
// less time. A model with too few samples is not trusted; Default stands in
// for it, built from the endpoint's calibrated prefill rate.
package predict

import (
	"math"
)

// NumTTFT and NumITL are the model's coefficient counts.
const (
	NumTTFT = 5
	NumITL  = 2
)

// Features are one decision's terms on one endpoint.
type Features struct {
	Uncached, Backlog, Running, Waiting float64
	// Wait is the time the engine's step under way has left, in seconds.
	Wait float64
}

// Vector returns the features as the TTFT model's coefficients multiply
// them: a constant 1 first.
func (f *Features) Vector() [NumTTFT]float64 {
	return [NumTTFT]float64{1, f.Uncached + f.Backlog, f.Running, f.Waiting, f.Wait}
}

// Model is one endpoint's fitted latency model.
type Model struct {
	TTFTCoef [NumTTFT]float32
	ITLCoef  [NumITL]float32
	// Samples are the observations behind each fit; a fit is used from
	// MinSamples on.
	TTFTSamples, ITLSamples uint32
}

// MinSamples is how many observations a fit needs before it is used.
const MinSamples = 64

// Default step costs, for an endpoint nothing is known of but its prefill
// rate: one engine step (about 10 ms for a 32B model on H100s, vLLM's usual
// scale) and its growth per sequence in the batch (a decoding sequence adds
// its attention over its context, a few percent of a step).
const (
	DefaultStep       = 0.010
	DefaultPerRunning = DefaultStep / 32
)

// Default is the model of an endpoint with no fits: prefill at rate
// tokens/s behind the backlog, one step per token while decoding.
func Default(rate float64) Model {
	var m Model
	m.TTFTCoef = [NumTTFT]float32{DefaultStep, float32(1 / rate), 0, 0, 1}
	m.ITLCoef = [NumITL]float32{DefaultStep, DefaultPerRunning}
	return m
}

// TTFT predicts the time to first token, in seconds. It uses the
// coefficients as they are: Resolve first puts in a fallback for a fit with
// too few samples.
func (m *Model) TTFT(f Features) float64 {
	x := f.Vector()
	var t float64
	for i := range x {
		t += float64(m.TTFTCoef[i]) * x[i]
	}
	return t
}

// ITL predicts the inter-token latency, in seconds per token, with running
// requests in the batch, of decoding steps that carry no prefill.
func (m *Model) ITL(running float64) float64 {
	return float64(m.ITLCoef[0]) + float64(m.ITLCoef[1])*running
}

// Resolve returns m with each fit that has too few samples replaced by
// fallback's.
func (m Model) Resolve(fallback *Model) Model {
	if m.TTFTSamples < MinSamples {
		m.TTFTCoef = fallback.TTFTCoef
	}
	if m.ITLSamples < MinSamples {
		m.ITLCoef = fallback.ITLCoef
	}
	return m
}

// PerUncachedToken is the time to first token one more uncached prompt
// token adds, in seconds: also the step time a prefilled token costs
// everyone in the batch with it.
func (m *Model) PerUncachedToken() float64 { return float64(m.TTFTCoef[1]) }

// PerRunning is the inter-token latency one more running request adds, in
// seconds per token.
func (m *Model) PerRunning() float64 { return float64(m.ITLCoef[1]) }

// Valid reports whether every coefficient is a finite non-negative number
// (what a snapshot reader checks before using a model).
func (m *Model) Valid() bool {
	for _, c := range m.TTFTCoef {
		if !(c >= 0) || math.IsInf(float64(c), 0) {
			return false
		}
	}
	for _, c := range m.ITLCoef {
		if !(c >= 0) || math.IsInf(float64(c), 0) {
			return false
		}
	}
	return true
}
