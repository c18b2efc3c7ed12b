package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestArrivalTrace(t *testing.T) {
	const rate, n = 20.0, 4000
	trace := arrivalTrace(rate, n, traceSeed(0), true)
	if !bytes.Equal(trace, arrivalTrace(rate, n, traceSeed(0), true)) {
		t.Fatal("the same seed gave another trace: arms would not see the same arrivals")
	}
	if bytes.Equal(trace, arrivalTrace(rate, n, traceSeed(1), true)) {
		t.Error("stages share one trace")
	}
	lines := strings.Split(strings.TrimSpace(string(trace)), "\n")
	if lines[0] != "TIMESTAMP,ContextTokens,GeneratedTokens" || len(lines) != n+1 {
		t.Fatalf("trace has header %q and %d arrivals, want Azure's header and %d", lines[0], len(lines)-1, n)
	}
	var last time.Time
	inBurst := 0
	epoch := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, l := range lines[1:] {
		ts, _, _ := strings.Cut(l, ",")
		at, err := time.Parse("2006-01-02 15:04:05.000000", ts)
		if err != nil {
			t.Fatalf("arrival %d: %v", i, err)
		}
		if at.Before(last) {
			t.Fatalf("arrival %d at %v precedes the one before (%v)", i, at, last)
		}
		last = at
		if at.Sub(epoch)%burstCycle < burstOn {
			inBurst++
		}
	}
	// The mean rate holds over the trace, and the bursts carry their
	// share: 1.5 s at 2.5x of every 5 s is 75% of the arrivals in 30% of
	// the time (Poisson noise over 4,000 arrivals is about 1%).
	if got := float64(n) / last.Sub(epoch).Seconds(); got < 0.95*rate || got > 1.05*rate {
		t.Errorf("mean rate %.1f req/s, want %.0f", got, rate)
	}
	if share := float64(inBurst) / n; share < 0.72 || share > 0.78 {
		t.Errorf("%.0f%% of arrivals in the bursts, want 75%%", 100*share)
	}
}

func TestSteadyTrace(t *testing.T) {
	const rate, n = 24.0, 2400
	trace := arrivalTrace(rate, n, traceSeed(0), false)
	if !bytes.Equal(trace, arrivalTrace(rate, n, traceSeed(0), false)) {
		t.Fatal("the same seed gave another trace: arms would not see the same arrivals")
	}
	lines := strings.Split(strings.TrimSpace(string(trace)), "\n")
	epoch := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// Steady: the first 1.5 s of each 5 s hold 30% of the arrivals, not
	// the bursts' 75%.
	early := 0
	var last time.Time
	for i, l := range lines[1:] {
		ts, _, _ := strings.Cut(l, ",")
		at, err := time.Parse("2006-01-02 15:04:05.000000", ts)
		if err != nil {
			t.Fatalf("arrival %d: %v", i, err)
		}
		last = at
		if at.Sub(epoch)%burstCycle < burstOn {
			early++
		}
	}
	if got := float64(n) / last.Sub(epoch).Seconds(); got < 0.95*rate || got > 1.05*rate {
		t.Errorf("mean rate %.1f req/s, want %.0f", got, rate)
	}
	if share := float64(early) / n; share < 0.27 || share > 0.33 {
		t.Errorf("%.0f%% of arrivals in the first 1.5 s of each 5 s, want 30%% (steady)", 100*share)
	}
}
