package predict

import (
	"math"
	"testing"
)

func TestDefault(t *testing.T) {
	m := Default(20000)
	idle := m.TTFT(Features{Uncached: 8000})
	if want := DefaultStep + 0.4; math.Abs(idle-want) > 1e-6 {
		t.Errorf("8,000 uncached tokens at 20k tokens/s: %.4f s, want %.4f", idle, want)
	}
	if queued := m.TTFT(Features{Uncached: 8000, Backlog: 20000}); math.Abs(queued-idle-1) > 1e-6 {
		t.Errorf("a second of backlog added %.4f s", queued-idle)
	}
	if a, b := m.ITL(0), m.ITL(32); !(b > a && math.Abs(b-2*a) < 1e-9) {
		t.Errorf("ITL idle %.4f, 32 running %.4f: want the step doubled", a, b)
	}
}

func TestValid(t *testing.T) {
	m := Default(1000)
	if !m.Valid() {
		t.Error("the default model is invalid")
	}
	for _, bad := range []float32{-1, float32(math.NaN()), float32(math.Inf(1))} {
		b := m
		b.TTFTCoef[2] = bad
		if b.Valid() {
			t.Errorf("a TTFT coefficient %v passed", bad)
		}
		b = m
		b.ITLCoef[1] = bad
		if b.Valid() {
			t.Errorf("an ITL coefficient %v passed", bad)
		}
	}
}

func BenchmarkPredict(b *testing.B) {
	m, fb := Default(15928), Default(15928)
	f := Features{Uncached: 1200, Backlog: 8000, Running: 12, Waiting: 1}
	var s float64
	for b.Loop() {
		r := m.Resolve(&fb)
		s += r.TTFT(f) + r.ITL(12)
	}
	_ = s
}
