package bench

import (
	"bytes"
	"testing"
)

// TestClientHoldsNoRequestBack checks that on every rate stage of every
// workload a single client worker may have all the stage's requests in
// flight at once: a cap that binds turns the open loop closed, and the
// requests it holds back queue where TTFT does not see them.
func TestClientHoldsNoRequestBack(t *testing.T) {
	const stageSeconds = 15
	for _, w := range append(Workloads, sharedFraction(30, []float64{2, 4, 8, 96})) {
		if w.Concurrency != nil {
			continue
		}
		for i, rate := range w.Rates {
			load := w.config(Model, "http://127.0.0.1:1", "tok", "out", "trace.csv", i, stageSeconds)["load"].(map[string]any)
			if got, n := load["worker_max_concurrency"].(int), traceRequests(rate, stageSeconds); got < n {
				t.Errorf("%s at %v req/s: a worker may have %d requests in flight of the stage's %d", w.Name, rate, got, n)
			}
		}
	}
}

// TestWarmupIsReplayed checks that every warm-up is a seeded trace, steady
// and of the warm-up's own rate: the warm-up places every prefix, and
// inference-perf's unseeded Poisson placed them differently from run to
// run.
func TestWarmupIsReplayed(t *testing.T) {
	const stageSeconds = 15
	warmed := 0
	for _, w := range Workloads {
		if w.WarmupRate == 0 || w.SessionHeader != "" {
			continue
		}
		warmed++
		load := w.config(Model, "http://127.0.0.1:1", "tok", "out", "trace.csv", -1, stageSeconds)["load"].(map[string]any)
		if load["type"] != "trace_replay" {
			t.Errorf("%s: warm-up load %v, want trace_replay", w.Name, load["type"])
		}
		trace := w.arrivals(-1, stageSeconds)
		if !bytes.Equal(trace, w.arrivals(-1, stageSeconds)) {
			t.Errorf("%s: two warm-up traces differ", w.Name)
		}
		if got, want := bytes.Count(trace, []byte("\n"))-1, int(w.WarmupRate*float64(w.WarmupSeconds)); got != want {
			t.Errorf("%s: warm-up trace of %d arrivals, want %d", w.Name, got, want)
		}
		steady := *w
		steady.Bursty = false
		if !bytes.Equal(trace, steady.arrivals(-1, stageSeconds)) {
			t.Errorf("%s: the warm-up follows the ladder's bursts", w.Name)
		}
	}
	if warmed == 0 {
		t.Fatal("no workload has a warm-up")
	}
}

// TestSeed checks that a workload's seed changes both what inference-perf
// generates and when it sends it, and that the default seed leaves the
// committed runs' configuration as it was.
func TestSeed(t *testing.T) {
	const stageSeconds = 15
	w, err := WorkloadByName("b2b-saas")
	if err != nil {
		t.Fatal(err)
	}
	dataSeed := func(w *Workload) any {
		data := w.config(Model, "http://127.0.0.1:1", "tok", "out", "trace.csv", 0, stageSeconds)["data"].(map[string]any)
		return data["shared_prefix"].(map[string]any)["seed"]
	}
	other := *w
	other.Seed = 7
	if got := dataSeed(w); got != defaultSeed {
		t.Errorf("default data seed %v, want %d", got, defaultSeed)
	}
	if got := dataSeed(&other); got != 7 {
		t.Errorf("seed 7: data seed %v, want 7", got)
	}
	if got := w.Data["shared_prefix"].(map[string]any)["seed"]; got != defaultSeed {
		t.Errorf("seeding a copy changed the workload's own data seed to %v", got)
	}
	for _, i := range []int{-1, 0} {
		if bytes.Equal(w.arrivals(i, stageSeconds), other.arrivals(i, stageSeconds)) {
			t.Errorf("stage %d: seed 7 replays the default seed's trace", i)
		}
	}
}
