package pace

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/shared/predict"
)

var t0 = time.Date(2026, 12, 5, 20, 0, 0, 0, time.UTC)

// engine returns an engine whose ratios are ratio, jittered by ±jitter in
// turn, n of them, one a second up to t0.
func engine(ratio, jitter float64, n int) *Engine {
	e := new(Engine)
	for i := range n {
		r := ratio * (1 + jitter*float64(i%3-1))
		at := t0.Add(time.Duration(i-n+1) * time.Second)
		e.Add(r, at)
	}
	return e
}

func TestSlowdown(t *testing.T) {
	for _, tc := range []struct {
		name  string
		self  *Engine
		peers []*Engine
		want  float64
	}{
		{"as fast as its peers", engine(1, 0.1, Samples), []*Engine{engine(1, 0.1, Samples), engine(1, 0.1, Samples)}, 1},
		{"within the band", engine(1.2, 0.1, Samples), []*Engine{engine(1, 0.1, Samples), engine(1, 0.1, Samples)}, 1},
		{"eight times slower", engine(8, 0.1, Samples), []*Engine{engine(1, 0.1, Samples), engine(1, 0.1, Samples)}, 8 / (1 + Band)},
		// The model's own error is everyone's: it cancels.
		{"the model off for all, one slower", engine(0.4, 0.1, Samples), []*Engine{engine(0.05, 0.1, Samples), engine(0.05, 0.1, Samples)}, 8 / (1 + Band)},
		{"faster than its peers", engine(0.5, 0.1, Samples), []*Engine{engine(1, 0.1, Samples)}, 1},
		{"one slow peer does not make it fast", engine(1, 0.1, Samples), []*Engine{engine(1, 0.1, Samples), engine(1, 0.1, Samples), engine(8, 0.1, Samples)}, 1},
		{"too few of its own", engine(8, 0, MinSamples-1), []*Engine{engine(1, 0, Samples)}, 1},
		// With no peer to tell, the deployment's model is the reference.
		{"peers with too few", engine(8, 0, Samples), []*Engine{engine(1, 0, MinSamples-1)}, 8 / (1 + Band)},
		{"no peers", engine(8, 0, Samples), nil, 8 / (1 + Band)},
		{"no peers, within the band of the model", engine(1.2, 0, Samples), nil, 1},
	} {
		if got := Slowdown(tc.self, tc.peers, t0); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: slowdown %.3f, want %.3f", tc.name, got, tc.want)
		}
	}
}

// TestRecentSamples: the pace is that of the last Samples ratios of the
// last MaxAge, so an engine that recovers is priced as its peers again,
// and so is one whose slowness drove away the traffic that would show it.
func TestRecentSamples(t *testing.T) {
	peers := []*Engine{engine(1, 0, Samples)}
	e := engine(8, 0, Samples)
	if Slowdown(e, peers, t0) == 1 {
		t.Fatal("a slowed engine not priced slower")
	}
	for range Samples/2 + 1 {
		e.Add(1, t0)
	}
	if got := Slowdown(e, peers, t0); got != 1 {
		t.Errorf("recovered for most of its last %d intervals, still priced %.2fx", Samples, got)
	}
	e.Add(math.NaN(), t0)
	e.Add(-1, t0)
	e.Add(math.Inf(1), t0)
	if got := Slowdown(e, peers, t0); got != 1 {
		t.Errorf("nonsense ratios moved the pace: %.2fx", got)
	}

	idle := engine(8, 0, Samples)
	if Slowdown(idle, peers, t0.Add(MaxAge-time.Duration(Samples-MinSamples)*time.Second)) == 1 {
		t.Error("priced as its peers while it still has MinSamples recent samples")
	}
	if got := Slowdown(idle, peers, t0.Add(MaxAge+time.Second)); got != 1 {
		t.Errorf("no sample for a minute, still priced %.2fx", got)
	}
}

func TestScale(t *testing.T) {
	fallback := predict.Default(10_000)
	fitted := fallback
	fitted.TTFTCoef[1] *= 2
	fitted.TTFTSamples = predict.MinSamples
	if got := Scale(fitted, &fallback, 1); got != fitted {
		t.Errorf("scaled by 1: %+v, want the model unchanged", got)
	}
	got := Scale(fitted, &fallback, 3)
	f := predict.Features{Uncached: 1000, Backlog: 500, Running: 4, Waiting: 1, Wait: 0.005}
	if got.TTFT(f) != fitted.TTFT(f) {
		t.Errorf("TTFT %.6f, want it unscaled: %.6f", got.TTFT(f), fitted.TTFT(f))
	}
	// The ITL fit had too few samples: the fallback's is what is scaled,
	// and the scaled one stands (the filter would otherwise resolve it
	// back to the unscaled fallback).
	if want := 3 * fallback.ITL(4); math.Abs(got.ITL(4)-want) > 1e-9 {
		t.Errorf("ITL %.6f, want %.6f", got.ITL(4), want)
	}
	if r := got.Resolve(&fallback); r != got {
		t.Errorf("the scaled model resolves to %+v", r)
	}
}
