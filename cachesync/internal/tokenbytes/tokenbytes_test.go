package tokenbytes

import (
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)

// step is one event on an Estimator: a scrape of an engine (tokens >= 0)
// or, with tokens < 0, a prompt of bytes routed to it.
type step struct {
	engine, model string
	bytes         int
	tokens        float64
	at            time.Duration
}

func scrape(engine, model string, tokens float64, at time.Duration) step {
	return step{engine: engine, model: model, tokens: tokens, at: at}
}

func routed(engine string, bytes int) step { return step{engine: engine, bytes: bytes, tokens: -1} }

func run(e *Estimator, steps []step) {
	for _, s := range steps {
		if s.tokens < 0 {
			e.Routed(s.engine, s.bytes)
		} else {
			e.Counted(s.engine, s.model, s.tokens, t0.Add(s.at))
		}
	}
}

func TestRatio(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []step
		model string
		want  float64 // 0: no ratio
	}{
		{"learned", []step{
			scrape("a", "m", 0, 0), routed("a", 6000), routed("a", 6000), scrape("a", "m", 2000, time.Second),
		}, "m", 6},
		{"too little evidence", []step{
			scrape("a", "m", 0, 0), routed("a", 600), scrape("a", "m", 100, time.Second),
		}, "m", 0},
		{"another model's", []step{
			scrape("a", "m", 0, 0), routed("a", 6000), scrape("a", "m", 1500, time.Second),
		}, "n", 0},
		{"nothing before the first scrape", []step{
			routed("a", 6000), scrape("a", "m", 1000, 0), routed("a", 4000), scrape("a", "m", 2000, time.Second),
		}, "m", 4},
		{"a prompt of unknown length drops its interval", []step{
			scrape("a", "m", 0, 0), routed("a", 9000), routed("a", 0), scrape("a", "m", 1000, time.Second),
			routed("a", 5000), scrape("a", "m", 2000, 2*time.Second),
		}, "m", 5},
		{"a restart drops its interval", []step{
			scrape("a", "m", 5000, 0), routed("a", 9000), scrape("a", "m", 1000, time.Second),
			routed("a", 3000), scrape("a", "m", 2000, 2*time.Second),
		}, "m", 3},
		{"a change of model drops its interval", []step{
			scrape("a", "old", 0, 0), routed("a", 9000), scrape("a", "m", 1000, time.Second),
			routed("a", 3000), scrape("a", "m", 2000, 2*time.Second),
		}, "m", 3},
		{"engines of a model pool their counts", []step{
			scrape("a", "m", 0, 0), scrape("b", "m", 0, 0), routed("a", 3000), routed("b", 5000),
			scrape("a", "m", 600, time.Second), scrape("b", "m", 400, time.Second),
		}, "m", 8},
		{"unreported traffic is bounded below", []step{
			scrape("a", "m", 0, 0), routed("a", 100), scrape("a", "m", 1000, time.Second),
		}, "m", MinRatio},
		{"and lost requests above", []step{
			scrape("a", "m", 0, 0), routed("a", 90000), scrape("a", "m", 1000, time.Second),
		}, "m", MaxRatio},
		{"a reading that is not a count starts afresh", []step{
			scrape("a", "m", 0, 0), routed("a", 9000), scrape("a", "m", math.Inf(1), time.Second),
			scrape("a", "m", 1000, 2*time.Second), routed("a", 2000), scrape("a", "m", 2000, 3*time.Second),
		}, "m", 2},
		{"an unscraped endpoint is not tracked", []step{
			routed("x", 6000), scrape("a", "m", 0, 0), routed("a", 4000), scrape("a", "m", 1000, time.Second),
		}, "m", 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := New(Config{MinTokens: 1000})
			run(e, tc.steps)
			got, ok := e.Ratio(tc.model)
			if tc.want == 0 {
				if ok {
					t.Fatalf("Ratio = %v, want none", got)
				}
				return
			}
			if !ok || math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("Ratio = %v, %v; want %v", got, ok, tc.want)
			}
			if _, ok := e.eps["x"]; ok {
				t.Error("an endpoint only reported is tracked")
			}
		})
	}
}

// TestFollowsTraffic: after a change of workload the ratio moves to the
// new one within a few time constants.
func TestFollowsTraffic(t *testing.T) {
	e := New(Config{TimeConstant: time.Minute, MinTokens: 1000})
	tokens := 0.0
	at := time.Duration(0)
	e.Counted("a", "m", tokens, t0)
	minute := func(bpt int) {
		for range 60 {
			at += time.Second
			e.Routed("a", 1000*bpt)
			tokens += 1000
			e.Counted("a", "m", tokens, t0.Add(at))
		}
	}
	for range 10 {
		minute(4)
	}
	if got, _ := e.Ratio("m"); math.Abs(got-4) > 1e-9 {
		t.Fatalf("steady ratio %v, want 4", got)
	}
	minute(8)
	if got, _ := e.Ratio("m"); got < 6 || got > 7 {
		t.Errorf("a minute after the change: %v, want between the two (about 6.5)", got)
	}
	for range 4 {
		minute(8)
	}
	if got, _ := e.Ratio("m"); got < 7.9 {
		t.Errorf("five minutes after the change: %v, want about 8", got)
	}
}
