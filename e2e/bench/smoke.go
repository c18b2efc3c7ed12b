package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// SmokeResult is one arm of the smoke run.
type SmokeResult struct {
	Arm       string
	Requests  int
	Failed    int
	OutputTPS float64 // generated tokens per second, from the engines' counters
	HitRate   float64 // prefix-cache hit rate, from the engines' counters
	TTFTp50   time.Duration
}

// Smoke is a short run for CI: fresh engines behind each arm, a closed loop
// of clients (a small Go client, not inference-perf) sending a b2b-saas-like
// workload for d. It returns each arm's figures for an ordering check; the
// figures themselves mean little at this size.
func Smoke(ctx context.Context, t Tools, arms []*Arm, d time.Duration, dir string) ([]SmokeResult, error) {
	var out []SmokeResult
	for _, a := range arms {
		r, err := smokeArm(ctx, t, a, d, dir)
		if err != nil {
			return out, fmt.Errorf("bench: smoke %s: %w", a.Name, err)
		}
		out = append(out, r)
	}
	return out, nil
}

func smokeArm(ctx context.Context, t Tools, a *Arm, d time.Duration, dir string) (SmokeResult, error) {
	res := SmokeResult{Arm: a.Name}
	p, err := startPool(ctx, EngineConfig{Count: 4, GPUBlocks: 1024, TimeScale: 1}, nil, "")
	if err != nil {
		return res, err
	}
	defer p.close()
	adir := dir + "/" + a.Name
	if err := os.MkdirAll(adir, 0o755); err != nil {
		return res, err
	}
	rt, err := a.start(ctx, &t, p, adir)
	if err != nil {
		return res, err
	}
	defer rt.stop()
	if err := waitReady(ctx, rt.url+"/v1/models", 60*time.Second); err != nil {
		return res, err
	}
	before, err := p.snapshot()
	if err != nil {
		return res, err
	}
	prompts := smokePrompts()
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var mu sync.Mutex
	var ttfts []time.Duration
	start := time.Now()
	var wg sync.WaitGroup
	for c := range 12 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(c), 9))
			for time.Since(start) < d && ctx.Err() == nil {
				ttft, err := smokeRequest(ctx, client, rt.url, prompts[r.IntN(len(prompts))])
				mu.Lock()
				res.Requests++
				if err != nil {
					res.Failed++
				} else {
					ttfts = append(ttfts, ttft)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	after, err := p.snapshot()
	if err != nil {
		return res, err
	}
	var sum counters
	for i := range after {
		d := after[i].minus(before[i])
		sum.generation += d.generation
		sum.hits += d.hits
		sum.queries += d.queries
	}
	res.OutputTPS = sum.generation / elapsed.Seconds()
	if sum.queries > 0 {
		res.HitRate = sum.hits / sum.queries
	}
	if len(ttfts) > 0 {
		slices.Sort(ttfts)
		res.TTFTp50 = ttfts[len(ttfts)/2]
	}
	return res, nil
}

// smokePrompts are 16 tenants x 4 users: a 3,000-token system prompt each
// (4 bytes of text make about a token) and a 300-token question. The
// prefixes fill three quarters of the four engines' KV cache: one engine
// holds a third of them, the pool all of them.
func smokePrompts() []string {
	r := rand.New(rand.NewPCG(42, 42))
	words := strings.Fields("invoice refund shipment customer order ledger audit policy account balance contract renewal tier discount region warehouse")
	text := func(tokens int) string {
		var b strings.Builder
		for b.Len() < 4*tokens {
			b.WriteString(words[r.IntN(len(words))])
			b.WriteByte(' ')
		}
		return b.String()
	}
	var out []string
	for g := range 16 {
		system := fmt.Sprintf("Tenant %d. ", g) + text(3000)
		for range 4 {
			out = append(out, system+"\nQuestion: "+text(300))
		}
	}
	return out
}

// smokeRequest streams one completion and returns its time to first token.
func smokeRequest(ctx context.Context, client *http.Client, url, prompt string) (time.Duration, error) {
	body, _ := json.Marshal(map[string]any{"model": Model, "prompt": prompt, "max_tokens": 16, "stream": true})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("content-type", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %s", resp.Status)
	}
	var ttft time.Duration
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if ttft == 0 && strings.HasPrefix(sc.Text(), "data: {") {
			ttft = time.Since(start)
		}
	}
	return ttft, sc.Err()
}
