// Command demo runs kvroute end to end on loopback and shows what it does:
// four simulated vLLM engines, cachesync, and Envoy with the shipped
// envoy.yaml, driven by a multi-turn chat workload of several tenants, each
// with a long system prompt. The same workload runs first behind plain
// round robin (Envoy without the filter), then behind kvroute, on fresh
// engines each time, and the two are printed side by side.
//
// Run it from the repository root with `make demo`.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/e2e/envoy"
	"github.com/kvroute/kvroute/e2e/vllmsim"
)

const (
	servedModel = "Qwen/Qwen2.5-32B-Instruct" // ChatML, as envoy.yaml renders
	gatewayURL  = "http://127.0.0.1:10000"
	reportToken = "kvroute-demo-token" // envoy.yaml's
)

// quiet drops the simulated engines' logs, which would drown the results.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type options struct {
	tenants, users, turns int
	timeScale             float64
	gpuBlocks             int
	cachesync             string
}

func main() {
	var o options
	flag.IntVar(&o.tenants, "tenants", 8, "tenants, each with its own long system prompt")
	flag.IntVar(&o.users, "users", 4, "concurrent users per tenant")
	flag.IntVar(&o.turns, "turns", 4, "turns per conversation")
	flag.Float64Var(&o.timeScale, "time-scale", 0.2, "wall seconds per simulated engine second")
	flag.IntVar(&o.gpuBlocks, "gpu-blocks", 1536, "KV-cache blocks (16 tokens) per engine")
	flag.StringVar(&o.cachesync, "cachesync", "build/cachesync", "cachesync binary")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	if _, err := os.Stat("envoy.yaml"); err != nil {
		return errors.New("run from the repository root (make demo)")
	}
	work := newWorkload(o)
	fmt.Printf("workload: %d tenants x %d users x %d turns = %d chat requests; system prompts of ~%d tokens; %d engines of %d KV blocks (%d tokens)\n\n",
		o.tenants, o.users, o.turns, o.tenants*o.users*o.turns, work.systemTokens(), 4, o.gpuBlocks, o.gpuBlocks*16)

	var results []result
	for _, kvroute := range []bool{false, true} {
		r, err := runPhase(ctx, o, work, kvroute)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	printResults(results, o)
	return nil
}

// A phase: fresh engines, (cachesync), Envoy, the workload, the figures.
func runPhase(ctx context.Context, o options, work *workload, kvroute bool) (result, error) {
	name := "round robin"
	if kvroute {
		name = "kvroute"
	}
	fmt.Printf("== %s: starting engines%s and Envoy\n", name, map[bool]string{true: ", cachesync"}[kvroute])
	engines, err := startEngines(ctx, o)
	if err != nil {
		return result{}, err
	}
	defer func() {
		for _, e := range engines {
			e.Close()
		}
	}()
	if kvroute {
		stopCachesync, err := startCachesync(ctx, o, engines)
		if err != nil {
			return result{}, err
		}
		defer stopCachesync()
	}
	gw, err := startEnvoy(ctx, kvroute)
	if err != nil {
		return result{}, err
	}
	defer gw.Stop()

	fmt.Printf("   running the workload\n")
	start := time.Now()
	ttfts, err := work.run(ctx, o)
	if err != nil {
		return result{}, err
	}
	r := result{name: name, wall: time.Since(start), ttft: ttfts}
	for _, e := range engines {
		m, err := scrape(e.URL())
		if err != nil {
			return result{}, err
		}
		r.perEngine = append(r.perEngine, int(m["vllm:request_success_total"]))
		r.hits += m["vllm:prefix_cache_hits_total"]
		r.queries += m["vllm:prefix_cache_queries_total"]
		r.promptTokens += m["vllm:prompt_tokens_total"]
	}
	if kvroute {
		stats, err := gw.Stats(ctx)
		if err != nil {
			return result{}, err
		}
		r.decisions = map[string]int64{}
		for k, v := range stats {
			if reason, ok := strings.CutPrefix(k, "wasmcustom.kvroute.decisions."); ok && v > 0 {
				r.decisions[reason] = v
			}
		}
	}
	return r, nil
}

func startEngines(ctx context.Context, o options) ([]*vllmsim.Engine, error) {
	var es []*vllmsim.Engine
	for i := range 4 {
		e, err := vllmsim.Start(ctx, vllmsim.Config{
			Host: "127.0.0.1", Port: 8001 + i, Model: servedModel, NumGPUBlocks: o.gpuBlocks, TimeScale: o.timeScale,
			Logger: quiet,
			// Event sockets bind on loopback, on ports the engines pick.
			KVEvents: vllmsim.KVEventsConfig{
				EnableKVCacheEvents: true, Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*",
			},
		})
		if err != nil {
			for _, e := range es {
				e.Close()
			}
			return nil, fmt.Errorf("engine %d (envoy.yaml expects 127.0.0.1:%d): %w", i+1, 8001+i, err)
		}
		es = append(es, e)
	}
	return es, nil
}

func startCachesync(ctx context.Context, o options, es []*vllmsim.Engine) (func(), error) {
	var spec []string
	for _, e := range es {
		spec = append(spec, e.Addr()+"?events="+e.EventsEndpoint()+"&replay="+e.ReplayEndpoint())
	}
	cmd := exec.CommandContext(ctx, o.cachesync, "-listen", "127.0.0.1:8080", "-engines", strings.Join(spec, ","),
		"-tokenizer", "cl100k_base", "-report-token", reportToken, "-scrape-interval", "250ms", "-log-level", "warn")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start cachesync (make demo builds %s): %w", o.cachesync, err)
	}
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		if resp, err := http.Get("http://127.0.0.1:8080/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return stop, nil
			}
		}
		if time.Now().After(deadline) {
			stop()
			return nil, errors.New("cachesync did not become ready on 127.0.0.1:8080")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func startEnvoy(ctx context.Context, kvroute bool) (*envoy.Process, error) {
	cfg, err := envoy.LoadConfig("envoy.yaml")
	if err != nil {
		return nil, err
	}
	if kvroute {
		abs, err := filepath.Abs("build/kvroute.wasm")
		if err != nil {
			return nil, err
		}
		if err := cfg.SetWasmCode("kvroute", abs); err != nil {
			return nil, err
		}
	} else {
		if err := cfg.RemoveWasmFilters(); err != nil {
			return nil, err
		}
		if err := cfg.SetRoundRobin("engines"); err != nil {
			return nil, err
		}
	}
	b, err := cfg.Marshal()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kvroute-demo")
	if err != nil {
		return nil, err
	}
	p, err := envoy.Start(ctx, envoy.Options{Config: b, Dir: dir, Concurrency: 2})
	if err != nil {
		return nil, fmt.Errorf("start Envoy (envoy.yaml listens on 127.0.0.1:10000, admin 9901): %w", err)
	}
	return p, nil
}

// workload is multi-turn conversations: each tenant has a long system
// prompt its users share, and each turn resends the conversation so far.
type workload struct {
	systems []string
}

func newWorkload(o options) *workload {
	w := &workload{}
	for t := range o.tenants {
		var b strings.Builder
		fmt.Fprintf(&b, "You are the support assistant of tenant %d. ", t)
		for i := 0; b.Len() < 24000; i++ {
			fmt.Fprintf(&b, "Policy %d.%d: answer refund, billing and shipping questions precisely, citing the order number. ", t, i)
		}
		w.systems = append(w.systems, b.String())
	}
	return w
}

func (w *workload) systemTokens() int { return len(w.systems[0]) / 4 }

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// run sends every conversation, users in parallel, turns in order; it
// returns each request's time to first token in engine (simulated) time.
func (w *workload) run(ctx context.Context, o options) ([]time.Duration, error) {
	client := &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	var mu sync.Mutex
	var ttfts []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	for t := range o.tenants {
		for u := range o.users {
			wg.Add(1)
			go func() {
				defer wg.Done()
				msgs := []message{{"system", w.systems[t]}}
				for turn := range o.turns {
					msgs = append(msgs, message{"user", fmt.Sprintf("User %d, turn %d: where is order %d-%d and when will it arrive?", u, turn, t, u*100+turn)})
					ttft, answer, err := chat(ctx, client, msgs)
					mu.Lock()
					if err != nil && firstErr == nil {
						firstErr = err
					}
					ttfts = append(ttfts, time.Duration(float64(ttft)/o.timeScale))
					mu.Unlock()
					if err != nil {
						return
					}
					msgs = append(msgs, message{"assistant", answer})
				}
			}()
		}
	}
	wg.Wait()
	return ttfts, firstErr
}

// chat streams one request through the gateway and times its first token.
func chat(ctx context.Context, client *http.Client, msgs []message) (time.Duration, string, error) {
	body, _ := json.Marshal(map[string]any{"model": servedModel, "messages": msgs, "max_tokens": 48, "stream": true})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gatewayURL+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("content-type", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return 0, "", fmt.Errorf("gateway answered %s: %s", resp.Status, b)
	}
	var ttft time.Duration
	var answer strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(data), &chunk) == nil && len(chunk.Choices) > 0 && chunk.Choices[0].Delta.Content != "" {
			if ttft == 0 {
				ttft = time.Since(start)
			}
			answer.WriteString(chunk.Choices[0].Delta.Content)
		}
	}
	return ttft, answer.String(), sc.Err()
}

// scrape reads an engine's counters, summed over label sets.
func scrape(url string) (map[string]float64, error) {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("engine metrics: %w", err)
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

type result struct {
	name          string
	wall          time.Duration
	ttft          []time.Duration
	perEngine     []int
	hits, queries float64
	promptTokens  float64
	decisions     map[string]int64
}

func (r *result) pct(p float64) time.Duration {
	s := slices.Clone(r.ttft)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func printResults(rs []result, o options) {
	fmt.Printf("\n%-30s", "")
	for _, r := range rs {
		fmt.Printf("%18s", r.name)
	}
	fmt.Println()
	row := func(label string, f func(r *result) string) {
		fmt.Printf("%-30s", label)
		for i := range rs {
			fmt.Printf("%18s", f(&rs[i]))
		}
		fmt.Println()
	}
	row("requests per engine", func(r *result) string {
		var s []string
		for _, n := range r.perEngine {
			s = append(s, strconv.Itoa(n))
		}
		return strings.Join(s, "/")
	})
	row("prefix-cache hit rate", func(r *result) string { return fmt.Sprintf("%.1f%%", 100*r.hits/r.queries) })
	row("prompt tokens prefilled", func(r *result) string { return strconv.Itoa(int(r.queries - r.hits)) })
	for _, p := range []float64{0.5, 0.9, 0.99} {
		row(fmt.Sprintf("TTFT p%.0f (engine time)", p*100), func(r *result) string { return r.pct(p).Round(time.Millisecond).String() })
	}
	row("wall time", func(r *result) string { return r.wall.Round(10 * time.Millisecond).String() })
	row("prompt tokens/s (engine time)", func(r *result) string {
		return strconv.Itoa(int(r.promptTokens / (r.wall.Seconds() / o.timeScale)))
	})
	fmt.Println()
	for _, r := range rs {
		if r.decisions == nil {
			continue
		}
		var names []string
		for k := range r.decisions {
			names = append(names, k)
		}
		sort.Strings(names)
		var parts []string
		for _, k := range names {
			parts = append(parts, k+"="+strconv.FormatInt(r.decisions[k], 10))
		}
		fmt.Printf("kvroute decisions by reason: %s\n", strings.Join(parts, ", "))
	}
}
