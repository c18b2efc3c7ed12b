package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

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

// pool is one arm's fresh engines.
type pool struct {
	engines []*vllmsim.Engine
	scale   float64
	start   time.Time
	sim0    []time.Duration
}

func startPool(ctx context.Context, cfg EngineConfig) (*pool, error) {
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

func (p *pool) close() {
	for _, e := range p.engines {
		e.Close()
	}
}

func (p *pool) addrs() []string {
	var out []string
	for _, e := range p.engines {
		out = append(out, e.Addr())
	}
	return out
}

// lag is how far the slowest engine's simulated clock fell behind the
// wall clock's mapping since the pool started, as a fraction: 0 means
// every engine kept its time scale.
func (p *pool) lag() float64 {
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
}

func (c counters) minus(o counters) counters {
	return counters{c.hits - o.hits, c.queries - o.queries, c.prompt - o.prompt, c.generation - o.generation,
		c.preemptions - o.preemptions, c.success - o.success}
}

// snapshot scrapes every engine's counters.
func (p *pool) snapshot() ([]counters, error) {
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

// scrape reads an engine's counters and gauges, summed over label sets.
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
			}
		}
	}
	return out, nil
}
