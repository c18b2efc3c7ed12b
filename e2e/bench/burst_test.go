package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestBurstTrace(t *testing.T) {
	const rate, n = 20.0, 4000
	trace := burstTrace(rate, n, burstSeed(0))
	if !bytes.Equal(trace, burstTrace(rate, n, burstSeed(0))) {
		t.Fatal("the same seed gave another trace: arms would not see the same arrivals")
	}
	if bytes.Equal(trace, burstTrace(rate, n, burstSeed(1))) {
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
