package bench

import (
	"bytes"
	"context"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"
)

// oracleArm is a router no real one can be: it reads every engine's true
// prefix-cache contents for the request (vllmsim.Engine.Probe) and its true
// queue (Engine.Queue) at the moment of routing, and sends the request to
// the engine whose cost model predicts the lowest time to first token. It
// bounds what routing can do on a workload.
func oracleArm(ctx context.Context, _ *Tools, p *pool, _ string) (*router, error) {
	engines, err := p.simulated("view of its true cache and queue for an oracle")
	if err != nil {
		return nil, err
	}
	o := &oracle{pool: p, pending: make([]int, len(engines))}
	for _, e := range engines {
		u, err := url.Parse(e.URL())
		if err != nil {
			return nil, err
		}
		rp := httputil.NewSingleHostReverseProxy(u)
		rp.FlushInterval = -1 // stream tokens as they come
		rp.Transport = &http.Transport{MaxIdleConnsPerHost: 512, DisableCompression: true}
		o.proxies = append(o.proxies, rp)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: o, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	return &router{
		url:     "http://" + ln.Addr().String(),
		command: []string{"oracle (in the bench process: vllmsim Probe + Queue, CostModel.TTFT)"},
		stop:    func() { srv.Close() },
	}, nil
}

type oracle struct {
	pool    *pool
	proxies []*httputil.ReverseProxy
	mu      sync.Mutex
	pending []int // prompt tokens sent to each engine and not yet admitted, roughly
}

func (o *oracle) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		o.proxies[0].ServeHTTP(w, r) // /v1/models and the like: any engine answers
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	best, bestTTFT, uncached := 0, math.Inf(1), 0
	for i, e := range o.pool.engines {
		hit, err := e.Probe(r.URL.Path, body)
		if err != nil {
			continue // the engine will answer the error itself
		}
		cfg := e.Config()
		q := e.Queue()
		o.mu.Lock()
		q.PrefillTokens += o.pending[i]
		o.mu.Unlock()
		cached := hit.GPUTokens + hit.CPUTokens
		ttft := cfg.Cost.TTFT(q, cached, hit.PromptTokens-cached, cfg.MaxNumBatchedTokens)
		if ttft < bestTTFT {
			best, bestTTFT, uncached = i, ttft, hit.PromptTokens-cached
		}
	}
	// Until the engine admits it, the request is work Queue cannot see;
	// count it as pending for a moment so simultaneous requests spread.
	o.mu.Lock()
	o.pending[best] += uncached
	o.mu.Unlock()
	go func() {
		time.Sleep(20 * time.Millisecond)
		o.mu.Lock()
		o.pending[best] -= uncached
		o.mu.Unlock()
	}()
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	o.proxies[best].ServeHTTP(w, r)
}
