package daemon

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/cachesync/internal/calibrate"
	"github.com/kvroute/kvroute/cachesync/internal/discovery"
	"github.com/kvroute/kvroute/cachesync/internal/scrape"
	"github.com/kvroute/kvroute/cachesync/internal/tokenbytes"
	"github.com/kvroute/kvroute/e2e/vllmsim"
	"github.com/kvroute/kvroute/internal/syncbuf"
	"github.com/kvroute/kvroute/shared/approx"
	"github.com/kvroute/kvroute/shared/blockhash"
	"github.com/kvroute/kvroute/shared/predict"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/report"
	"github.com/kvroute/kvroute/shared/snapshot"
	"github.com/prometheus/client_golang/prometheus"
)

const model = "Qwen/Qwen2.5-7B-Instruct"

// fetcher follows a running cachesync like the filter does: bundles since
// the generation held, parts into a map standing in for shared data.
type fetcher struct {
	t     *testing.T
	url   string
	token string
	store map[string][]byte
	keys  *snapshot.Keys
	view  *snapshot.View
}

// newFetcher fetches d's snapshots as a gateway does, with d's token.
func newFetcher(t *testing.T, d *Daemon) *fetcher {
	keys := snapshot.NewKeys("t/")
	return &fetcher{t: t, url: "http://" + d.Addr(), token: d.cfg.ReportToken, store: map[string][]byte{}, keys: keys, view: snapshot.NewView(keys)}
}

func (f *fetcher) sync() {
	since := uint64(0)
	if m := f.view.Manifest(); m != nil {
		since = m.Generation()
	}
	req, err := http.NewRequest("GET", f.url+"/v1/snapshot?since="+strconv.FormatUint(since, 10), nil)
	if err != nil {
		f.t.Fatal(err)
	}
	if f.token != "" {
		req.Header.Set("Authorization", "Bearer "+f.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusServiceUnavailable {
		return
	}
	if resp.StatusCode != http.StatusOK {
		f.t.Fatalf("snapshot: %s %s", resp.Status, body)
	}
	b, err := snapshot.ParseBundle(body)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := b.Complete(f.view.Manifest()); err != nil {
		f.t.Fatal(err)
	}
	for _, p := range b.Parts() {
		f.store[f.keys.Part(p)] = p.Data
	}
	f.store[f.keys.Head()] = b.Manifest().AppendHead(nil)
	if _, err := f.view.Refresh(func(k string) ([]byte, error) { return f.store[k], nil }); err != nil {
		f.t.Fatal(err)
	}
}

// holds reports how many leading hashes the endpoint at addr holds.
func (f *fetcher) holds(addr string, hashes []uint64) int {
	m := f.view.Manifest()
	if m == nil {
		return 0
	}
	slot := -1
	for i := range m.NumEndpoints() {
		if m.Endpoint(i).Addr() == addr {
			slot = i
		}
	}
	if slot < 0 {
		return 0
	}
	out := make([]snapshot.Match, m.NumEndpoints())
	f.view.Prefix(hashes, out)
	return int(out[slot].Blocks)
}

func (f *fetcher) endpoint(addr string) (snapshot.Endpoint, bool) {
	m := f.view.Manifest()
	for i := 0; m != nil && i < m.NumEndpoints(); i++ {
		if e := m.Endpoint(i); e.Addr() == addr {
			return e, true
		}
	}
	return snapshot.Endpoint{}, false
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func startDaemon(t *testing.T, cfg Config) *Daemon {
	t.Helper()
	d := newDaemon(t, cfg)
	runDaemon(t, d)
	return d
}

// newDaemon builds a daemon for cfg with test intervals, not yet running.
func newDaemon(t *testing.T, cfg Config) *Daemon {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	if cfg.SyncInterval == 0 {
		cfg.SyncInterval = 50 * time.Millisecond
	}
	cfg.ScrapeInterval, cfg.ScrapeMisses = 100*time.Millisecond, 2
	cfg.Hash = blockhash.Config{BlockSize: blockhash.DefaultBlockSize, MaxBlocks: blockhash.DefaultMaxBlocks}
	cfg.BytesPerToken, cfg.LogFormat = 4, "text"
	d, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// runDaemon runs d until the test ends.
func runDaemon(t *testing.T, d *Daemon) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("daemon: %v", err)
		}
	})
}

func chat(t *testing.T, url, system, user string) []byte {
	t.Helper()
	body := []byte(`{"model":"` + model + `","max_tokens":1,"messages":[{"role":"system","content":"` + system +
		`"},{"role":"user","content":"` + user + `"}]}`)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("engine answered %s", resp.Status)
	}
	return body
}

func filterHashes(t *testing.T, body []byte) []uint64 {
	p, err := prompt.Render(nil, body, prompt.ChatML)
	if err != nil {
		t.Fatal(err)
	}
	return blockhash.Append(nil, blockhash.Seed(p.Model, ""), p.Text, blockhash.Config{})
}

func TestPreciseIndexFollowsEngines(t *testing.T) {
	ctx := t.Context()
	es, err := vllmsim.StartN(ctx, 2, vllmsim.Config{Model: model, NumGPUBlocks: 64, TimeScale: 0.001,
		KVEvents: vllmsim.KVEventsConfig{EnableKVCacheEvents: true}})
	if err != nil {
		t.Fatal(err)
	}
	var spec []string
	for _, e := range es {
		spec = append(spec, e.Addr()+"?events="+e.EventsEndpoint()+"&replay="+e.ReplayEndpoint())
	}
	d := startDaemon(t, Config{Engines: strings.Join(spec, ","), Tokenizer: "cl100k_base"})
	f := newFetcher(t, d)

	// Warm engine 0 directly: only its events can tell cachesync.
	body := chat(t, es[0].URL(), strings.Repeat("You audit invoices for ACME. ", 30), "first question")
	hashes := filterHashes(t, body)
	eventually(t, "engine 0's prefix in the snapshot", func() bool {
		f.sync()
		return f.holds(es[0].Addr(), hashes) >= len(hashes)*3/4
	})
	if n := f.holds(es[1].Addr(), hashes); n != 0 {
		t.Errorf("engine 1 holds %d blocks it never computed", n)
	}
	if e, ok := f.endpoint(es[0].Addr()); !ok || e.Health() != snapshot.HealthHealthy || e.NumModels() == 0 {
		t.Errorf("engine 0's row: found %v, health %d, %d models", ok, e.Health(), e.NumModels())
	}

	// Evict it by filling the small cache with other prompts.
	for i := range 12 {
		chat(t, es[0].URL(), strings.Repeat("filler "+strconv.Itoa(i)+" ", 80), "x")
	}
	eventually(t, "the evicted prefix to leave the snapshot", func() bool {
		f.sync()
		return f.holds(es[0].Addr(), hashes) < len(hashes)/2
	})

	// An engine that stops answering turns unhealthy.
	es[1].Close()
	eventually(t, "engine 1 unhealthy", func() bool {
		f.sync()
		e, ok := f.endpoint(es[1].Addr())
		return ok && e.Health() == snapshot.HealthUnhealthy
	})

	metrics := get(t, "http://"+d.Addr()+"/metrics")
	for _, want := range []string{`kvroute_cachesync_kv_events_total{type="BlockStored"}`, `kvroute_cachesync_engines{mode="precise"} 2`,
		"kvroute_cachesync_snapshot_generation", `kvroute_cachesync_engines_by_health{health="unhealthy"} 1`, "kvroute_cachesync_scrape_failures_total"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestApproximateIndexFromReports(t *testing.T) {
	es, err := vllmsim.StartN(t.Context(), 2, vllmsim.Config{Model: model, NumGPUBlocks: 256, TimeScale: 0.001})
	if err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, Config{Engines: es[0].Addr() + "," + es[1].Addr(), ReportToken: "tok"})
	f := newFetcher(t, d)
	hashes := []uint64{11, 22, 33, 44}
	batch, err := report.AppendRecord(nil, &report.Record{Endpoint: es[1].Addr(), Model: model, Hashes: hashes, Output: 300})
	if err != nil {
		t.Fatal(err)
	}
	var w report.Writer
	if _, err := w.AddEncoded(batch); err != nil {
		t.Fatal(err)
	}
	post := func(token string) int {
		req, _ := http.NewRequest("POST", "http://"+d.Addr()+"/v1/reports", bytes.NewReader(w.Bytes()))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	eventually(t, "readiness", func() bool { return get(t, "http://"+d.Addr()+"/readyz") != "" })
	if code := post("wrong"); code != http.StatusUnauthorized {
		t.Errorf("report with a wrong token: %d", code)
	}
	if code := post("tok"); code != http.StatusAccepted {
		t.Fatalf("report: %d", code)
	}
	eventually(t, "the reported prefix in the snapshot", func() bool {
		f.sync()
		return f.holds(es[1].Addr(), hashes) == len(hashes)
	})
	// The decode it asked for shows as the engine's demand: 300 tokens
	// over the 30 s time constant, decayed a little since.
	metrics := get(t, "http://"+d.Addr()+"/metrics")
	for addr, want := range map[string]float64{es[0].Addr(): 0, es[1].Addr(): 10} {
		got, ok := metricValue(metrics, `kvroute_cachesync_engine_decode_demand_tokens_per_second{engine="`+addr+`"}`)
		if !ok || got > want || got < 0.9*want {
			t.Errorf("decode demand of %s: %v (found %v), want %v", addr, got, ok, want)
		}
	}

	// The engine serves a request, then restarts with an empty cache:
	// its counters going back to zero must empty its entries, which
	// no event would.
	resp, err := http.Post(es[1].URL()+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"`+model+`","prompt":"hello there","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	eventually(t, "cachesync to see the request served", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.engines[es[1].Addr()].last.Served >= 1
	})
	if err := es[1].Restart(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the restarted engine's entries to go", func() bool {
		f.sync()
		return f.holds(es[1].Addr(), hashes) == 0
	})
}

func TestConfigFromFlagsAndEnvironment(t *testing.T) {
	env := map[string]string{"CACHESYNC_ENGINES": "10.0.0.1:8000", "CACHESYNC_REPORT_TOKEN": "from-env", "CACHESYNC_SYNC_INTERVAL": "250ms",
		"CACHESYNC_CHAT_TEMPLATE_FILE": "/models/a/tokenizer_config.json, /models/b/chat_template.jinja,"}
	cfg, err := ParseFlags([]string{"-report-token", "from-flag", "-log-format", "json"}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Engines != "10.0.0.1:8000" || cfg.ReportToken != "from-flag" || cfg.SyncInterval != 250*time.Millisecond || cfg.LogFormat != "json" {
		t.Errorf("parsed %+v", cfg)
	}
	if got := cfg.chatTemplateFiles(); !slices.Equal(got, []string{"/models/a/tokenizer_config.json", "/models/b/chat_template.jinja"}) {
		t.Errorf("chat template files %q", got)
	}
	if !cfg.MoveGroups {
		t.Error("the planner is off by default; it is meant to be on")
	}
	for _, off := range []struct {
		args []string
		env  map[string]string
	}{
		{[]string{"-engines", "10.0.0.1:8000", "-move-groups=false"}, nil},
		{[]string{"-engines", "10.0.0.1:8000"}, map[string]string{"CACHESYNC_MOVE_GROUPS": "false"}},
	} {
		cfg, err := ParseFlags(off.args, func(k string) string { return off.env[k] })
		if err != nil || cfg.MoveGroups {
			t.Errorf("ParseFlags(%q, %v): planner on %v, error %v; want it off", off.args, off.env, cfg.MoveGroups, err)
		}
	}
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, nil, "exactly one of"},
		{[]string{"-engines", "a:1", "-dns-name", "x"}, nil, "exactly one of"},
		{[]string{"-engines", "10.0.0.1:8000", "-log-format", "yaml"}, nil, "log-format"},
		{[]string{"-k8s-service", "noslash"}, nil, "namespace/name"},
		{[]string{"-k8s-inference-pool", "noslash"}, nil, "k8s-inference-pool: want namespace/name"},
		{[]string{"-engines", "10.0.0.1:8000", "-peers", "10.0.0.9"}, nil, "peers: 10.0.0.9 is not host:port"},
		{[]string{"-k8s-inference-pool", "llm/qwen", "-k8s-service", "llm/vllm"}, nil, "exactly one of"},
		{[]string{"-engines", "10.0.0.1:8000"}, map[string]string{"CACHESYNC_SYNC_INTERVAL": "soon"}, "CACHESYNC_SYNC_INTERVAL"},
		{[]string{"-engines", "10.0.0.1:8000", "-events-port", "70000"}, nil, "port"},
		{[]string{"-engines", "10.0.0.1:8000", "-sync-interval", "1ms"}, nil, "sync-interval"},
	} {
		_, err := ParseFlags(c.args, func(k string) string { return c.env[k] })
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %v: error %v, want one mentioning %q", c.args, c.env, err, c.want)
		}
	}
}

func get(t *testing.T, url string) string {
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return ""
	}
	return string(b)
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestPreciseIndexFromConnectingPublishers: engines whose KV-event
// endpoint names cachesync's host (so vLLM's publisher connects) share the
// socket cachesync binds, each publishing under kv@<its ip>@<model>; each
// engine's blocks land on its own row. A third engine's publisher connects
// somewhere else (a misconfigured endpoint): it serves requests without a
// single event reaching cachesync, and cachesync says so, once. A fourth,
// which discovery does not know, connects to the shared socket: its
// batches are counted as unrouted and land on no engine's row.
func TestPreciseIndexFromConnectingPublishers(t *testing.T) {
	listen := "tcp://127.0.0.1:" + strconv.Itoa(freePort(t))
	elsewhere := "tcp://127.0.0.1:" + strconv.Itoa(freePort(t))
	var es []*vllmsim.Engine
	var spec []string
	for i, pub := range []string{listen, listen, elsewhere} {
		host := "127.0.0." + strconv.Itoa(i+2)
		kv := vllmsim.KVEventsConfig{EnableKVCacheEvents: true, Endpoint: pub, Topic: "kv@" + host + "@" + model}
		if pub == listen {
			kv.ReplayEndpoint = "tcp://" + host + ":*"
		}
		e, err := vllmsim.Start(t.Context(), vllmsim.Config{Host: host, Model: model, NumGPUBlocks: 256, TimeScale: 0.001, KVEvents: kv})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		es = append(es, e)
		s := e.Addr() + "?events=listen"
		if kv.ReplayEndpoint != "" {
			s += "&replay=" + e.ReplayEndpoint()
		}
		spec = append(spec, s)
	}
	stray, err := vllmsim.Start(t.Context(), vllmsim.Config{Host: "127.0.0.9", Model: model, NumGPUBlocks: 256, TimeScale: 0.001,
		KVEvents: vllmsim.KVEventsConfig{EnableKVCacheEvents: true, Endpoint: listen, Topic: "kv@127.0.0.9@" + model}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stray.Close() })
	logs := &syncbuf.Buffer{}
	cfg := Config{Engines: strings.Join(spec, ","), Tokenizer: "cl100k_base", Events: discovery.EventPorts{Listen: listen}}
	cfg.Listen = "127.0.0.1:0"
	cfg.SyncInterval, cfg.ScrapeInterval, cfg.ScrapeMisses = 50*time.Millisecond, 100*time.Millisecond, 2
	cfg.Hash = blockhash.Config{BlockSize: blockhash.DefaultBlockSize, MaxBlocks: blockhash.DefaultMaxBlocks}
	cfg.BytesPerToken, cfg.LogFormat = 4, "text"
	d, err := New(cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	d.silence = time.Second
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("daemon: %v", err)
		}
	})
	f := newFetcher(t, d)

	for i, e := range es[:2] {
		body := chat(t, e.URL(), strings.Repeat("Tenant "+strconv.Itoa(i)+" audits invoices. ", 30), "first question")
		hashes := filterHashes(t, body)
		eventually(t, "engine "+strconv.Itoa(i)+"'s prefix in the snapshot", func() bool {
			f.sync()
			return f.holds(e.Addr(), hashes) >= len(hashes)*3/4
		})
		if n := f.holds(es[1-i].Addr(), hashes); n != 0 {
			t.Errorf("engine %d holds %d blocks engine %d computed", 1-i, n, i)
		}
	}
	strayBody := chat(t, stray.URL(), strings.Repeat("An engine discovery never found. ", 30), "q")
	eventually(t, "the unknown engine's batches counted", func() bool {
		n, _ := metricValue(get(t, "http://"+d.Addr()+"/metrics"), "kvroute_cachesync_kv_event_unrouted_total")
		return n > 0
	})
	f.sync()
	for _, e := range es[:2] {
		if n := f.holds(e.Addr(), filterHashes(t, strayBody)); n != 0 {
			t.Errorf("engine %s holds %d blocks of an engine nobody discovered", e.Addr(), n)
		}
	}
	const warning = "engine serves requests but has sent no KV events"
	if strings.Contains(logs.String(), warning) {
		t.Fatalf("warned about silence before the silent engine served anything:\n%s", logs)
	}
	chat(t, es[2].URL(), strings.Repeat("Nobody hears this engine. ", 30), "q")
	eventually(t, "the warning about the silent engine", func() bool {
		chat(t, es[2].URL(), "again", "q")
		return strings.Contains(logs.String(), warning)
	})
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, warning) && !strings.Contains(line, es[2].Addr()) {
			t.Errorf("warned about an engine whose events flow: %s", line)
		}
	}
	if n := strings.Count(logs.String(), warning); n != 1 {
		t.Errorf("warned %d times, want once", n)
	}
}

// TestLatencyModelsFromOutcomes checks the latency fit end to end: the
// gateways' outcome reports become the engine's TTFT model in the snapshot,
// shared by an engine of the same deployment, the engine's own inter-token
// histogram its ITL model, and the error of the gateways' predictions a
// metric.
func TestLatencyModelsFromOutcomes(t *testing.T) {
	es, err := vllmsim.StartN(t.Context(), 2, vllmsim.Config{Model: model, NumGPUBlocks: 256, TimeScale: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	e, twin := es[0], es[1]
	d := startDaemon(t, Config{Engines: e.Addr() + "," + twin.Addr(), ReportToken: "tok"})
	f := newFetcher(t, d)
	eventually(t, "readiness", func() bool { return get(t, "http://"+d.Addr()+"/readyz") != "" })
	// An engine's deployment (model and KV size) is known once its models
	// are.
	eventually(t, "both engines' models", func() bool {
		f.sync()
		a, ok1 := f.endpoint(e.Addr())
		b, ok2 := f.endpoint(twin.Addr())
		return ok1 && ok2 && a.NumModels() > 0 && b.NumModels() > 0
	})

	// The truth: 20 ms, plus prefill at 8k tokens/s of this prompt and of
	// the backlog, plus 5 ms per queued request. Every prediction is 10%
	// high.
	truth := func(f predict.Features) float64 { return 0.02 + (f.Uncached+f.Backlog)/8000 + 0.005*f.Waiting }
	var w report.Writer
	for i := range 2 * predict.MinSamples {
		ft := predict.Features{Uncached: float64(100 + i*37%4000), Backlog: float64(i * 211 % 9000), Running: float64(i % 5), Waiting: float64(i % 3)}
		rec, err := report.AppendOutcome(nil, &report.Outcome{Endpoint: e.Addr(), Features: ft, Observed: truth(ft), Predicted: 1.1 * truth(ft)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.AddEncoded(rec); err != nil {
			t.Fatal(err)
		}
	}
	postReports(t, d, &w)
	// Decoding on the engine fills its inter-token histogram, over several
	// scrapes: an interval counts once two more have passed in which no
	// prefill ended.
	for i := range 8 {
		time.Sleep(150 * time.Millisecond)
		body := `{"model":"` + model + `","max_tokens":32,"messages":[{"role":"user","content":"decode a while ` + strconv.Itoa(i) + `"}]}`
		resp, err := http.Post(e.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}

	probe := predict.Features{Uncached: 2000, Backlog: 4000, Waiting: 2}
	var mdl predict.Model
	eventually(t, "a fitted TTFT model in the snapshot", func() bool {
		f.sync()
		ep, ok := f.endpoint(e.Addr())
		if ok {
			mdl = ep.LatencyModel()
		}
		return ok && mdl.TTFTSamples >= 2*predict.MinSamples
	})
	if got, want := mdl.TTFT(probe), truth(probe); math.Abs(got-want) > 0.05*want {
		t.Errorf("fitted TTFT at %+v: %.3f s, want %.3f s", probe, got, want)
	}
	// The twin publishes the shared fit at its next scrape.
	eventually(t, "the twin engine's row to carry the shared fit", func() bool {
		f.sync()
		ep, ok := f.endpoint(twin.Addr())
		return ok && ep.LatencyModel().TTFTSamples >= 2*predict.MinSamples
	})
	eventually(t, "ITL samples from the engine's histogram", func() bool {
		f.sync()
		ep, ok := f.endpoint(e.Addr())
		return ok && ep.LatencyModel().ITLSamples > 0
	})
	metrics := get(t, "http://"+d.Addr()+"/metrics")
	if !strings.Contains(metrics, "kvroute_cachesync_ttft_prediction_median_error_ratio 0.1") {
		t.Errorf("median prediction error not 0.1:\n%s", grepLines(metrics, "ttft_prediction"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.Lines(s) {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "")
}

// TestTokenFileRotation: the token file is reloaded while cachesync runs,
// so a token is rotated without a restart: both are accepted while the
// gateways move, then only the new one.
func TestTokenFileRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("# gateways' token\nold\n")
	d := newDaemon(t, Config{Engines: "127.0.0.1:1", ReportTokenFile: path})
	d.tokenPoll = 10 * time.Millisecond
	runDaemon(t, d)
	status := func(tok string) int {
		req, _ := http.NewRequest("GET", "http://"+d.Addr()+"/v1/snapshot", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// until waits for the token file's next reload to take effect.
	until := func(tok string, want bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for (status(tok) != http.StatusUnauthorized) != want {
			if time.Now().After(deadline) {
				t.Fatalf("token %q accepted = %v after 5 s, want %v", tok, !want, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	until("old", true)
	until("new", false)
	write("old\nnew\n")
	until("new", true)
	until("old", true)
	write("new\n")
	until("old", false)
	until("new", true)
	// An unreadable file keeps the tokens last read.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	until("new", true)
}

// pollSnapshots fetches the snapshot from the daemon at base every 50 ms
// until the test ends, once for each template templates names, as
// gateways rendering with them do.
func pollSnapshots(t *testing.T, base string, templates func() []string) {
	go func() {
		for t.Context().Err() == nil {
			for _, n := range templates() {
				req, _ := http.NewRequestWithContext(t.Context(), "GET", base+"/v1/snapshot?since=0&template="+n, nil)
				req.Header.Set("Authorization", "Bearer tok")
				if resp, err := http.DefaultClient.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
}

// metricShows returns a condition for eventually: the daemon's metrics
// page holds line.
func metricShows(t *testing.T, base string) func(line string) func() bool {
	return func(line string) func() bool {
		return func() bool { return strings.Contains(get(t, base+"/metrics"), line+"\n") }
	}
}

// TestTemplateFollowsTheGateways: an engine is checked against the template
// the gateways name when they fetch; reconfiguring the gateways moves the
// engine between precise and approximate indexing, and gateways that
// disagree with each other are warned about.
func TestTemplateFollowsTheGateways(t *testing.T) {
	es, err := vllmsim.StartN(t.Context(), 1, vllmsim.Config{Model: model, TimeScale: 0.001,
		KVEvents: vllmsim.KVEventsConfig{EnableKVCacheEvents: true}})
	if err != nil {
		t.Fatal(err)
	}
	e := es[0]
	d := newDaemon(t, Config{Engines: e.Addr() + "?events=" + e.EventsEndpoint(), Tokenizer: "cl100k_base",
		ReportToken: "tok", TemplateCheck: 100 * time.Millisecond})
	logs := &syncbuf.Buffer{}
	d.log = slog.New(slog.NewTextHandler(logs, nil))
	d.gatewayWindow = 500 * time.Millisecond
	runDaemon(t, d)
	base := "http://" + d.Addr()

	// Gateways poll the snapshot naming their templates.
	var names atomic.Value
	names.Store([]string{"chatml"})
	pollSnapshots(t, base, func() []string { return names.Load().([]string) })
	metric := metricShows(t, base)
	eventually(t, "the engine to agree with chatml gateways", metric(`kvroute_cachesync_engines_by_template{state="agrees"} 1`))
	if !strings.Contains(get(t, base+"/metrics"), `kvroute_cachesync_template_agreement{engine="`+e.Addr()+`",template="chatml"} 1`+"\n") {
		t.Error("no agreement of 1 for chatml")
	}

	names.Store([]string{"llama3"})
	eventually(t, "the engine to be indexed approximately", metric(`kvroute_cachesync_engines{mode="approximate"} 1`))
	if r := get(t, base+"/readyz"); !strings.Contains(r, "engine "+e.Addr()+" is routed approximately: its chat template disagrees with the gateways' (llama3: ") {
		t.Errorf("readyz: %q", r)
	}
	if l := grepLines(logs.String(), "does not render prompts as the gateways do"); !strings.Contains(l, "engine_renders_like=chatml") {
		t.Errorf("mismatch log: %q", l)
	}

	names.Store([]string{"chatml", "llama3"})
	eventually(t, "a warning about gateways that disagree", func() bool {
		return strings.Contains(logs.String(), "gateways render prompts with different chat templates")
	})

	names.Store([]string{"chatml"})
	eventually(t, "the engine to be indexed precisely again", metric(`kvroute_cachesync_engines{mode="precise"} 1`))
	eventually(t, "its events to be followed again", func() bool {
		return strings.Count(logs.String(), "following KV events") == 2
	})
}

// TestUncheckableEngineAndAutoGateways: an engine without a chat /tokenize
// is assumed to match a fixed gateway template, but gateways on auto render
// its model plain (no checked engine names a template), which cannot match
// what it cached: it is indexed approximately while they do.
func TestUncheckableEngineAndAutoGateways(t *testing.T) {
	es, err := vllmsim.StartN(t.Context(), 1, vllmsim.Config{Model: model, TimeScale: 0.001, NoTokenize: true,
		KVEvents: vllmsim.KVEventsConfig{EnableKVCacheEvents: true}})
	if err != nil {
		t.Fatal(err)
	}
	e := es[0]
	d := newDaemon(t, Config{Engines: e.Addr() + "?events=" + e.EventsEndpoint(), Tokenizer: "cl100k_base",
		ReportToken: "tok", TemplateCheck: 100 * time.Millisecond})
	d.gatewayWindow = 500 * time.Millisecond
	runDaemon(t, d)
	base := "http://" + d.Addr()
	var name atomic.Value
	name.Store("chatml")
	pollSnapshots(t, base, func() []string { return []string{name.Load().(string)} })
	metric := metricShows(t, base)
	eventually(t, "the engine checked and found uncheckable", metric(`kvroute_cachesync_engines_by_template{state="unchecked"} 1`))
	if !metric(`kvroute_cachesync_engines{mode="precise"} 1`)() {
		t.Fatal("an uncheckable engine behind a fixed gateway template is not precise")
	}
	name.Store("auto")
	eventually(t, "the engine indexed approximately for auto gateways", metric(`kvroute_cachesync_engines{mode="approximate"} 1`))
	name.Store("chatml")
	eventually(t, "the engine precise again", metric(`kvroute_cachesync_engines{mode="precise"} 1`))
}

// TestGptOssOnVLLM: vLLM renders gpt-oss chat completions through
// harmony, not the Jinja template its /tokenize applies. An engine with
// the render endpoint shows harmony and is routed precisely for gateways
// on auto; one without it shows only the template, cannot be checked,
// and is indexed from the gateways' reports, never precisely against a
// render its chat completions do not use.
func TestGptOssOnVLLM(t *testing.T) {
	src, err := os.ReadFile("../../shared/prompt/templates/gpt-oss.jinja")
	if err != nil {
		t.Fatal(err)
	}
	cfg := vllmsim.Config{Model: "openai/gpt-oss-20b", ChatTemplate: string(src), TimeScale: 0.001,
		KVEvents: vllmsim.KVEventsConfig{EnableKVCacheEvents: true}}
	withRender, err := vllmsim.StartN(t.Context(), 1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.NoRender = true
	without, err := vllmsim.StartN(t.Context(), 1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	a, b := withRender[0], without[0]
	d := newDaemon(t, Config{Engines: a.Addr() + "?events=" + a.EventsEndpoint() + "," + b.Addr() + "?events=" + b.EventsEndpoint(),
		Tokenizer: "cl100k_base", ReportToken: "tok", TemplateCheck: 100 * time.Millisecond})
	logs := &syncbuf.Buffer{}
	d.log = slog.New(slog.NewTextHandler(logs, nil))
	d.gatewayWindow = 500 * time.Millisecond
	runDaemon(t, d)
	base := "http://" + d.Addr()
	pollSnapshots(t, base, func() []string { return []string{"auto"} })
	metric := metricShows(t, base)
	eventually(t, "the engine with a render endpoint to agree with harmony",
		metric(`kvroute_cachesync_template_agreement{engine="`+a.Addr()+`",template="harmony"} 1`))
	eventually(t, "the engine without one to be indexed approximately", metric(`kvroute_cachesync_engines{mode="approximate"} 1`))
	if !metric(`kvroute_cachesync_engines{mode="precise"} 1`)() {
		t.Error("the engine whose render endpoint shows harmony is not precise")
	}
	if l := grepLines(logs.String(), "cannot be checked"); !strings.Contains(l, b.Addr()) || !strings.Contains(l, "through harmony") {
		t.Errorf("no log of the unchecked engine's reason: %q", l)
	}
	if s := get(t, base+"/status"); !strings.Contains(s, "cannot be checked: vLLM renders gpt-oss chat completions through harmony") {
		t.Error("the status page does not say why the engine is not checked")
	}
}

// TestPeerRate: an engine not calibrated yet publishes the calibrated rate
// of its deployment's engines (same model, same cache), not the default;
// engines of another deployment, or not calibrated, lend it nothing.
func TestPeerRate(t *testing.T) {
	d := &Daemon{engines: map[string]*engine{}, models: newModels(prometheus.NewRegistry(), slog.New(slog.DiscardHandler))}
	add := func(addr, model string, kv int, rate float64, calibrated bool) *engine {
		e := &engine{d: discovery.Engine{Addr: addr}, scraped: true,
			last: scrape.State{Addr: addr, Models: []string{model}, KVCapacity: kv, Rate: calibrate.Rate{TokensPerSecond: rate, Calibrated: calibrated}}}
		d.engines[addr] = e
		d.models.add(addr)
		d.models.place(addr, e.last.Models, kv)
		return e
	}
	fresh := add("a:1", "gemma", 8192, 15928, false)
	add("b:1", "gemma", 8192, 240, true)
	add("c:1", "gemma", 8192, 250, true)
	add("d:1", "gemma", 8192, 260, true)
	add("e:1", "gemma", 65536, 20000, true) // another deployment
	add("f:1", "gemma", 8192, 15928, false) // not calibrated
	if r, ok := d.peerRate(fresh); !ok || r != 250 {
		t.Errorf("peer rate %v (%v), want the median of its deployment's calibrated engines, 250", r, ok)
	}
	if _, ok := d.peerRate(d.engines["b:1"]); ok {
		t.Error("a calibrated engine took its peers' rate")
	}
	if _, ok := d.peerRate(d.engines["e:1"]); ok {
		t.Error("an engine alone in its deployment found peers")
	}
}

func TestRestarted(t *testing.T) {
	healthy := snapshot.HealthHealthy
	prev := scrape.State{Health: healthy, PromptTokens: 1000, Prefilled: 400, Served: 10, ITLCount: 500}
	tests := []struct {
		name string
		st   scrape.State
		want bool
	}{
		{"grew", scrape.State{Health: healthy, PromptTokens: 1200, Prefilled: 450, Served: 11, ITLCount: 600}, false},
		// Cache hits counted at scheduling ran ahead of prompt tokens
		// counted at the first token: a busy engine, not a new one.
		{"prefilled shrank under load", scrape.State{Health: healthy, PromptTokens: 1100, Prefilled: 300, Served: 11, ITLCount: 600}, false},
		{"counters from zero", scrape.State{Health: healthy, PromptTokens: 50, Prefilled: 50, Served: 1, ITLCount: 10}, true},
		{"served went back", scrape.State{Health: healthy, PromptTokens: 1100, Served: 2, ITLCount: 600}, true},
		{"unhealthy, its counters kept", scrape.State{Health: snapshot.HealthUnhealthy}, false},
	}
	for _, tt := range tests {
		if got := restarted(&prev, &tt.st); got != tt.want {
			t.Errorf("%s: restarted %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestCleanITL: a scrape interval's inter-token latency counts once the two
// intervals after it prefilled little too, since an engine counts a
// prompt's tokens when its prefill ends, after the steps that ran it.
func TestCleanITL(t *testing.T) {
	rate := calibrate.Rate{TokensPerSecond: 20000}
	at := time.Unix(1000, 0)
	// Each interval: 250 ms, the tokens prefilled in it and the mean ITL
	// of the decodes in it (0: none decoded).
	type interval struct {
		prefilled float64
		itl       float64
	}
	tests := []struct {
		name string
		ivs  []interval
		want []float64 // the ITLs fitted, in order
	}{
		{"decodes alone", []interval{{0, 0.020}, {0, 0.021}, {0, 0.022}, {0, 0.023}}, []float64{0.020, 0.021}},
		{"a prefill ending takes back the two intervals before it", []interval{{0, 0.020}, {0, 0.080}, {0, 0.090}, {7000, 0.030}, {0, 0.021}, {0, 0.022}, {0, 0.023}}, []float64{0.020, 0.021}},
		{"idle intervals count as clean", []interval{{0, 0.020}, {0, 0}, {0, 0}}, []float64{0.020}},
		{"a little prefill is still decoding", []interval{{100, 0.020}, {100, 0.021}, {100, 0.022}}, []float64{0.020}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var e engine
			prev := scrape.State{Scraped: at, Rate: rate}
			var got []float64
			for i, iv := range tt.ivs {
				st := prev
				st.Scraped = at.Add(time.Duration(i+1) * 250 * time.Millisecond)
				st.Prefilled += iv.prefilled
				if iv.itl > 0 {
					st.ITLCount += 100
					st.ITLSeconds += 100 * iv.itl
				}
				e.cleanITL(&prev, &st, func(s itlSample) { got = append(got, s.seconds) })
				prev = st
			}
			if len(got) != len(tt.want) {
				t.Fatalf("fitted %v, want %v", got, tt.want)
			}
			for i := range got {
				if math.Abs(got[i]-tt.want[i]) > 1e-9 {
					t.Fatalf("fitted %v, want %v", got, tt.want)
				}
			}
		})
	}
}

// metricValue returns the value of the series named exactly so in a
// Prometheus text exposition.
func metricValue(text, series string) (float64, bool) {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

// TestMovesGroups: with three groups' decoding reported on one engine and
// one on the other, the planner pins one of the first engine's groups to
// the second, and the pin reaches the snapshot.
func TestMovesGroups(t *testing.T) {
	es, d, f := startMoving(t, 0.001)
	postUnevenGroups(t, d, es)
	eventually(t, "a group of the busy engine pinned to the other", func() bool { return movedTo(f, es[1].Addr()) })
	if got, ok := metricValue(get(t, "http://"+d.Addr()+"/metrics"), "kvroute_cachesync_group_moves_total"); !ok || got != 1 {
		t.Errorf("group moves %v (found %v), want 1", got, ok)
	}
}

// TestMoveWaitsForRoom: a move waits while its target's KV cache is
// nearly full, as its engine's metrics say, and is made once the cache
// frees.
func TestMoveWaitsForRoom(t *testing.T) {
	// Real time, so that the request filling the target's cache runs
	// until it is cancelled.
	es, d, f := startMoving(t, 1)
	// 3,400 prompt tokens and 600 to answer: 213 or more of 256 blocks.
	ctx, cancel := context.WithCancel(t.Context())
	body := `{"model":"` + model + `","prompt":"` + strings.Repeat(" hello", 3400) + `","max_tokens":600,"stream":true}`
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+es[1].Addr()+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	usage := func() float64 {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.engines[es[1].Addr()].last.KVCacheUsage
	}
	eventually(t, "the target's cache scraped over 80% full", func() bool { return usage() > 0.8 })
	postUnevenGroups(t, d, es)
	// The planner's first move may come 0.6 s after the first demand
	// (twice the cooldown); give it three times that.
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if u := usage(); u <= 0.8 {
			t.Fatalf("the target's cache read %.2f full before the wait was tested", u)
		}
		if movedTo(f, es[1].Addr()) {
			t.Fatalf("a group moved to an engine whose cache is %.0f%% full", 100*usage())
		}
	}
	cancel()
	eventually(t, "a group moved once the target's cache freed", func() bool { return movedTo(f, es[1].Addr()) })
}

// startMoving starts two engines of 256 blocks at timeScale and a ready
// cachesync moving groups between them, 300 ms between moves.
func startMoving(t *testing.T, timeScale float64) ([]*vllmsim.Engine, *Daemon, *fetcher) {
	t.Helper()
	es, err := vllmsim.StartN(t.Context(), 2, vllmsim.Config{Model: model, NumGPUBlocks: 256, TimeScale: timeScale})
	if err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, Config{Engines: es[0].Addr() + "," + es[1].Addr(), ReportToken: "tok", MoveGroups: true,
		MoveCooldown: 300 * time.Millisecond})
	eventually(t, "readiness", func() bool { return get(t, "http://"+d.Addr()+"/readyz") != "" })
	return es, d, newFetcher(t, d)
}

// postUnevenGroups reports three groups' requests at es[0] and one's at
// es[1], each group's first blocks keyed g<<8|2.
func postUnevenGroups(t *testing.T, d *Daemon, es []*vllmsim.Engine) {
	t.Helper()
	var w report.Writer
	group := func(g uint64) []uint64 { return []uint64{g<<8 | 1, g<<8 | 2} }
	for g, to := range []int{0, 0, 0, 1} {
		// Past planner.Config.MinRequests, decayed, and enough for four
		// groups' rates, each read from a random half, to be sure of.
		for range 40 {
			if err := w.Add(&report.Record{Endpoint: es[to].Addr(), Model: model, Hashes: group(uint64(g)), Output: 300}); err != nil {
				t.Fatal(err)
			}
		}
	}
	postReports(t, d, &w)
}

// movedTo reports whether the snapshot f follows pins one of
// postUnevenGroups' groups of es[0] to addr.
func movedTo(f *fetcher, addr string) bool {
	f.sync()
	m := f.view.Manifest()
	if m == nil {
		return false
	}
	for g := range uint64(3) {
		if slot, ok := m.Pinned(g<<8 | 2); ok && m.Endpoint(slot).Addr() == addr {
			return true
		}
	}
	return false
}

// postReports sends w's batch to d with the token "tok" and requires it
// accepted.
func postReports(t *testing.T, d *Daemon, w *report.Writer) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+d.Addr()+"/v1/reports", bytes.NewReader(w.Bytes()))
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("report: %s", resp.Status)
	}
}

// TestLearnsBytesPerToken: an approximate engine's index is sized by the
// bytes per token learned from the gateways' reports against the engine's
// own prompt-token counter, once there is enough of both; until then, and
// without -learn-bytes-per-token, by the configured ratio.
func TestLearnsBytesPerToken(t *testing.T) {
	for _, learn := range []bool{true, false} {
		t.Run(strconv.FormatBool(learn), func(t *testing.T) {
			es, err := vllmsim.StartN(t.Context(), 1, vllmsim.Config{Model: model, NumGPUBlocks: 512, TimeScale: 0.001})
			if err != nil {
				t.Fatal(err)
			}
			addr := es[0].Addr()
			d := startDaemon(t, Config{Engines: addr, ReportToken: "tok", LearnBytesPerToken: learn})
			capacity := func() (int, int) {
				d.mu.Lock()
				defer d.mu.Unlock()
				if e := d.engines[addr]; e != nil {
					return e.capacity, e.last.KVCapacity
				}
				return 0, 0
			}
			// Reports count from the engine's first healthy scrape on.
			eventually(t, "the engine scraped healthy", func() bool {
				d.mu.Lock()
				defer d.mu.Unlock()
				e := d.engines[addr]
				return e != nil && e.capacity > 0 && e.last.Health == snapshot.HealthHealthy && len(e.last.Models) > 0
			})
			_, kv := capacity()
			configured := approx.Sizing{BytesPerToken: 4}.Blocks(int64(kv))
			if c, _ := capacity(); c != configured {
				t.Fatalf("capacity before any traffic: %d blocks, want the configured ratio's %d", c, configured)
			}
			// Prompts of token ids, reported as 6 bytes a token: the
			// engine counts exactly the tokens sent.
			const tokens, ratio = 4000, 6
			ids := make([]string, tokens)
			for i := range ids {
				ids[i] = strconv.Itoa(1000 + i%5000)
			}
			body := `{"model":"` + model + `","prompt":[` + strings.Join(ids, ",") + `],"max_tokens":1}`
			var w report.Writer
			if err := w.Add(&report.Record{Endpoint: addr, Model: model, Hashes: []uint64{1}, Bytes: ratio * tokens}); err != nil {
				t.Fatal(err)
			}
			for i := range tokenbytes.DefaultMinTokens/tokens + 1 {
				postReports(t, d, &w)
				// The engine's counter is scraped when it changes, the
				// report applied on the index's next build: a prompt
				// reported before it runs keeps the two in step.
				eventually(t, "the report applied", func() bool {
					n, _ := metricValue(get(t, "http://"+d.Addr()+"/metrics"), `kvroute_cachesync_report_records_total{outcome="applied"}`)
					return n == float64(i+1)
				})
				resp, err := http.Post(es[0].URL()+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("completion: %s", resp.Status)
				}
			}
			want, wantRatio, source := approx.Sizing{BytesPerToken: ratio}.Blocks(int64(kv)), float64(ratio), "learned"
			if !learn {
				want, wantRatio, source = configured, 4, "configured"
			}
			eventually(t, "the index sized by the ratio", func() bool {
				got, ok := metricValue(get(t, "http://"+d.Addr()+"/metrics"), `kvroute_cachesync_bytes_per_token{model="`+model+`",source="`+source+`"}`)
				c, _ := capacity()
				return ok && c == want && math.Abs(got-wantRatio) < 0.01
			})
		})
	}
}
