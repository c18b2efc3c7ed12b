package demand

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/shared/policy"
	"github.com/kvroute/kvroute/shared/report"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// TestRecord: a routing record counts for the group its head names, at
// the endpoint it names, with the output it asked for.
func TestRecord(t *testing.T) {
	long := make([]uint64, 40)
	for i := range long {
		long[i] = uint64(i + 1)
	}
	var w report.Writer
	for _, r := range []report.Record{
		{Endpoint: "a", Hashes: long, Output: 100},                         // group snapshot.GroupDepth
		{Endpoint: "a", Hashes: long[:snapshot.GroupDepth+3], Output: 100}, // the same group
		{Endpoint: "b", Hashes: long[:9], Output: 50},                      // short: a group of its own
		{Endpoint: "b"}, // no hash: no group
	} {
		if err := w.Add(&r); err != nil {
			t.Fatal(err)
		}
	}
	bt, err := report.Parse(w.Bytes(), report.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	tr := New(Config{TimeConstant: time.Second})
	now := time.Unix(1000, 0)
	for e := range bt.Records() {
		tr.Record(e, now)
	}
	gs := tr.Groups(now)
	if len(gs) != 2 || gs[0].Key != snapshot.GroupDepth || !near(gs[0].Rate, 200) || gs[1].Key != 9 || !near(gs[1].Rate, 50) {
		t.Fatalf("groups %+v, want %d at 200 tokens/s and 9 at 50", gs, snapshot.GroupDepth)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b)) }

// TestSteadyRate: a group sending one request a second asking for 150
// tokens reads, once the time constant has passed several times over,
// 150 output tokens a second at its endpoint, and its share is where it
// was routed.
func TestSteadyRate(t *testing.T) {
	tr := New(Config{TimeConstant: 10 * time.Second})
	t0 := time.Unix(1000, 0)
	now := t0
	for i := range 200 {
		now = t0.Add(time.Duration(i) * time.Second)
		tr.Add("a", 7, 150, now)
		if i%2 == 0 {
			tr.Add("b", 8, 0, now) // no max_tokens: the default
		}
	}
	// Exponential smoothing of a step train reads a little above its mean
	// right after a step: within 1/(2 tau) of it.
	if got := tr.Endpoint("a", now); math.Abs(got-150) > 150*0.06 {
		t.Errorf("endpoint a: %.1f tokens/s, want about 150", got)
	}
	def := float64(policy.DefaultConfig().DefaultOutputTokens)
	if got := tr.Endpoint("b", now); math.Abs(got-def/2) > def*0.06 {
		t.Errorf("endpoint b: %.1f tokens/s, want about %v", got, def/2)
	}
	// Requests counts over the long time constant: 200 seconds' worth.
	long := DefaultLongTimeConstant.Seconds()
	seen := -math.Expm1(-200/long) / -math.Expm1(-1/long)
	gs := tr.Groups(now)
	if len(gs) != 2 || gs[0].Key != 7 || math.Abs(gs[0].Requests-seen) > 1 || len(gs[0].Shares) != 1 || gs[0].Shares[0].Endpoint != "a" || !near(gs[0].Rate, gs[0].Shares[0].Rate) {
		t.Fatalf("groups %+v, want group 7 first, all at a", gs)
	}
	// A lull of a minute empties the 30 s figures, not the count that
	// says the group recurs.
	if gs := tr.Groups(now.Add(time.Minute)); gs[0].Requests < 0.8*seen {
		t.Errorf("after a minute's lull: %.1f requests, want about %.0f", gs[0].Requests, 0.82*seen)
	}
	if got := tr.Endpoint("nobody", now); got != 0 {
		t.Errorf("an endpoint without requests reads %v", got)
	}
}

// TestDecay: demand that stops fades by e every time constant.
func TestDecay(t *testing.T) {
	tr := New(Config{TimeConstant: 10 * time.Second})
	t0 := time.Unix(1000, 0)
	tr.Add("a", 1, 100, t0)
	want := 100.0 / 10
	for _, d := range []time.Duration{0, 10 * time.Second, 20 * time.Second} {
		if got := tr.Endpoint("a", t0.Add(d)); !near(got, want) {
			t.Errorf("after %v: %v, want %v", d, got, want)
		}
		want /= math.E
	}
	// A report stamped before the last one counts undecayed, not negative.
	tr.Add("a", 1, 100, t0.Add(-time.Second))
	if got := tr.Endpoint("a", t0); !near(got, 20) {
		t.Errorf("after an out-of-order report: %v, want 20", got)
	}
}

// TestSplitGroup: a group whose requests went to two endpoints shows
// both shares.
func TestSplitGroup(t *testing.T) {
	tr := New(Config{})
	now := time.Unix(1000, 0)
	tr.Add("b", 3, 300, now)
	tr.Add("a", 3, 100, now)
	gs := tr.Groups(now)
	if len(gs) != 1 || len(gs[0].Shares) != 2 || gs[0].Shares[0].Endpoint != "a" || !near(gs[0].Shares[1].Rate, 3*gs[0].Shares[0].Rate) ||
		!near(gs[0].Rate, gs[0].Shares[0].Rate+gs[0].Shares[1].Rate) {
		t.Fatalf("groups %+v, want one of two shares, b three times a", gs)
	}
	tr.Forget("b")
	if gs := tr.Groups(now); len(gs) != 1 || len(gs[0].Shares) != 1 || tr.Endpoint("b", now) != 0 {
		t.Fatalf("after forgetting b: groups %+v, b %v", gs, tr.Endpoint("b", now))
	}
	tr.Forget("a")
	if gs := tr.Groups(now); len(gs) != 0 {
		t.Fatalf("after forgetting both: groups %+v", gs)
	}
}

// TestBounded: unique prompts do not grow the tracker past its bound, and
// trimming keeps the demanding groups.
func TestBounded(t *testing.T) {
	tr := New(Config{MaxGroups: 100, TimeConstant: time.Second})
	now := time.Unix(1000, 0)
	for i := range 10_000 {
		now = now.Add(time.Millisecond)
		if i%100 == 0 {
			tr.Add("a", 0, 100, now) // a hot group
		}
		tr.Add("a", uint64(i+1), 1, now)
	}
	gs := tr.Groups(now)
	if len(gs) > 200 {
		t.Fatalf("%d groups tracked, bound 100 (200 between trims)", len(gs))
	}
	if gs[0].Key != 0 {
		t.Fatalf("the hot group was trimmed: first is %d", gs[0].Key)
	}
}

func TestConcurrent(t *testing.T) {
	tr := New(Config{})
	now := time.Unix(1000, 0)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				tr.Add(string(rune('a'+w)), uint64(i%10), 100, now)
				_ = tr.Endpoint("a", now)
				if i%100 == 0 {
					_ = tr.Groups(now)
				}
			}
		}()
	}
	wg.Wait()
	total := 0.0
	for _, g := range tr.Groups(now) {
		total += g.Rate
	}
	if want := 4 * 1000 * 100 / DefaultTimeConstant.Seconds(); !near(total, want) {
		t.Fatalf("total %v tokens/s, want %v", total, want)
	}
}

// TestLongRun: a group's long-run arrival rate and answer length are
// estimated apart, each within a few of its stated standard errors, and
// the errors shrink as the sample grows; two groups of the same answers
// but different traffic differ in arrivals, not in answer.
func TestLongRun(t *testing.T) {
	tr := New(Config{LongTimeConstant: 100 * time.Second})
	rng := rand.New(rand.NewPCG(1, 2))
	t0 := time.Unix(1000, 0)
	now := t0
	var early Group
	// Group 1: 2 requests/s, answers 100 or 200 (mean 150, sd 50); group 2:
	// the same answers at 0.5 requests/s.
	for now.Before(t0.Add(400 * time.Second)) {
		now = now.Add(time.Duration(rng.ExpFloat64() / 2.5 * float64(time.Second)))
		key := uint64(1)
		if rng.IntN(5) == 0 {
			key = 2
		}
		tr.Add("a", key, 100+100*rng.IntN(2), now)
		if early.Key == 0 && now.After(t0.Add(20*time.Second)) {
			early = tr.Groups(now)[0]
		}
	}
	gs := tr.Groups(now)
	if len(gs) != 2 || gs[0].Key != 1 {
		t.Fatalf("groups %+v", gs)
	}
	for _, c := range []struct {
		g        Group
		arrivals float64
	}{{gs[0], 2}, {gs[1], 0.5}} {
		g := c.g
		if z := (g.Arrivals - c.arrivals) / math.Sqrt(g.ArrivalsVar); math.Abs(z) > 4 {
			t.Errorf("group %d: %.3f requests/s ± %.3f, want %v", g.Key, g.Arrivals, math.Sqrt(g.ArrivalsVar), c.arrivals)
		}
		if z := (g.Answer - 150) / math.Sqrt(g.AnswerVar); math.Abs(z) > 4 {
			t.Errorf("group %d: answers %.1f ± %.1f tokens, want 150", g.Key, g.Answer, math.Sqrt(g.AnswerVar))
		}
		// Some 100 s of requests at the group's rate: the mean's standard
		// error about 50/sqrt(rate·100/2).
		if se, want := math.Sqrt(g.AnswerVar), 50/math.Sqrt(c.arrivals*50); se < want/2 || se > want*2 {
			t.Errorf("group %d: the answer's standard error %.2f, want about %.2f", g.Key, se, want)
		}
		rate, v := g.Demand()
		if !near(rate, g.Arrivals*g.Answer) || v <= 0 {
			t.Errorf("group %d: demand %v ± %v", g.Key, rate, math.Sqrt(v))
		}
	}
	if early.Key != 1 || early.AnswerVar <= gs[0].AnswerVar || early.ArrivalsVar <= gs[0].ArrivalsVar {
		t.Errorf("after 20 s the estimates (%+v) should be less sure than after 400 (%+v)", early, gs[0])
	}
	if z := (early.Arrivals - 2) / math.Sqrt(early.ArrivalsVar); math.Abs(z) > 4 {
		t.Errorf("after 20 s: %.3f requests/s ± %.3f, want 2: a young group's window is its age", early.Arrivals, math.Sqrt(early.ArrivalsVar))
	}
}

// TestLongRunOneRequest: a group seen once knows nothing of its answers'
// spread, and says so.
func TestLongRunOneRequest(t *testing.T) {
	tr := New(Config{})
	now := time.Unix(1000, 0)
	tr.Add("a", 1, 120, now)
	g := tr.Groups(now.Add(time.Second))[0]
	if g.Answer != 120 || math.Sqrt(g.AnswerVar) < 100 {
		t.Fatalf("one answer of 120: %.1f ± %.1f", g.Answer, math.Sqrt(g.AnswerVar))
	}
}

// TestHalves: a group's two halves are each about half its requests,
// drawn at random (not one prompt's requests in one half), and each
// estimates its answers on its own.
func TestHalves(t *testing.T) {
	tr := New(Config{})
	t0 := time.Unix(1000, 0)
	// Two prompts alternating, answering 100 and 200 tokens: a split by
	// turn would put each prompt in a half of its own.
	for i := range 2000 {
		tr.Add("a", 1, 100+100*(i%2), t0.Add(time.Duration(i)*100*time.Millisecond))
	}
	g := tr.Groups(t0.Add(200 * time.Second))[0]
	for h, s := range g.Halves {
		if r := s.Requests / g.Requests; r < 0.45 || r > 0.55 {
			t.Errorf("half %d: %.1f of %.1f requests", h, s.Requests, g.Requests)
		}
		if z := (s.Arrivals - g.Arrivals/2) / math.Sqrt(s.ArrivalsVar); math.Abs(z) > 4 {
			t.Errorf("half %d: %.3f requests/s ± %.3f, want half of %.3f", h, s.Arrivals, math.Sqrt(s.ArrivalsVar), g.Arrivals)
		}
		if z := (s.Answer - 150) / math.Sqrt(s.AnswerVar); math.Abs(z) > 4 || s.AnswerVar <= g.AnswerVar {
			t.Errorf("half %d: answers %.1f ± %.1f tokens, want 150, less sure than the whole's ± %.1f", h, s.Answer,
				math.Sqrt(s.AnswerVar), math.Sqrt(g.AnswerVar))
		}
	}
}
