package calibrate

import (
	"math"
	"testing"
	"time"
)

// engine produces the counters a scraped engine would show, one scrape a
// second, from a simple model: requests of a given prompt length, each
// counted whole when its prefill ends.
type engine struct {
	t   time.Time
	obs Observation
}

func newEngine() *engine {
	e := &engine{t: time.Unix(1_000_000, 0)}
	e.obs.Time = e.t
	return e
}

// second advances one second in which n requests of prompt tokens (cached
// of them from the cache) finished prefilling, each taking prefill
// seconds, with waiting requests queued at the end.
func (e *engine) second(n, prompt, cached int, prefill, waiting float64) Observation {
	e.t = e.t.Add(time.Second)
	e.obs.Time = e.t
	e.obs.PromptTokens += float64(n * prompt)
	e.obs.CachedTokens += float64(n * cached)
	e.obs.Requests += float64(n)
	e.obs.PrefillCount += float64(n)
	e.obs.PrefillSeconds += float64(n) * prefill
	e.obs.Waiting = waiting
	return e.obs
}

// timed advances one second of an engine that counts no requests but
// times its own prefills (llama.cpp): prompt tokens (cached of them) whose
// prefill took busy seconds.
func (e *engine) timed(prompt, cached int, busy float64) Observation {
	e.t = e.t.Add(time.Second)
	e.obs.Time = e.t
	e.obs.PromptTokens += float64(prompt)
	e.obs.CachedTokens += float64(cached)
	e.obs.PrefillTime += busy
	return e.obs
}

func TestEstimator(t *testing.T) {
	const peak = 20000.0 // tokens/s of the modelled engine
	tests := []struct {
		name       string
		run        func(e *engine, observe func(Observation))
		want       float64 // 0: the default stands
		tolerance  float64
		calibrated bool
	}{
		{"idle", func(e *engine, observe func(Observation)) {
			for range 300 {
				observe(e.second(0, 0, 0, 0, 0))
			}
		}, DefaultRate, 0, false},
		{"saturated by long uncached prompts", func(e *engine, observe func(Observation)) {
			// 6000-token prompts, 10 finishing every 3 s: 20000 tokens/s,
			// counted in lumps; prefills overlap 4 deep.
			for i := range 300 {
				n := 3
				if i%3 == 0 {
					n = 4
				}
				observe(e.second(n, 6000, 0, 4*6000/peak, 8))
			}
		}, peak, 0.05, true},
		{"saturated with cache hits", func(e *engine, observe func(Observation)) {
			// Half of each prompt cached: only the other half costs.
			for range 300 {
				observe(e.second(5, 8000, 4000, 4000/peak, 3))
			}
		}, peak, 0.01, true},
		{"long prompts one at a time", func(e *engine, observe func(Observation)) {
			// Never saturated; each 8192-token prompt alone takes 8192/peak.
			for i := range 300 {
				observe(e.second(i%2, 8192, 0, 8192/peak, 0))
			}
		}, peak, 0.01, true},
		{"short prompts at light load", func(e *engine, observe func(Observation)) {
			// 200-token prompts: the step's fixed cost dominates, so these
			// windows do not count.
			for range 300 {
				observe(e.second(3, 200, 0, 0.02, 0))
			}
		}, DefaultRate, 0, false},
		{"mostly decode-bound saturation", func(e *engine, observe func(Observation)) {
			// Queued for KV space most of the time, at 2000 uncached
			// tokens/s; one window in four is prefill-bound.
			for i := range 600 {
				if (i/10)%4 == 0 {
					observe(e.second(5, 4000, 0, 3*4000/peak, 5))
				} else {
					observe(e.second(1, 2000, 0, 1.5, 5))
				}
			}
		}, peak, 0.1, true},
		{"above the ceiling", func(e *engine, observe func(Observation)) {
			for range 300 {
				observe(e.second(50, 8000, 0, 0.05, 2))
			}
		}, DefaultRate * 4, 0, true},
		{"below the floor", func(e *engine, observe func(Observation)) {
			for range 300 {
				observe(e.second(1, 1500, 0, 1, 2))
			}
		}, DefaultRate / 4, 0, true},
		{"a CPU engine timing its own prefills, far below the floor", func(e *engine, observe func(Observation)) {
			// 243 tokens/s (llama.cpp with one thread): a 2,000-token
			// prompt every 10 s, busy 8.2 s of them.
			for i := range 300 {
				if i%10 == 0 {
					observe(e.timed(2000, 0, 2000.0/243))
				} else {
					observe(e.timed(0, 0, 0))
				}
			}
		}, 243, 0.01, true},
		{"a timed engine calibrates at its first long prompt", func(e *engine, observe func(Observation)) {
			// Three seconds, one 1,200-token prompt: no 10 s window needed.
			observe(e.timed(0, 0, 0))
			observe(e.timed(1200, 0, 1200.0/243))
			observe(e.timed(0, 0, 0))
		}, 243, 0.01, true},
		{"a timed engine serving cache hits only", func(e *engine, observe func(Observation)) {
			// A handful of uncached tokens per request: too few to say.
			for range 300 {
				observe(e.timed(2000, 1990, 10.0/243))
			}
		}, DefaultRate, 0, false},
		{"restarts and bad scrapes", func(e *engine, observe func(Observation)) {
			for i := range 300 {
				o := e.second(4, 5000, 0, 3*5000/peak, 4)
				switch i % 47 {
				case 13: // restarted: counters from zero, and again next scrape
					e.obs = Observation{Time: e.t}
					o = e.obs
				case 29:
					o.PromptTokens = math.NaN()
				case 30:
					o.Time = o.Time.Add(-time.Hour) // out of order
				}
				observe(o)
			}
		}, peak, 0.05, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			est, err := NewEstimator(Config{})
			if err != nil {
				t.Fatal(err)
			}
			tt.run(newEngine(), est.Observe)
			r := est.Rate()
			if r.Calibrated != tt.calibrated {
				t.Errorf("calibrated %v, want %v", r.Calibrated, tt.calibrated)
			}
			if math.Abs(r.TokensPerSecond-tt.want) > tt.tolerance*tt.want {
				t.Errorf("rate %.0f tokens/s, want %.0f ± %.0f%%", r.TokensPerSecond, tt.want, 100*tt.tolerance)
			}
		})
	}
}

// TestEstimatorFollowsChange checks that the estimate follows a new rate
// (another model or accelerator behind the same address): up at once, down
// once most recent windows agree.
func TestEstimatorFollowsChange(t *testing.T) {
	est, err := NewEstimator(Config{Default: 10000, Floor: 1000, Ceiling: 100000})
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine()
	for range 400 {
		est.Observe(e.second(4, 5000, 0, 1, 9)) // 20000 tokens/s
	}
	if r := est.Rate(); math.Abs(r.TokensPerSecond-20000) > 200 {
		t.Fatalf("rate %+v, want 20000 tokens/s", r)
	}
	for range 600 {
		est.Observe(e.second(8, 5000, 0, 1, 9)) // 40000 tokens/s
	}
	if r := est.Rate(); math.Abs(r.TokensPerSecond-40000) > 400 {
		t.Fatalf("rate %.0f after the change, want 40000", r.TokensPerSecond)
	}
	for range 200 {
		est.Observe(e.second(4, 5000, 0, 1, 9))
	}
	if r := est.Rate(); r.TokensPerSecond < 39000 {
		t.Fatalf("rate %.0f after 20 windows at half the rate: the high quantile should still hold", r.TokensPerSecond)
	}
	for range 600 {
		est.Observe(e.second(4, 5000, 0, 1, 9))
	}
	if r := est.Rate(); math.Abs(r.TokensPerSecond-20000) > 400 {
		t.Fatalf("rate %.0f after 80 windows at 20000, want 20000", r.TokensPerSecond)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []Config{
		{Default: -1},
		{Default: 1000, Floor: 2000},
		{Default: 1000, Ceiling: 500},
		{Ceiling: math.Inf(1)},
		{Default: math.NaN()},
		{Window: -time.Second},
		{MinSamples: samples + 1},
		{Ceiling: 1e39},
	} {
		if _, err := NewEstimator(c); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
	c, err := Config{}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.Default != DefaultRate || c.Floor != DefaultRate/4 || c.Ceiling != DefaultRate*4 {
		t.Errorf("defaults %+v", c)
	}
}
