package fit

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/shared/predict"
)

// TestRecoversTTFT: samples drawn from a known linear TTFT (with noise)
// give back its coefficients, and predictions within a few percent.
func TestRecoversTTFT(t *testing.T) {
	truth := [predict.NumTTFT]float64{0.02, 1.0 / 20000, 0.002, 0.05, 0.8}
	r := rand.New(rand.NewPCG(1, 2))
	var m Model
	for range 2000 {
		f := predict.Features{Uncached: r.Float64() * 8000, Backlog: r.Float64() * 30000, Running: float64(r.IntN(40)), Waiting: float64(r.IntN(5)), Wait: r.Float64() * 0.05}
		y := truth[0] + truth[1]*(f.Uncached+f.Backlog) + truth[2]*f.Running + truth[3]*f.Waiting + truth[4]*f.Wait
		m.AddTTFT(f, y*(1+0.05*r.NormFloat64()))
	}
	got := m.Fit(predict.Default(15928))
	if got.TTFTSamples != 2000 {
		t.Errorf("samples %d", got.TTFTSamples)
	}
	var worst float64
	for range 200 {
		f := predict.Features{Uncached: r.Float64() * 8000, Backlog: r.Float64() * 30000, Running: float64(r.IntN(40)), Waiting: float64(r.IntN(5)), Wait: r.Float64() * 0.05}
		want := truth[0] + truth[1]*(f.Uncached+f.Backlog) + truth[2]*f.Running + truth[3]*f.Waiting + truth[4]*f.Wait
		worst = max(worst, math.Abs(got.TTFT(f)-want)/want)
	}
	if worst > 0.05 {
		t.Errorf("worst prediction error %.1f%% with coefficients %v, truth %v", 100*worst, got.TTFTCoef, truth)
	}
}

// TestHeavyTail: one request in twenty taking thirty times its due (a
// preemption, a burst ahead of it) does not set the coefficients: the
// ordinary requests are still predicted within a few percent. A fit of
// squared seconds misses them by about half.
func TestHeavyTail(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	due := func(f predict.Features) float64 { return 0.02 + 0.001*f.Running + f.Wait }
	var m Model
	for i := range 2000 {
		f := predict.Features{Uncached: 10, Running: float64(5 + r.IntN(60)), Wait: r.Float64() * 0.04}
		y := due(f) * (1 + 0.03*r.NormFloat64())
		if i%20 == 0 {
			y *= 30
		}
		m.AddTTFT(f, y)
	}
	got := m.Fit(predict.Default(15928))
	var errs []float64
	for range 200 {
		f := predict.Features{Uncached: 10, Running: float64(5 + r.IntN(60)), Wait: r.Float64() * 0.04}
		errs = append(errs, math.Abs(got.TTFT(f)-due(f))/due(f))
	}
	slices.Sort(errs)
	if med := errs[len(errs)/2]; med > 0.1 {
		t.Errorf("median error %.0f%% on ordinary requests, coefficients %v", 100*med, got.TTFTCoef)
	}
}

// TestNonNegativeAndPrior: a term that never varies keeps its prior, and a
// term the data pushes below zero stops at zero.
func TestNonNegativeAndPrior(t *testing.T) {
	var m Model
	r := rand.New(rand.NewPCG(3, 4))
	for range 1000 {
		f := predict.Features{Uncached: r.Float64() * 4000, Running: float64(r.IntN(20))}
		// Time falls with more running requests: nonsense a fit must not learn.
		m.AddTTFT(f, 0.5+f.Uncached/10000-0.01*f.Running)
	}
	prior := predict.Default(10000)
	got := m.Fit(prior)
	if !got.Valid() {
		t.Fatalf("invalid fit %v", got.TTFTCoef)
	}
	if got.TTFTCoef[2] != 0 {
		t.Errorf("running coefficient %v, want 0 (never negative)", got.TTFTCoef[2])
	}
	if got.TTFTCoef[3] != prior.TTFTCoef[3] {
		t.Errorf("the unobserved waiting term %v moved from its prior %v", got.TTFTCoef[3], prior.TTFTCoef[3])
	}
}

// TestITLAndFallback: an ITL fit follows the batch size; a model with too
// few samples predicts with its fallback.
func TestITLAndFallback(t *testing.T) {
	var m Model
	for i := range 500 {
		running := float64(i % 50)
		m.AddITL(running, 0.012+0.0004*running)
	}
	got := m.Fit(predict.Default(15928))
	if p := got.ITL(30); math.Abs(p-0.024)/0.024 > 0.05 {
		t.Errorf("ITL at 30 running %.4f s, want 0.024", p)
	}
	var few Model
	few.AddTTFT(predict.Features{Uncached: 1000}, 9)
	fb := predict.Default(1000)
	fitted := few.Fit(fb)
	resolved := fitted.Resolve(&fb)
	if p := resolved.TTFT(predict.Features{Uncached: 1000}); math.Abs(p-fb.TTFT(predict.Features{Uncached: 1000})) > 1e-9 {
		t.Errorf("a one-sample fit predicted %.3f s, want the fallback's", p)
	}
	m.AddTTFT(predict.Features{}, math.NaN())
	m.AddITL(1, -1)
	if m.ttft.samples != 0 || m.itl.samples != 500 {
		t.Error("non-positive or NaN observations were taken")
	}
}

// TestNarrowBatchesDoNotSetTheSlope: a warm-up's ITL samples, at batches of
// 1 to 3 and with the stalls of an engine still prefilling now and then,
// say little about what 50 running requests cost; the fit must not
// extrapolate their noise into a slope (it did: 15 ms per request, against
// a true 0.6 ms) and keeps the prior's instead.
func TestNarrowBatchesDoNotSetTheSlope(t *testing.T) {
	var m Model
	r := rand.New(rand.NewPCG(5, 6))
	for range 120 {
		running := float64(1 + r.IntN(3))
		y := 0.017 + 0.0006*running
		if running == 3 && r.IntN(2) == 0 {
			y += 0.03 // a prefill chunk in the interval
		}
		m.AddITL(running, y)
	}
	got := m.Fit(predict.Default(6500))
	truth := 0.017 + 0.0006*50
	if p := got.ITL(50); p > 2*truth {
		t.Errorf("ITL at 50 running predicted %.0f ms from batches of 1-3 (coefficients %v), truth %.0f ms", 1000*p, got.ITLCoef, 1000*truth)
	}
}

// TestTokenCostFloor: requests the index took for uncached but the engine
// had cached answer within a step; weighed by their relative error they
// would price a prefilled token at next to nothing, and a cold prefix's
// copy with it. The fit keeps a token's cost at no less than half what
// the calibrated prefill rate says.
func TestTokenCostFloor(t *testing.T) {
	const rate = 16000.0
	r := rand.New(rand.NewPCG(9, 9))
	var m Model
	for i := range 2000 {
		f := predict.Features{Uncached: 10, Running: float64(r.IntN(8)), Wait: r.Float64() * 0.02}
		y := 0.02 + f.Wait
		switch i % 10 {
		case 0: // a question the engine had prefilled before
			f.Uncached = 1850
		case 1: // a question it had not
			f.Uncached = 1850
			y += f.Uncached / rate
		}
		m.AddTTFT(f, y*(1+0.03*r.NormFloat64()))
	}
	got := m.Fit(predict.Default(rate))
	if c := float64(got.TTFTCoef[1]); c < minTokenCost/rate*(1-1e-6) {
		t.Errorf("a prefilled token costs %.3g s, under %.0f%% of the calibrated %.3g s", c, 100*minTokenCost, 1/rate)
	}
	cold := predict.Features{Uncached: 11000}
	if got, floor := got.TTFT(cold), minTokenCost*11000/rate; got < floor {
		t.Errorf("a cold 11,000-token prompt predicted at %.3f s, under %.3f s", got, floor)
	}
}
