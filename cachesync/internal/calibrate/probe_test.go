package calibrate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/e2e/vllmsim"
)

var discard = slog.New(slog.DiscardHandler)

// simClock returns a clock that reads an engine's simulated time.
func simClock(e *vllmsim.Engine) func() time.Time {
	epoch := time.Unix(1_000_000_000, 0)
	return func() time.Time { return epoch.Add(e.SimTime()) }
}

// startSim starts one simulated engine with the default cost model
// (Qwen3-32B on two H100s, B = 8192).
func startSim(t *testing.T, cfg vllmsim.Config) *vllmsim.Engine {
	t.Helper()
	cfg.Logger = discard
	es, err := vllmsim.StartN(context.Background(), 1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { es[0].Close() })
	return es[0]
}

// TestProbeMeasuresSimulatorPeak measures a simulated engine's peak
// prefill rate and compares it with its cost model's analytic
// R_peak = B / T(B). The engine is an accelerator half as fast as the
// default model's, simulated at twice real speed, so a run takes 0.4 s of
// wall time and the probe reads simulated time. The client-side part of
// each time to first token (HTTP, and the simulator tokenizing 8k tokens)
// is wall time that the scale doubles: a few per cent.
func TestProbeMeasuresSimulatorPeak(t *testing.T) {
	const scale = 0.5
	cost := vllmsim.DefaultCostModel
	cost.Step *= 2
	cost.PrefillToken *= 2
	cost.PrefillAttention *= 2
	e := startSim(t, vllmsim.Config{TimeScale: scale, Cost: cost})
	p := Probe{URL: e.URL() + "/", Runs: 3, Now: simClock(e), Logger: discard}
	res, err := p.Measure(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	peak := cost.PeakPrefill(vllmsim.DefaultMaxNumBatchedTokens)
	t.Logf("R_peak measured %.0f tokens/s (median TTFT %v over %d-token prompts), analytic %.0f: %+.1f%%",
		res.Rate, res.TTFT, res.Tokens, peak, 100*(res.Rate-peak)/peak)
	if math.Abs(res.Rate-peak) > 0.25*peak {
		t.Errorf("R_peak %.0f tokens/s, want %.0f ± 25%%", res.Rate, peak)
	}
	if res.Model != vllmsim.DefaultModel || res.URL != e.URL() || len(res.Runs) != 3 {
		t.Errorf("result %+v", res)
	}
	if res.Tokens > DefaultBatchedTokens || res.Tokens < DefaultBatchedTokens*9/10 {
		t.Errorf("prompts of %d tokens, want a little under %d", res.Tokens, DefaultBatchedTokens)
	}
	// Nothing hit the cache: every prompt was new.
	if hit, err := e.Probe("/v1/completions", []byte(`{"prompt": "`+randomText(100)+`"}`)); err != nil || hit.GPUTokens != 0 {
		t.Errorf("a random prompt hits the cache: %+v %v", hit, err)
	}
}

// TestProbeWithoutTokenize measures through a proxy that hides the
// engine's /tokenize, as an engine without one: the probe sends text.
func TestProbeWithoutTokenize(t *testing.T) {
	// Slower than real time: the proxy's and the HTTP path's wall-clock
	// cost counts in simulated time divided by the scale, so a scale
	// below 1 would inflate it (by a quarter under the race detector).
	const scale = 2.0
	cost := vllmsim.DefaultCostModel
	cost.Step *= 2
	cost.PrefillToken *= 2
	cost.PrefillAttention *= 2
	e := startSim(t, vllmsim.Config{TimeScale: scale, Cost: cost})
	target, _ := url.Parse(e.URL())
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/tokenize" {
			http.NotFound(w, r)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	defer srv.Close()
	p := Probe{URL: srv.URL, Runs: 1, Now: simClock(e), Logger: discard}
	res, err := p.Measure(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	peak := cost.PeakPrefill(vllmsim.DefaultMaxNumBatchedTokens)
	t.Logf("R_peak from text prompts %.0f tokens/s over %d tokens, analytic %.0f: %+.1f%%", res.Rate, res.Tokens, peak, 100*(res.Rate-peak)/peak)
	if math.Abs(res.Rate-peak) > 0.25*peak || res.Tokens > DefaultBatchedTokens || res.Tokens < DefaultBatchedTokens*9/10 {
		t.Errorf("R_peak %.0f tokens/s over %d-token prompts, want %.0f ± 25%% over a little under %d", res.Rate, res.Tokens, peak, DefaultBatchedTokens)
	}
}

// TestCommand runs the subcommand's flag parsing and output against the
// simulator at full speed (the command reads the wall clock).
func TestCommand(t *testing.T) {
	e := startSim(t, vllmsim.Config{TimeScale: 0.05})
	var out bytes.Buffer
	err := Command(context.Background(), []string{"-url", e.URL(), "-runs", "1", "-batched-tokens", "2048"}, &out, discard)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var res Result
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("last line is not JSON: %v\n%s", err, out.String())
	}
	if res.Rate <= 0 || res.Tokens > 2048 || len(res.Runs) != 1 {
		t.Errorf("result %+v", res)
	}
	if !strings.Contains(out.String(), fmt.Sprintf("R_peak = %.0f tokens/s", res.Rate)) {
		t.Errorf("output does not state the rate:\n%s", out.String())
	}

	for _, args := range [][]string{{}, {"-url", e.URL(), "extra"}, {"-nope"}} {
		if err := Command(context.Background(), args, &bytes.Buffer{}, discard); err == nil {
			t.Errorf("Command(%q) succeeded", args)
		}
	}
}

func TestProbeErrors(t *testing.T) {
	sim := startSim(t, vllmsim.Config{TimeScale: 0.01, MaxModelLen: 1024, NumGPUBlocks: 128})
	models := `{"data": [{"id": "m", "parent": null}]}`
	fake := func(completions string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/models" {
				fmt.Fprint(w, models)
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, completions)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	noModels := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"data": [{"id": "lora", "parent": "base"}]}`)
	}))
	defer noModels.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()

	tests := []struct {
		name string
		p    Probe
		want string
	}{
		{"no scheme", Probe{URL: "127.0.0.1:8000"}, "want http://"},
		{"bad runs", Probe{URL: "http://127.0.0.1:1", Runs: -1}, "out of range"},
		{"engine down", Probe{URL: closed.URL}, "listing models"},
		{"adapters only", Probe{URL: noModels.URL}, "no model"},
		{"prompt too long", Probe{URL: sim.URL(), Tokens: 4096}, "400"},
		{"unknown model", Probe{URL: sim.URL(), Model: "nope", Tokens: 64}, "404"},
		{"no usage", Probe{URL: fake("data: {\"choices\": [{\"text\": \"x\"}]}\n\ndata: [DONE]\n\n")}, "no usage"},
		{"no token", Probe{URL: fake("data: [DONE]\n\n")}, "no token"},
		{"error chunk", Probe{URL: fake("data: {\"error\": {\"message\": \"boom\"}}\n\n")}, "boom"},
		{"bad chunk", Probe{URL: fake("data: {\n\n")}, "stream chunk"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.p.Logger = discard
			tt.p.Timeout = 10 * time.Second
			_, err := tt.p.Measure(context.Background())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Measure: %v, want an error with %q", err, tt.want)
			}
		})
	}
}
