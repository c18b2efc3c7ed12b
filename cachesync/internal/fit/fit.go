// Package fit fits the latency models of shared/predict online, one per
// endpoint: least squares of the relative error over exponentially
// forgotten samples, held near the endpoint's default model by a prior,
// with non-negative coefficients and a prefilled token's cost no less than
// half the prior's (minTokenCost).
//
// Relative, because time to first token is heavy-tailed: most requests of
// a warm pool take a step or two, and a few (preempted, queued behind a
// burst) take fifty times as long. Squared seconds let those few set the
// coefficients and miss every ordinary request by half; squared relative
// error weighs each request alike, which is also how the error is judged
// (the median absolute percentage error). Fitted offline to the outcomes of
// a b2b-saas bench run's 40 and 48 req/s stages (4 engines, 1,000 and 1,200
// requests, dumped by a cachesync patched for the purpose), the same terms
// miss by a median of 19% and 20% fitted relatively, 59% and 152% in
// squared seconds. TestHeavyTail pins the difference on synthetic data.
//
// Each sample adds its outer product to a small normal-equation system
// (4 unknowns for TTFT, 2 for ITL) after decaying the old ones, so a fit
// costs constant memory and follows an endpoint whose behaviour drifts
// (a new model version, another accelerator) within a few hundred samples.
// Solving is coordinate descent on the regularised quadratic, projected on
// the non-negative orthant: exact per coordinate, a few dozen sweeps to
// converge for systems this small.
package fit

import (
	"math"

	"github.com/kvroute/kvroute/shared/predict"
)

// Forget is the weight a sample keeps per newer sample: about the last
// 1/(1-Forget) = 500 samples count.
const Forget = 0.998

// priorWeight is how many samples' worth the prior counts for.
const priorWeight = 4

// The prior weighs on each coefficient as if its feature spread at least
// this much (a standard deviation, in the feature's unit): a fit is used
// at loads far from those it has seen, and data that barely varies a term
// must not set its slope. Observed on the A100 cost model: a warm-up's
// ITL samples at batches of 1 to 3 fitted 15 ms per running request (the
// truth is about 0.6 ms), which the policy read as a reason to leave
// every warm engine.
var (
	ttftSpread = [predict.NumTTFT]float64{0, 1000, 4, 2, 0.01} // intercept (free), tokens, running, waiting, seconds of step left
	itlSpread  = [predict.NumITL]float64{0, 16}                // intercept (free), running
)

// minTokenCost is the least share of the prior's cost of a prefilled token
// (the calibrated prefill rate's) the fit may settle on. An engine prefills
// no faster than its rate, but the samples can say otherwise: requests
// whose prompt the index took for uncached while the engine held it
// (approximate endpoints, whose index is the gateways' reports) answer
// within a step, and weighed by their relative error they outweigh the
// real cold prefills. In one b2b-saas run an approximate engine's fit
// priced 1,850 uncached tokens at 52-99 ms (the precise engines' at
// 170-210), a copy of a 6,000-token prefix looked cheaper than a queue, and
// the copies broke the pool at 40 req/s where the precise arm reached 56.
const minTokenCost = 0.5

// system is the decayed normal equations of one fit, of at most
// predict.NumTTFT unknowns.
type system struct {
	a       [predict.NumTTFT][predict.NumTTFT]float64
	b       [predict.NumTTFT]float64
	sum, sq [predict.NumTTFT]float64 // decayed Σ w·x_j and Σ w·x_j², for the prior's scale
	weight  float64                  // decayed Σ w
	count   float64                  // decayed sample count
	samples uint32
}

// Model fits one endpoint's TTFT and ITL models.
type Model struct {
	ttft system
	itl  system
}

// AddTTFT adds an observed time to first token, in seconds, with the terms
// the decision saw.
func (m *Model) AddTTFT(f predict.Features, seconds float64) {
	if !(seconds > 0) || math.IsInf(seconds, 0) {
		return
	}
	x := f.Vector()
	m.ttft.add(x[:], seconds, 1/(seconds*seconds))
}

// AddITL adds an observed inter-token latency of decoding, in seconds per
// token, with the batch it ran in.
func (m *Model) AddITL(running, seconds float64) {
	if !(seconds > 0) || math.IsInf(seconds, 0) {
		return
	}
	x := [predict.NumITL]float64{1, running}
	m.itl.add(x[:], seconds, 1)
}

// add adds a sample with weight w: 1/y² makes the fit minimise the
// squared relative error.
func (s *system) add(x []float64, y, w float64) {
	for i := range x {
		for j := range x {
			s.a[i][j] = Forget*s.a[i][j] + w*x[i]*x[j]
		}
		s.b[i] = Forget*s.b[i] + w*x[i]*y
		s.sum[i] = Forget*s.sum[i] + w*x[i]
		s.sq[i] = Forget*s.sq[i] + w*x[i]*x[i]
	}
	s.weight = Forget*s.weight + w
	s.count = Forget*s.count + 1
	s.samples++
}

// Fit returns the fitted model, starting from (and held near) prior.
func (m *Model) Fit(prior predict.Model) predict.Model {
	out := prior
	var p5 [predict.NumTTFT]float64
	for i, c := range prior.TTFTCoef {
		p5[i] = float64(c)
	}
	var lo [predict.NumTTFT]float64
	lo[1] = minTokenCost * p5[1]
	for i, c := range m.ttft.solve(p5[:], ttftSpread[:], lo[:]) {
		out.TTFTCoef[i] = float32(c)
	}
	var p3 [predict.NumTTFT]float64
	for i, c := range prior.ITLCoef {
		p3[i] = float64(c)
	}
	for i, c := range m.itl.solve(p3[:predict.NumITL], itlSpread[:], make([]float64, predict.NumITL)) {
		out.ITLCoef[i] = float32(c)
	}
	out.TTFTSamples, out.ITLSamples = m.ttft.samples, m.itl.samples
	return out
}

// solve minimises Σ w (y - x·β)² + μ Σ_j v_j (β_j - prior_j)² over β >= lo,
// where v_j is feature j's (weighted) variance or spread_j², whichever is
// larger, and μ is priorWeight samples of the average weight, so the prior
// weighs like priorWeight samples whatever the feature's scale,
// and counts only where the samples do not pin the coefficient down: along
// a feature with a large mean and little spread, the mean square would let
// the prior outweigh the data.
func (s *system) solve(prior, spread, lo []float64) []float64 {
	n := len(spread)
	beta := make([]float64, n)
	copy(beta, prior)
	if s.weight == 0 {
		return beta
	}
	var a [predict.NumTTFT][predict.NumTTFT]float64
	var b [predict.NumTTFT]float64
	for i := range n {
		mean, msq := s.sum[i]/s.weight, s.sq[i]/s.weight
		reg := priorWeight * s.weight / s.count * max(msq-mean*mean, spread[i]*spread[i], 1e-18)
		for j := range n {
			a[i][j] = s.a[i][j]
		}
		a[i][i] += reg
		b[i] = s.b[i] + reg*prior[i]
	}
	for range 1000 {
		moved := 0.0
		for j := range n {
			r := b[j]
			for k := range n {
				if k != j {
					r -= a[j][k] * beta[k]
				}
			}
			v := max(lo[j], r/a[j][j])
			moved = max(moved, math.Abs(v-beta[j])/(math.Abs(beta[j])+1e-12))
			beta[j] = v
		}
		if moved < 1e-9 {
			break
		}
	}
	return beta
}
