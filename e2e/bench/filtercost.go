package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/e2e/envoy"
)

// FilterCostOptions configure the filter-cost benchmark.
type FilterCostOptions struct {
	EnvoyYAML, Wasm, Floor string
	Sizes                  []int // request body sizes, bytes
	Rounds                 int   // interleaved rounds
	PerRound               int   // sequential requests per gateway, size and round
	Concurrency            int
	RPSDuration            time.Duration // per gateway and size
	Dir                    string
}

// Gateways of the filter-cost benchmark.
const (
	gwNone    = "no filter"
	gwFloor   = "floor module"
	gwKvroute = "kvroute"
)

// FilterCost is what the filter costs a request in real Envoy.
type FilterCost struct {
	Concurrency int        `json:"concurrency"`
	Rounds      int        `json:"rounds"`
	PerRound    int        `json:"requests_per_round"`
	Sizes       []SizeCost `json:"sizes"`
	// HeapBytes is a kvroute worker VM's Go heap after the run.
	HeapBytes int64 `json:"kvroute_vm_heap_bytes"`
}

// SizeCost is one body size.
type SizeCost struct {
	Bytes int `json:"bytes"`
	// Per gateway: latency percentiles over every sequential request (µs),
	// requests/s at the fixed concurrency.
	P50 map[string]float64 `json:"p50_us"`
	P99 map[string]float64 `json:"p99_us"`
	RPS map[string]float64 `json:"rps"`
	// Added over no filter, the median over rounds of each round's paired
	// difference (µs).
	AddedP50 map[string]float64 `json:"added_p50_us"`
	AddedP99 map[string]float64 `json:"added_p99_us"`
}

// MeasureFilterCost runs Envoy without a filter, with the floor module and
// with kvroute (the shipped envoy.yaml, local mode) in front of the same
// trivial upstreams, and measures each: one request at a time on a
// keep-alive connection, in interleaved rounds so that the machine's drift
// hits all three alike, and requests per second at a fixed concurrency.
func MeasureFilterCost(ctx context.Context, o FilterCostOptions) (*FilterCost, error) {
	ups, stop, err := trivialUpstreams(3)
	if err != nil {
		return nil, err
	}
	defer stop()
	gws := map[string]*gatewayProc{}
	defer func() {
		for _, g := range gws {
			g.p.Stop()
		}
	}()
	for _, name := range []string{gwNone, gwFloor, gwKvroute} {
		g, err := startCostGateway(ctx, o, name, ups)
		if err != nil {
			return nil, fmt.Errorf("bench: %s gateway: %w", name, err)
		}
		gws[name] = g
	}
	order := []string{gwNone, gwFloor, gwKvroute}
	res := &FilterCost{Concurrency: o.Concurrency, Rounds: o.Rounds, PerRound: o.PerRound}
	for _, size := range o.Sizes {
		body := chatOfSize(size)
		sc := SizeCost{Bytes: size, P50: map[string]float64{}, P99: map[string]float64{}, RPS: map[string]float64{},
			AddedP50: map[string]float64{}, AddedP99: map[string]float64{}}
		all := map[string][]time.Duration{}
		var perRound []map[string][2]float64 // p50, p99 per gateway
		for r := range o.Rounds {
			round := map[string][2]float64{}
			for k := range order {
				name := order[(k+r)%len(order)] // rotate who goes first
				ts, err := gws[name].sequential(ctx, body, o.PerRound)
				if err != nil {
					return nil, fmt.Errorf("bench: %s, %d bytes: %w", name, size, err)
				}
				all[name] = append(all[name], ts...)
				round[name] = [2]float64{pct(ts, 0.5), pct(ts, 0.99)}
			}
			perRound = append(perRound, round)
		}
		for _, name := range order {
			sc.P50[name], sc.P99[name] = pct(all[name], 0.5), pct(all[name], 0.99)
			if name == gwNone {
				continue
			}
			var d50, d99 []float64
			for _, round := range perRound {
				d50 = append(d50, round[name][0]-round[gwNone][0])
				d99 = append(d99, round[name][1]-round[gwNone][1])
			}
			sc.AddedP50[name], sc.AddedP99[name] = median(d50), median(d99)
		}
		for _, name := range order {
			rps, err := gws[name].throughput(ctx, body, o.Concurrency, o.RPSDuration)
			if err != nil {
				return nil, err
			}
			sc.RPS[name] = rps
		}
		res.Sizes = append(res.Sizes, sc)
	}
	if stats, err := gws[gwKvroute].p.Stats(ctx); err == nil {
		res.HeapBytes = stats["wasmcustom.kvroute.vm.heap_bytes"]
	}
	return res, nil
}

type gatewayProc struct {
	p      *envoy.Process
	url    string
	client *http.Client
}

func startCostGateway(ctx context.Context, o FilterCostOptions, name string, ups []string) (*gatewayProc, error) {
	cfg, err := envoy.LoadConfig(o.EnvoyYAML)
	if err != nil {
		return nil, err
	}
	if err := errors.Join(cfg.UseFreePorts(), cfg.SetEndpoints("engines", ups)); err != nil {
		return nil, err
	}
	switch name {
	case gwNone:
		err = cfg.RemoveWasmFilters()
	case gwFloor:
		var abs string
		if abs, err = filepath.Abs(o.Floor); err == nil {
			err = errors.Join(cfg.SetWasmCode("kvroute", abs), cfg.SetPluginConfiguration("kvroute", map[string]any{"endpoint": ups[0]}))
		}
	case gwKvroute:
		var abs string
		var pc map[string]any
		if abs, err = filepath.Abs(o.Wasm); err == nil {
			err = cfg.SetWasmCode("kvroute", abs)
		}
		if err == nil {
			pc, err = cfg.PluginConfiguration("kvroute")
		}
		if err == nil {
			// Local mode: the filter keeps its own index, so every request
			// takes the snapshot and policy path, as with cachesync.
			pc["endpoints"] = ups
			delete(pc, "cachesync")
			err = cfg.SetPluginConfiguration("kvroute", pc)
		}
	}
	if err != nil {
		return nil, err
	}
	b, err := cfg.Marshal()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(o.Dir, strings.ReplaceAll(name, " ", "-"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	p, err := envoy.Start(ctx, envoy.Options{Config: b, Dir: dir, Concurrency: 2})
	if err != nil {
		return nil, err
	}
	url, err := p.ListenerURL(ctx, "llm")
	if err != nil {
		p.Stop()
		return nil, err
	}
	return &gatewayProc{p: p, url: url, client: &http.Client{
		Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true},
	}}, nil
}

func (g *gatewayProc) post(ctx context.Context, body []byte) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.url+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("content-type", "application/json")
	resp, err := g.client.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// sequential sends n requests one at a time and returns their latencies.
func (g *gatewayProc) sequential(ctx context.Context, body []byte, n int) ([]time.Duration, error) {
	ts := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if err := g.post(ctx, body); err != nil {
			return nil, err
		}
		ts = append(ts, time.Since(start))
	}
	return ts, nil
}

// throughput keeps c requests in flight for d and returns requests/s.
func (g *gatewayProc) throughput(ctx context.Context, body []byte, c int, d time.Duration) (float64, error) {
	var done atomic.Int64
	var firstErr error
	var once sync.Once
	start := time.Now()
	var wg sync.WaitGroup
	for range c {
		wg.Go(func() {
			for time.Since(start) < d {
				if err := g.post(ctx, body); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	return float64(done.Load()) / time.Since(start).Seconds(), firstErr
}

// trivialUpstreams answer every request at once with a small JSON body, so
// that the gateway is all there is to measure.
func trivialUpstreams(n int) ([]string, func(), error) {
	var addrs []string
	var srvs []*http.Server
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, nil, err
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("content-type", "application/json")
			io.WriteString(w, `{"id":"cmpl-1","choices":[{"index":0,"text":"ok"}]}`)
		})}
		go srv.Serve(ln)
		addrs = append(addrs, ln.Addr().String())
		srvs = append(srvs, srv)
	}
	return addrs, func() {
		for _, s := range srvs {
			s.Close()
		}
	}, nil
}

// chatOfSize is a chat body of about n bytes: a system prompt shared by
// every request and a user message filling the rest, with escapes.
func chatOfSize(n int) []byte {
	system := strings.Repeat("You are a meticulous assistant for the \"billing\" team.\\n", 20)
	var user strings.Builder
	for user.Len()+len(system)+200 < n {
		user.WriteString("Tell me more about prefix caching and routing, please. ")
	}
	b, _ := json.Marshal(map[string]any{"model": "qwen", "max_tokens": 1, "messages": []map[string]string{
		{"role": "system", "content": system}, {"role": "user", "content": user.String()},
	}})
	return b
}

func pct(ts []time.Duration, p float64) float64 {
	s := slices.Clone(ts)
	slices.Sort(s)
	return float64(s[min(len(s)-1, int(p*float64(len(s))))].Nanoseconds()) / 1e3
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
