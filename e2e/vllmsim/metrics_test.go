package vllmsim

import (
	"encoding/json"
	"math"
	"net/http"
	"testing"
	"time"
)

// TestPrefillTimeHistogram checks vllm:request_prefill_time_seconds: one
// observation per finished request, recorded at the finish, worth the time
// from first scheduling to the first token. Without pacing, simulated time
// is the cost model's alone, so a lone prompt's prefill time is exactly
// one step's cost.
func TestPrefillTimeHistogram(t *testing.T) {
	cfg := testConfig()
	cfg.NumGPUBlocks = 256
	cfg.TimeScale = 0
	e := startEngine(t, cfg)
	prompt := make([]int, 1000)
	for i := range prompt {
		prompt[i] = 1000 + i
	}
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 3})
	if code, b := post(t, e.URL()+"/v1/completions", string(body)); code != http.StatusOK {
		t.Fatalf("completion: %d %s", code, b)
	}
	// Three steps: the prefill and two decodes of 1000 tokens of context.
	if got, want := e.SimTime().Seconds(), 3*cfg.withDefaultsT(t).Cost.Step+DefaultCostModel.prefill(1000, 0)+
		DefaultCostModel.decode(1000)+DefaultCostModel.decode(1001); math.Abs(got-want) > 1e-6 {
		t.Errorf("simulated time %.6f s, want the steps' cost %.6f s", got, want)
	}
	mf := scrape(t, e)
	if n := histCount(t, mf, "vllm:request_prefill_time_seconds"); n != 1 {
		t.Fatalf("prefill time observed %d times, want 1", n)
	}
	want := cfg.withDefaultsT(t).Cost.Step + DefaultCostModel.prefill(1000, 0)
	if got := value(t, mf, "vllm:request_prefill_time_seconds"); math.Abs(got-want) > 1e-9 {
		t.Errorf("prefill time %.6f s, want %.6f s", got, want)
	}
	buckets := mf["vllm:request_prefill_time_seconds"].Metric[0].Histogram.Bucket
	// The text parser adds the +Inf bucket.
	if len(buckets) != len(latencyBuckets)+1 || buckets[0].GetUpperBound() != 0.3 || buckets[len(buckets)-2].GetUpperBound() != 7680 {
		t.Errorf("prefill time buckets %v, want vLLM's request latency buckets", buckets)
	}
}

// TestSimTime checks the engine's simulated clock against the wall clock
// while it keeps pace: idle, and through a request.
func TestSimTime(t *testing.T) {
	cfg := testConfig()
	cfg.NumGPUBlocks = 256
	cfg.TimeScale = 0.1
	e := startEngine(t, cfg)
	time.Sleep(50 * time.Millisecond)
	if got := e.SimTime(); got < 400*time.Millisecond || got > 5*time.Second {
		t.Errorf("after 50 ms idle at time scale 0.1: simulated %v, want about 0.5 s", got)
	}
	before := e.SimTime()
	chat(t, e, longPrompt("clock", 2000), 1)
	after := e.SimTime()
	ttft := value(t, scrape(t, e), "vllm:time_to_first_token_seconds")
	if d := (after - before).Seconds(); d < ttft {
		t.Errorf("simulated clock moved %.3f s over a request whose TTFT was %.3f s", d, ttft)
	}
	for prev, i := e.SimTime(), 0; i < 20; i++ {
		now := e.SimTime()
		if now < prev {
			t.Fatalf("simulated clock went back from %v to %v", prev, now)
		}
		prev = now
	}
}
