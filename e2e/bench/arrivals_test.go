package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestArrivalTrace: a stage's trace is the same for every arm and another
// for every stage, in Azure's format, ordered, at the stage's mean rate;
// bursty, 1.5 s at 2.5x of every 5 s is 75% of the arrivals in 30% of the
// time, and steady, those 30% of the time hold 30% (Poisson noise over
// thousands of arrivals is about 1%).
func TestArrivalTrace(t *testing.T) {
	for _, tc := range []struct {
		name               string
		rate               float64
		n                  int
		bursty             bool
		minEarly, maxEarly float64 // share of arrivals in the first 1.5 s of each 5 s
	}{
		{"bursty", 20, 4000, true, 0.72, 0.78},
		{"steady", 24, 2400, false, 0.27, 0.33},
	} {
		w := &Workload{}
		trace := arrivalTrace(tc.rate, tc.n, w.traceSeed(0), tc.bursty)
		if !bytes.Equal(trace, arrivalTrace(tc.rate, tc.n, w.traceSeed(0), tc.bursty)) {
			t.Fatalf("%s: the same seed gave another trace: arms would not see the same arrivals", tc.name)
		}
		if bytes.Equal(trace, arrivalTrace(tc.rate, tc.n, w.traceSeed(1), tc.bursty)) {
			t.Errorf("%s: stages share one trace", tc.name)
		}
		lines := strings.Split(strings.TrimSpace(string(trace)), "\n")
		if lines[0] != "TIMESTAMP,ContextTokens,GeneratedTokens" || len(lines) != tc.n+1 {
			t.Fatalf("%s: trace has header %q and %d arrivals, want Azure's header and %d", tc.name, lines[0], len(lines)-1, tc.n)
		}
		var last time.Time
		early := 0
		epoch := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		for i, l := range lines[1:] {
			ts, _, _ := strings.Cut(l, ",")
			at, err := time.Parse("2006-01-02 15:04:05.000000", ts)
			if err != nil {
				t.Fatalf("%s: arrival %d: %v", tc.name, i, err)
			}
			if at.Before(last) {
				t.Fatalf("%s: arrival %d at %v precedes the one before (%v)", tc.name, i, at, last)
			}
			last = at
			if at.Sub(epoch)%burstCycle < burstOn {
				early++
			}
		}
		if got := float64(tc.n) / last.Sub(epoch).Seconds(); got < 0.95*tc.rate || got > 1.05*tc.rate {
			t.Errorf("%s: mean rate %.1f req/s, want %.0f", tc.name, got, tc.rate)
		}
		if share := float64(early) / float64(tc.n); share < tc.minEarly || share > tc.maxEarly {
			t.Errorf("%s: %.0f%% of arrivals in the first 1.5 s of each 5 s, want %.0f-%.0f%%", tc.name, 100*share, 100*tc.minEarly, 100*tc.maxEarly)
		}
	}
}
