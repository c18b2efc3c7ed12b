package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/e2e/envoy"
	"github.com/kvroute/kvroute/e2e/llamacpp"
	"github.com/kvroute/kvroute/e2e/vllmsim"
)

// Model is the model the simulated engines serve. The simulator knows no
// chat template for it; the benchmark client sends completions.
const Model = "Qwen/Qwen3-32B"

// EngineConfig is the simulated engines' shape for a run.
type EngineConfig struct {
	Count     int
	GPUBlocks int
	TimeScale float64
	// Accelerator names the engines' cost model (vllmsim.CostModelFor):
	// "a100" by default, the bench's; "h100" for vllmsim's default.
	Accelerator string
}

// DefaultAccelerator is the bench's engines' cost model. On this machine
// kind the client offers at most about 56 requests/s; engines a third as
// fast as the H100 pair put every arm's knee, the oracle's included, below
// that, so the ladder can pass them all.
const DefaultAccelerator = "a100"

// RealEngines are llama.cpp servers (e2e/llamacpp) with a real model, in
// place of the simulated engines, for a workload that needs real prefix
// caching on real hardware.
type RealEngines struct {
	Count, Slots, Context, Threads int
}

// pool is one arm's fresh engines: simulated, or real llama.cpp servers.
type pool struct {
	engines []*vllmsim.Engine
	real    []*llamacpp.Server
	scale   float64
	start   time.Time
	sim0    []time.Duration
}

// startPool starts an arm's engines: real ones if the workload asks for
// them (their logs go to dir), simulated ones of cfg otherwise.
func startPool(ctx context.Context, cfg EngineConfig, real *RealEngines, dir string) (*pool, error) {
	if real != nil {
		return startReal(ctx, real, dir)
	}
	p := &pool{scale: cfg.TimeScale}
	cost, err := vllmsim.CostModelFor(cmp.Or(cfg.Accelerator, DefaultAccelerator))
	if err != nil {
		return nil, err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for range cfg.Count {
		e, err := vllmsim.Start(ctx, vllmsim.Config{
			Host: "127.0.0.1", Model: Model, NumGPUBlocks: cfg.GPUBlocks, TimeScale: cfg.TimeScale, Cost: cost,
			EnablePromptTokensDetails: true, Logger: quiet,
			// Publishers that bind (a wildcard port), as vLLM's default
			// endpoint does; cachesync connects.
			KVEvents: vllmsim.KVEventsConfig{EnableKVCacheEvents: true,
				Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*"},
		})
		if err != nil {
			p.close()
			return nil, fmt.Errorf("bench: start engine: %w", err)
		}
		p.engines = append(p.engines, e)
	}
	p.start = time.Now()
	for _, e := range p.engines {
		p.sim0 = append(p.sim0, e.SimTime())
	}
	return p, nil
}

func startReal(ctx context.Context, real *RealEngines, dir string) (*pool, error) {
	in, err := llamacpp.Find()
	if err != nil {
		return nil, err
	}
	p := &pool{}
	for i := range real.Count {
		log, err := os.Create(filepath.Join(dir, "llama-server-"+strconv.Itoa(i)+".log"))
		if err != nil {
			p.close()
			return nil, err
		}
		s, err := llamacpp.Start(ctx, in, llamacpp.Config{Slots: real.Slots, Context: real.Context, Threads: real.Threads, Log: log})
		if err != nil {
			log.Close()
			p.close()
			return nil, fmt.Errorf("bench: start llama-server: %w", err)
		}
		p.real = append(p.real, s)
	}
	return p, nil
}

func (p *pool) close() {
	for _, e := range p.engines {
		e.Close()
	}
	for _, s := range p.real {
		s.Stop()
	}
}

// model is what the engines serve.
func (p *pool) model() string {
	if p.real != nil {
		return llamacpp.Model
	}
	return Model
}

// command is how the real engines were started, for the report; nil for
// simulated ones.
func (p *pool) command() []string {
	if len(p.real) == 0 {
		return nil
	}
	return append(append(slices.Clone(llamacpp.Env), "llama-server"), p.real[0].Args()...)
}

func (p *pool) addrs() []string {
	var out []string
	for _, e := range p.engines {
		out = append(out, e.Addr())
	}
	for _, s := range p.real {
		out = append(out, s.Addr())
	}
	return out
}

func (p *pool) urls() []string {
	var out []string
	for _, a := range p.addrs() {
		out = append(out, "http://"+a)
	}
	return out
}

// tune adapts an Envoy configuration to the engines: llama.cpp's server
// closes the connection after every streamed response, so Envoy must not
// reuse it (the README's advice for llama.cpp).
func (p *pool) tune(cfg *envoy.Config) error {
	if p.real == nil {
		return nil
	}
	return cfg.SetOneRequestPerConnection("engines")
}

// simulated returns the simulated engines, or an error naming what an arm
// needs of them that real engines lack.
func (p *pool) simulated(needs string) ([]*vllmsim.Engine, error) {
	if p.real != nil {
		return nil, errors.New("bench: llama.cpp has no " + needs)
	}
	return p.engines, nil
}

// lag is how far the slowest engine's simulated clock fell behind the
// wall clock's mapping since the pool started, as a fraction: 0 means
// every engine kept its time scale.
func (p *pool) lag() float64 {
	if p.real != nil {
		return 0 // real engines keep real time
	}
	want := time.Since(p.start).Seconds() / p.scale
	worst := 0.0
	for i, e := range p.engines {
		got := (e.SimTime() - p.sim0[i]).Seconds()
		worst = max(worst, 1-got/want)
	}
	return worst
}

// counters are the engine counters a stage's figures come from.
type counters struct {
	hits, queries, prompt, generation, preemptions, success float64
	// ttftSum and ttftCount are the engine's TTFT histogram's: from a
	// request's arrival at the engine to its first token.
	ttftSum, ttftCount float64
}

func (c counters) minus(o counters) counters {
	return counters{c.hits - o.hits, c.queries - o.queries, c.prompt - o.prompt, c.generation - o.generation,
		c.preemptions - o.preemptions, c.success - o.success, c.ttftSum - o.ttftSum, c.ttftCount - o.ttftCount}
}

// snapshot scrapes every engine's counters. llama.cpp counts no
// requests, only tokens.
func (p *pool) snapshot() ([]counters, error) {
	if p.real != nil {
		out := make([]counters, len(p.real))
		for i, s := range p.real {
			c, err := s.ReadCounters()
			if err != nil {
				return nil, err
			}
			out[i] = counters{hits: c.CachedTokens, queries: c.PromptTokens, prompt: c.PromptTokens, generation: c.Generated}
		}
		return out, nil
	}
	out := make([]counters, len(p.engines))
	for i, e := range p.engines {
		m, err := scrape(e.URL())
		if err != nil {
			return nil, err
		}
		out[i] = counters{
			hits: m["vllm:prefix_cache_hits_total"], queries: m["vllm:prefix_cache_queries_total"],
			prompt: m["vllm:prompt_tokens_total"], generation: m["vllm:generation_tokens_total"],
			preemptions: m["vllm:num_preemptions_total"], success: m["vllm:request_success_total"],
			ttftSum: m["vllm:time_to_first_token_seconds_sum"], ttftCount: m["vllm:time_to_first_token_seconds_count"],
		}
	}
	return out, nil
}

// metricFamilies reads the Prometheus text page at url's /metrics.
func metricFamilies(url string) (map[string]*dto.MetricFamily, error) {
	client := http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(url + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("bench: scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("bench: metrics of %s: %w", url, err)
	}
	return fams, nil
}

// scrape reads an engine's counters and gauges, and its histograms' sums
// and counts (as name_sum, name_count), summed over label sets.
func scrape(url string) (map[string]float64, error) {
	fams, err := metricFamilies(url)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				out[name] += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[name] += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[name+"_sum"] += m.GetHistogram().GetSampleSum()
				out[name+"_count"] += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out, nil
}
