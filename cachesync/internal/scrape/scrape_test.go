package scrape

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/cachesync/internal/calibrate"
	"github.com/kvroute/kvroute/shared/snapshot"
)

var discard = slog.New(slog.DiscardHandler)

// Modes of a fake engine.
const (
	up      = iota
	failing // 500
	hanging // answers after the scraper's timeout
	garbage // 200 with a page that is not metrics
)

// fakeEngine serves a small vLLM page and models list in a mode a test
// switches.
type fakeEngine struct {
	srv      *httptest.Server
	mode     atomic.Int32
	running  atomic.Int32
	scrapes  atomic.Int32 // /metrics requests
	models   atomic.Int32 // /v1/models requests
	inFlight tracker      // /metrics requests being answered
	delay    time.Duration
}

// tracker counts requests in flight and the most at once.
type tracker struct{ now, most atomic.Int32 }

func (t *tracker) enter() {
	n := t.now.Add(1)
	for m := t.most.Load(); n > m && !t.most.CompareAndSwap(m, n); m = t.most.Load() {
	}
}

func (t *tracker) leave() { t.now.Add(-1) }

func newFakeEngine(t *testing.T, delay time.Duration) *fakeEngine {
	f := &fakeEngine{delay: delay}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeEngine) addr() string { return strings.TrimPrefix(f.srv.URL, "http://") }

func (f *fakeEngine) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/models":
		f.models.Add(1)
		fmt.Fprint(w, `{"object":"list","data":[{"id":"base","parent":null},{"id":"lora-a","parent":"base"}]}`)
		return
	case "/metrics":
	default:
		http.NotFound(w, r)
		return
	}
	f.scrapes.Add(1)
	f.inFlight.enter()
	defer f.inFlight.leave()
	switch f.mode.Load() {
	case failing:
		http.Error(w, "engine dead", http.StatusInternalServerError)
		return
	case hanging:
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
		return
	case garbage:
		fmt.Fprint(w, "<html>hello</html>")
		return
	}
	time.Sleep(f.delay)
	fmt.Fprintf(w, "vllm:num_requests_running{engine=\"0\"} %d\nvllm:num_requests_waiting{engine=\"0\"} 0\n"+
		"vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\nvllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"100\"} 1\n",
		f.running.Load())
}

// changes records OnChange calls.
type changes struct {
	mu  sync.Mutex
	all []State
}

func (c *changes) add(s State) {
	c.mu.Lock()
	c.all = append(c.all, s)
	c.mu.Unlock()
}

func (c *changes) healths(addr string) []snapshot.Health {
	c.mu.Lock()
	defer c.mu.Unlock()
	var hs []snapshot.Health
	for _, s := range c.all {
		if s.Addr == addr && (len(hs) == 0 || hs[len(hs)-1] != s.Health) {
			hs = append(hs, s.Health)
		}
	}
	return hs
}

// waitFor polls cond until it holds or the test times out.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func startScraper(t *testing.T, cfg Config) (*Scraper, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if cfg.Logger == nil {
		cfg.Logger = discard
	}
	s, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); s.Wait() })
	return s, cancel
}

func TestHealthFollowsScrapes(t *testing.T) {
	e := newFakeEngine(t, 0)
	var ch changes
	s, _ := startScraper(t, Config{Interval: 5 * time.Millisecond, Timeout: 50 * time.Millisecond, Misses: 3, OnChange: ch.add})
	s.Set([]string{e.addr()})
	healthy := func() bool { st, _ := s.State(e.addr()); return st.Health == snapshot.HealthHealthy }
	waitFor(t, "healthy", healthy)

	st, ok := s.State(e.addr())
	if !ok {
		t.Fatal("no state")
	}
	want := State{Addr: e.addr(), Health: snapshot.HealthHealthy, Kind: KindVLLM, Models: []string{"base"}, Adapters: []string{"lora-a"},
		KVCacheUsage: 0.5, BlockSize: 16, NumBlocks: 100, KVCapacity: 1600, Rate: st.Rate, Scraped: st.Scraped}
	if !reflect.DeepEqual(st, want) {
		t.Errorf("state\ngot  %+v\nwant %+v", st, want)
	}
	if st.Rate.Calibrated || st.Rate.TokensPerSecond != 15928 {
		t.Errorf("rate %+v, want the default", st.Rate)
	}
	info := st.EndpointInfo()
	if info.Addr != e.addr() || info.Health != snapshot.HealthHealthy || info.PrefillRate != st.Rate.TokensPerSecond ||
		!reflect.DeepEqual(info.Adapters, []string{"lora-a"}) {
		t.Errorf("endpoint info %+v", info)
	}

	// A load change reaches OnChange.
	e.running.Store(9)
	waitFor(t, "running 9", func() bool { st, _ := s.State(e.addr()); return st.Running == 9 })

	// Each kind of failure: unhealthy after three misses, healthy again at
	// the first success.
	for _, mode := range []int32{failing, hanging, garbage} {
		e.mode.Store(mode)
		waitFor(t, fmt.Sprintf("unhealthy in mode %d", mode), func() bool {
			st, _ := s.State(e.addr())
			return st.Health == snapshot.HealthUnhealthy
		})
		st, _ := s.State(e.addr())
		if st.Misses < 3 || st.Err == "" {
			t.Errorf("mode %d: unhealthy after %d misses, error %q", mode, st.Misses, st.Err)
		}
		models := e.models.Load()
		e.mode.Store(up)
		waitFor(t, "healthy again", healthy)
		if e.models.Load() == models {
			t.Error("models not read again after recovery")
		}
	}
	hs := ch.healths(e.addr())
	wantHs := []snapshot.Health{snapshot.HealthHealthy, snapshot.HealthUnhealthy, snapshot.HealthHealthy,
		snapshot.HealthUnhealthy, snapshot.HealthHealthy, snapshot.HealthUnhealthy, snapshot.HealthHealthy}
	if !reflect.DeepEqual(hs, wantHs) {
		t.Errorf("health changes %v, want %v", hs, wantHs)
	}
	stats := s.Stats()
	if stats.HealthChanges != 7 || stats.Failures < 9 || stats.Scrapes <= stats.Failures || stats.ScrapeSeconds <= 0 ||
		stats.Engines[snapshot.HealthHealthy] != 1 {
		t.Errorf("stats %+v", stats)
	}
}

// TestUnknownUntilMisses checks that an engine never seen up stays unknown
// for its first misses, then turns unhealthy.
func TestUnknownUntilMisses(t *testing.T) {
	e := newFakeEngine(t, 0)
	e.mode.Store(failing)
	s, _ := startScraper(t, Config{Interval: 20 * time.Millisecond, Misses: 5})
	s.Set([]string{e.addr()})
	waitFor(t, "a first miss", func() bool { st, _ := s.State(e.addr()); return st.Misses >= 1 })
	if st, _ := s.State(e.addr()); st.Misses < 5 && st.Health != snapshot.HealthUnknown {
		t.Errorf("health %v after %d misses, want unknown", st.Health, st.Misses)
	}
	waitFor(t, "unhealthy", func() bool { st, _ := s.State(e.addr()); return st.Health == snapshot.HealthUnhealthy })
}

// TestSetStopsPollers checks that engines leave at once: no state, no more
// requests, even for a poller stuck in a hanging scrape.
func TestSetStopsPollers(t *testing.T) {
	a, b := newFakeEngine(t, 0), newFakeEngine(t, 0)
	b.mode.Store(hanging)
	s, cancel := startScraper(t, Config{Interval: 5 * time.Millisecond, Timeout: time.Minute})
	s.Set([]string{a.addr(), b.addr()})
	waitFor(t, "both scraped", func() bool { return a.scrapes.Load() > 2 && b.inFlight.now.Load() == 1 })

	s.Set([]string{a.addr()})
	if _, ok := s.State(b.addr()); ok {
		t.Error("state of a removed engine")
	}
	waitFor(t, "the hanging scrape dropped", func() bool { return b.inFlight.now.Load() == 0 })
	n := b.scrapes.Load()
	time.Sleep(50 * time.Millisecond)
	if b.scrapes.Load() != n {
		t.Error("a removed engine is still scraped")
	}
	if got := s.States(); len(got) != 1 || got[0].Addr != a.addr() {
		t.Errorf("states %+v", got)
	}

	cancel()
	done := make(chan struct{})
	go func() { s.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("pollers still running after ctx ended")
	}
	// A scrape sent just before the end may still be on its way to the
	// engine (the poller gave up on it, the handler has not yet run); it
	// is not one sent after.
	time.Sleep(50 * time.Millisecond)
	waitFor(t, "scrapes in flight at the end to arrive", func() bool { return a.inFlight.now.Load() == 0 })
	n = a.scrapes.Load()
	s.Set([]string{a.addr(), b.addr()}) // after the end: ignored
	time.Sleep(30 * time.Millisecond)
	if a.scrapes.Load() != n || len(s.States()) != 1 {
		t.Error("scraping after ctx ended")
	}
}

// TestConcurrencyBound scrapes many slow engines through a small
// semaphore: never more in flight than allowed, and a hanging engine does
// not starve the others.
func TestConcurrencyBound(t *testing.T) {
	var es []*fakeEngine
	var addrs []string
	var all tracker
	for range 8 {
		e := newFakeEngine(t, 10*time.Millisecond)
		es = append(es, e)
		addrs = append(addrs, e.addr())
	}
	es[0].mode.Store(hanging)
	client := &http.Client{Transport: countingTransport{http.DefaultTransport, &all}}
	s, _ := startScraper(t, Config{Interval: 5 * time.Millisecond, Timeout: 30 * time.Millisecond, Concurrency: 2, Client: client})
	s.Set(addrs)
	waitFor(t, "every engine scraped thrice", func() bool {
		for _, e := range es[1:] {
			if e.scrapes.Load() < 3 {
				return false
			}
		}
		return true
	})
	if m := all.most.Load(); m > 2 {
		t.Errorf("%d scrapes in flight, want at most 2", m)
	}
}

func TestStartErrors(t *testing.T) {
	for _, cfg := range []Config{
		{Interval: -time.Second},
		{Misses: -1},
		{Calibration: calibrate.Config{Default: -1}},
	} {
		if _, err := Start(context.Background(), cfg); err == nil {
			t.Errorf("Start(%+v) succeeded", cfg)
		}
	}
}

// countingTransport counts requests from their start until their body is
// closed, as the scraper sees them.
type countingTransport struct {
	inner http.RoundTripper
	t     *tracker
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.t.enter()
	resp, err := c.inner.RoundTrip(r)
	if err != nil {
		c.t.leave()
		return nil, err
	}
	resp.Body = &countedBody{ReadCloser: resp.Body, leave: sync.OnceFunc(c.t.leave)}
	return resp, nil
}

type countedBody struct {
	io.ReadCloser
	leave func()
}

func (b *countedBody) Close() error {
	b.leave()
	return b.ReadCloser.Close()
}

// TestLlamaCppEngine scrapes a fake llama-server serving the pages a real
// one served: its kind from the metric names, its KV cache from /props
// (two slots of 4,096 tokens), the prompt in each slot from /slots (with
// LLAMA_SERVER_SLOTS_DEBUG=1, one slot busy), and what it says when it was
// started without --metrics.
func TestLlamaCppEngine(t *testing.T) {
	page := llamaCppPage(t)
	props, err := os.ReadFile("testdata/llamacpp-props.json")
	if err != nil {
		t.Fatal(err)
	}
	slots, err := os.ReadFile("testdata/llamacpp-slots.json")
	if err != nil {
		t.Fatal(err)
	}
	var metricsOff atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			if metricsOff.Load() {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusNotImplemented)
				fmt.Fprint(w, `{"error":{"code":501,"message":"This server does not support metrics endpoint. Start it with `+"`--metrics`"+`","type":"not_supported_error"}}`)
				return
			}
			w.Write(page)
		case "/props":
			w.Write(props)
		case "/slots":
			w.Write(slots)
		case "/v1/models":
			fmt.Fprint(w, `{"models":[{"name":"gemma-3-270m"}],"object":"list","data":[{"id":"gemma-3-270m","object":"model","owned_by":"llamacpp"}]}`)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	s, _ := startScraper(t, Config{Interval: 5 * time.Millisecond, Timeout: 100 * time.Millisecond, Misses: 2})
	s.Set([]string{addr})
	waitFor(t, "healthy", func() bool { st, _ := s.State(addr); return st.Health == snapshot.HealthHealthy })
	st, _ := s.State(addr)
	if st.Kind != KindLlamaCpp || st.KVCapacity != 8192 || st.Running != 2 || !reflect.DeepEqual(st.Models, []string{"gemma-3-270m"}) {
		t.Errorf("state %+v: want a llama.cpp engine of 8,192 cache tokens running 2, serving gemma-3-270m", st)
	}
	if st.Prefilled != 1959 {
		t.Errorf("prefilled %v tokens, want 1,959 (prompt_tokens_total leaves the cached ones out)", st.Prefilled)
	}
	want := []Slot{
		{ID: 0, Busy: true, Remaining: 123, Prompt: "Write a long story about a cat."},
		{ID: 1, Prompt: "You are a helpful assistant. Answer briefly.\n\n  Question: what is 2+2? café ✓ <start_of_turn>user\nhi<end_of_turn>\n\t end"},
	}
	if !reflect.DeepEqual(st.Slots, want) {
		t.Errorf("slots %+v, want %+v (the prompts as sent, without the BOS)", st.Slots, want)
	}

	metricsOff.Store(true)
	waitFor(t, "unhealthy", func() bool { st, _ := s.State(addr); return st.Health == snapshot.HealthUnhealthy })
	if st, _ := s.State(addr); !strings.Contains(st.Err, "Start it with `--metrics`") {
		t.Errorf("error %q does not pass on what to fix", st.Err)
	}
}
