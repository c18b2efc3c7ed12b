package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/cachesync/daemon"
	"github.com/kvroute/kvroute/e2e/envoy"
	"github.com/kvroute/kvroute/e2e/vllmsim"
	"github.com/kvroute/kvroute/shared/blockhash"
)

// These tests run the whole loop: simulated vLLM engines publishing KV
// events, cachesync, and real Envoy with the shipped envoy.yaml.

const (
	simModel    = "Qwen/Qwen2.5-7B-Instruct" // served with the ChatML template, as envoy.yaml renders
	reportToken = "e2e-report-token"
)

// runningDaemon is an in-process cachesync.
type runningDaemon struct {
	addr string
	stop func()
}

// get returns the body of one of the daemon's pages.
func (d *runningDaemon) get(t testing.TB, path string) string {
	t.Helper()
	resp, err := http.Get("http://" + d.addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// routedByReports sends a conversation through gateway g1 and waits for g2,
// which never saw it, to route its next turn to the same engine: only g1's
// report to cachesync can tell it.
func routedByReports(t testing.TB, g1, g2 *gateway, system string) {
	t.Helper()
	code, d := post(t, g1.client, g1.url, simChat(system, "turn 1", 1))
	if code != http.StatusOK {
		t.Fatalf("through gateway 1: %d", code)
	}
	home := d[len("endpoint="):strings.Index(d, ";")]
	waitFor(t, 10*time.Second, "gateway 2 to route by gateway 1's report", func() bool {
		return affineTo(probe(t, g2, system, "turn 2"), home)
	})
}

func startCachesync(t testing.TB, addr string, engines []*vllmsim.Engine, precise bool, opts ...func(*daemon.Config)) *runningDaemon {
	t.Helper()
	var spec []string
	for _, e := range engines {
		s := e.Addr()
		if precise {
			s += "?events=" + e.EventsEndpoint() + "&replay=" + e.ReplayEndpoint()
		}
		spec = append(spec, s)
	}
	return startDaemon(t, addr, spec, precise, opts...)
}

// startDaemon runs cachesync in this process on addr, for the engines of
// spec (-engines), with the tokenizer the simulator counts with if
// precise.
func startDaemon(t testing.TB, addr string, spec []string, precise bool, opts ...func(*daemon.Config)) *runningDaemon {
	t.Helper()
	cfg := daemon.Config{
		Listen: addr, Engines: strings.Join(spec, ","), ReportToken: reportToken,
		Hash:         blockhash.Config{BlockSize: blockhash.DefaultBlockSize, MaxBlocks: blockhash.DefaultMaxBlocks},
		SyncInterval: 100 * time.Millisecond, ScrapeInterval: 200 * time.Millisecond, ScrapeMisses: 3,
		BytesPerToken: 4, LogFormat: "text", TemplateCheck: 300 * time.Millisecond,
	}
	if precise {
		cfg.Tokenizer = "cl100k_base"
	}
	for _, o := range opts {
		o(&cfg)
	}
	d, err := daemon.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("cachesync: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return &runningDaemon{addr: d.Addr(), stop: stop}
}

func startEngines(t testing.TB, n int, cfg vllmsim.Config) []*vllmsim.Engine {
	t.Helper()
	cfg.Model = simModel
	cfg.KVEvents = vllmsim.KVEventsConfig{EnableKVCacheEvents: true}
	es, err := vllmsim.StartN(context.Background(), n, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, e := range es {
			e.Close()
		}
	})
	return es
}

// cachesyncGateway runs the shipped envoy.yaml in front of the engines,
// pointed at cachesync, with the debug header on; settings are more plugin configuration keys and values, in pairs.
func cachesyncGateway(t testing.TB, engines []*vllmsim.Engine, cachesync string, policy map[string]any, settings ...any) *gateway {
	t.Helper()
	var addrs []string
	for _, e := range engines {
		addrs = append(addrs, e.Addr())
	}
	return cachesyncGatewayFor(t, addrs, cachesync, policy, settings...)
}

// cachesyncGatewayFor is cachesyncGateway for engines at addrs.
func cachesyncGatewayFor(t testing.TB, addrs []string, cachesync string, policy map[string]any, settings ...any) *gateway {
	t.Helper()
	return startGateway(t, cachesyncConfig(t, addrs, cachesync, policy, settings...), 2)
}

// cachesyncConfig is the configuration cachesyncGatewayFor runs.
func cachesyncConfig(t testing.TB, addrs []string, cachesync string, policy map[string]any, settings ...any) *envoy.Config {
	t.Helper()
	cfg := gatewayConfig(t, addrs, nil)
	must(t, cfg.SetEndpoints("cachesync", []string{cachesync}))
	pc, err := cfg.PluginConfiguration(pluginName)
	if err != nil {
		t.Fatal(err)
	}
	pc["cachesync"] = map[string]any{"cluster": "cachesync", "report_token": reportToken}
	pc["debug_header"] = true
	if policy != nil {
		pc["policy"] = policy
	}
	for i := 0; i+1 < len(settings); i += 2 {
		pc[settings[i].(string)] = settings[i+1]
	}
	must(t, cfg.SetPluginConfiguration(pluginName, pc))
	return cfg
}

// reportsAccepted fails the test unless the gateway's report batches all
// reached cachesync: at least one sent and none counted as an error. A
// batch refused, lost or mistaken for a refusal shows as an error.
func reportsAccepted(t testing.TB, g *gateway) {
	t.Helper()
	stats, err := g.envoy.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sent, errs := stats["wasmcustom.kvroute.reports.sent"], stats["wasmcustom.kvroute.reports.errors"]
	if sent == 0 || errs != 0 {
		t.Errorf("kvroute.reports.sent %d, kvroute.reports.errors %d: want batches sent and no errors", sent, errs)
	}
}

func simChat(system, user string, maxTokens int) []byte {
	b, _ := json.Marshal(map[string]any{
		"model": simModel, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}},
	})
	return b
}

// post sends a chat request and returns the status and kvroute's decision.
// It may only be called from the test's goroutine; others use tryPost.
func post(t testing.TB, client *http.Client, url string, body []byte) (int, string) {
	t.Helper()
	code, d, err := tryPost(client, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return code, d
}

// tryPost is post for any goroutine.
func tryPost(client *http.Client, url string, body []byte) (int, string, error) {
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, "", fmt.Errorf("POST %s: %w", url, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("x-kvroute-decision"), nil
}

// probe asks the gateway where a prompt would go without letting any engine
// cache it: max_tokens -1 is rejected by the engine before it computes
// anything, but the filter routes (and explains) the request all the same.
func probe(t testing.TB, g *gateway, system, user string) string {
	t.Helper()
	code, d := post(t, g.client, g.url, simChat(system, user, -1))
	if code != http.StatusBadRequest || d == "" {
		t.Fatalf("probe: status %d, decision %q", code, d)
	}
	return d
}

func affineTo(decision, addr string) bool {
	return strings.Contains(decision, "endpoint="+addr+";") && strings.Contains(decision, "reason=affinity")
}

func waitFor(t testing.TB, within time.Duration, what string, f func() bool) time.Duration {
	t.Helper()
	took, ok := poll(within, f)
	if !ok {
		t.Fatalf("timed out after %v waiting for %s", within, what)
	}
	return took
}

// poll calls f until it reports true or within has passed, and returns how
// long that took and whether f came true: for a test whose failure must
// say more than that it timed out.
func poll(within time.Duration, f func() bool) (time.Duration, bool) {
	start := time.Now()
	for !f() {
		if time.Since(start) > within {
			return time.Since(start), false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start), true
}

func TestCachesyncEventsDriveRouting(t *testing.T) {
	es := startEngines(t, 3, vllmsim.Config{NumGPUBlocks: 384, TimeScale: 0.05})
	cs := startCachesync(t, "127.0.0.1:0", es, true)
	g := cachesyncGateway(t, es, cs.addr, nil)

	// Each engine is warmed directly, not through Envoy: only its KV events
	// can tell kvroute. The delay runs from the engine's answer to the first
	// request routed to it by affinity.
	var delays []time.Duration
	for i := range 18 {
		warm := es[i%len(es)]
		system := "Tenant " + strconv.Itoa(i) + " policies. " + strings.Repeat("Refunds need a receipt and a reason. ", 40)
		if code, _ := post(t, http.DefaultClient, warm.URL(), simChat(system, "first", 1)); code != http.StatusOK {
			t.Fatalf("warming %s: %d", warm.Addr(), code)
		}
		delays = append(delays, waitFor(t, 10*time.Second, "affinity to the warmed engine", func() bool {
			return affineTo(probe(t, g, system, "next question"), warm.Addr())
		}))
		if i == 0 {
			// Eviction: fill the engine's cache with other prompts; routing
			// must stop preferring it for the evicted prefix.
			for j := range 8 {
				post(t, http.DefaultClient, warm.URL(), simChat(strings.Repeat("filler "+strconv.Itoa(j)+" ", 500), "x", 1))
			}
			waitFor(t, 10*time.Second, "the evicted prefix to stop attracting requests", func() bool {
				d := probe(t, g, system, "next question")
				return !strings.Contains(d, "reason=affinity")
			})
		}
	}
	slices.Sort(delays)
	p50, p99 := delays[len(delays)/2], delays[len(delays)-1]
	t.Logf("event-to-routing delay over %d prompts: p50 %v, p99 (max) %v", len(delays), p50.Round(time.Millisecond), p99.Round(time.Millisecond))
	reportsAccepted(t, g)
}

func TestCachesyncHotPrefixSpillsAndReturns(t *testing.T) {
	// Slow engines (real-time cost model at half speed) so that requests
	// stay in flight long enough to load the warm one.
	es := startEngines(t, 3, vllmsim.Config{NumGPUBlocks: 4096, TimeScale: 0.5})
	cs := startCachesync(t, "127.0.0.1:0", es, true)
	g := cachesyncGateway(t, es, cs.addr, nil)
	hot := es[0]
	system := strings.Repeat("The shared 3k-token system prompt of a coding agent. ", 220)
	post(t, http.DefaultClient, hot.URL(), simChat(system, "warm", 1))
	waitFor(t, 10*time.Second, "affinity to the warm engine", func() bool {
		return affineTo(probe(t, g, system, "q"), hot.Addr())
	})

	// A burst of requests sharing the prefix, each with a long question of
	// its own: the warm engine's queue of uncached tokens and its batch grow
	// until a cold engine's full prefill is priced lower, and the gateway
	// releases affinity.
	var mu sync.Mutex
	reasons := map[string]int{}
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q := strings.Repeat("question "+strconv.Itoa(i)+" about the build ", 40)
			code, d, err := tryPost(g.client, g.url, simChat(system, q, 64))
			mu.Lock()
			defer mu.Unlock()
			if err != nil || code != http.StatusOK {
				t.Errorf("burst request %d: status %d, %v", i, code, err)
			}
			for _, r := range []string{"affinity", "saturated-release", "least-load", "fallback"} {
				if strings.Contains(d, "reason="+r+";") {
					reasons[r]++
				}
			}
		}()
		time.Sleep(2 * time.Millisecond)
	}
	wg.Wait()
	t.Logf("burst decisions: %v", reasons)
	if reasons["affinity"] == 0 || reasons["saturated-release"] == 0 {
		t.Errorf("burst decisions %v: want affinity first, then releases once the warm engine saturated", reasons)
	}
	// Load gone: the prefix is routed by affinity again.
	waitFor(t, 10*time.Second, "affinity after the burst", func() bool {
		return strings.Contains(probe(t, g, system, "after"), "reason=affinity")
	})
	reportsAccepted(t, g)
}

func TestCachesyncApproximateModeSharedByGateways(t *testing.T) {
	es := startEngines(t, 3, vllmsim.Config{NumGPUBlocks: 1024, TimeScale: 0.05})
	cs := startCachesync(t, "127.0.0.1:0", es, false)
	g1 := cachesyncGateway(t, es, cs.addr, nil)
	g2 := cachesyncGateway(t, es, cs.addr, nil)
	for i := range 4 {
		system := "Conversation " + strconv.Itoa(i) + ". " + strings.Repeat("We were discussing the quarterly plan. ", 30)
		routedByReports(t, g1, g2, system)
	}
	time.Sleep(300 * time.Millisecond) // the probes' last batches
	reportsAccepted(t, g1)
	reportsAccepted(t, g2)
}

// TestCachesyncTemplateMismatch: engines serving another chat template than
// the gateways render with are found out, indexed from the gateways'
// reports so that requests keep their affinity, and indexed from their KV
// events again once redeployed with the template the gateways render.
func TestCachesyncTemplateMismatch(t *testing.T) {
	// The gateways are configured to render ChatML (Qwen's template); the
	// engines were started with Llama 3's.
	es := startEngines(t, 2, vllmsim.Config{NumGPUBlocks: 1024, TimeScale: 0.05, ChatTemplate: "llama3"})
	cs := startCachesync(t, "127.0.0.1:0", es, true)
	g1 := cachesyncGateway(t, es, cs.addr, nil, "chat_template", "chatml")
	g2 := cachesyncGateway(t, es, cs.addr, nil, "chat_template", "chatml")
	get := func(path string) string { return cs.get(t, path) }
	note := func(e *vllmsim.Engine) string { return "engine " + e.Addr() + " is routed approximately" }
	waitFor(t, 15*time.Second, "cachesync to find both engines' templates disagreeing", func() bool {
		r := get("/readyz")
		return strings.Contains(r, note(es[0])) && strings.Contains(r, note(es[1]))
	})
	metrics := get("/metrics")
	for _, want := range []string{
		`kvroute_cachesync_engines_by_template{state="disagrees"} 2`,
		`kvroute_cachesync_engines{mode="approximate"} 2`,
		`kvroute_cachesync_template_agreement{engine="` + es[0].Addr() + `",template="chatml"} 0`,
	} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	routedByReports(t, g1, g2, "Account review. "+strings.Repeat("The customer asked about invoices twice. ", 30))

	// Redeployed with the model's own template (ChatML), engine 0 agrees,
	// and its KV events drive routing again: it is warmed directly, so
	// only its events can tell the gateways.
	if err := es[0].Redeploy(""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "engine 0 to be indexed precisely again", func() bool {
		r := get("/readyz")
		return !strings.Contains(r, note(es[0])) && strings.Contains(r, note(es[1]))
	})
	warm := "Fresh tenant. " + strings.Repeat("Shipping takes three days. ", 40)
	if code, _ := post(t, http.DefaultClient, es[0].URL(), simChat(warm, "first", 1)); code != http.StatusOK {
		t.Fatalf("warming engine 0: %d", code)
	}
	waitFor(t, 10*time.Second, "affinity to engine 0 from its KV events", func() bool {
		return affineTo(probe(t, g2, warm, "next question"), es[0].Addr())
	})
	if m := get("/metrics"); !strings.Contains(m, `kvroute_cachesync_engines_by_template{state="agrees"} 1`+"\n") {
		t.Errorf("/metrics does not count engine 0 as agreeing")
	}
}

// TestCachesyncAutoTemplatePool: one gateway configuration, chat_template
// auto, in front of a pool serving three models with different templates
// (Qwen with ChatML, Llama 3.1 with its own, gpt-oss through harmony, as
// vLLM renders it whatever its Jinja template): cachesync finds which
// template each engine renders with (gpt-oss's through vLLM's render
// endpoint), the gateway renders each model's requests with its template,
// and every model is routed by its engines' KV events.
func TestCachesyncAutoTemplatePool(t *testing.T) {
	gptOss, err := os.ReadFile("../shared/prompt/templates/gpt-oss.jinja")
	if err != nil {
		t.Fatal(err)
	}
	es := startEngines(t, 2, vllmsim.Config{NumGPUBlocks: 1024, TimeScale: 0.05})
	all := slices.Clone(es)
	for _, cfg := range []vllmsim.Config{
		{Model: "meta-llama/Llama-3.1-8B-Instruct"},
		{Model: "openai/gpt-oss-20b", ChatTemplate: string(gptOss)},
	} {
		cfg.NumGPUBlocks, cfg.TimeScale, cfg.KVEvents = 1024, 0.05, vllmsim.KVEventsConfig{EnableKVCacheEvents: true}
		started, err := vllmsim.StartN(context.Background(), 2, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for _, e := range started {
				e.Close()
			}
		})
		all = append(all, started...)
	}
	cs := startCachesync(t, "127.0.0.1:0", all, true)
	g := cachesyncGateway(t, all, cs.addr, nil, "chat_template", "auto")
	waitFor(t, 15*time.Second, "cachesync to find every engine's template", func() bool {
		return strings.Contains(cs.get(t, "/metrics"), `kvroute_cachesync_engines_by_template{state="agrees"} 6`+"\n")
	})
	chat := func(model, system, user string, maxTokens int) []byte {
		b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": maxTokens,
			"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}}})
		return b
	}
	// Each engine is warmed directly: only its KV events can tell the
	// gateway, and they match only a render with the engine's template.
	for i, e := range all {
		model := e.Config().Model
		system := "Tenant " + strconv.Itoa(i) + " of " + model + ". " + strings.Repeat("Orders ship within two days. ", 40)
		if code, _ := post(t, http.DefaultClient, e.URL(), chat(model, system, "first", 1)); code != http.StatusOK {
			t.Fatalf("warming %s: %d", e.Addr(), code)
		}
		waitFor(t, 10*time.Second, "affinity to the warmed "+model+" engine", func() bool {
			code, d := post(t, g.client, g.url, chat(model, system, "next", -1))
			return code == http.StatusBadRequest && affineTo(d, e.Addr()) &&
				(!strings.HasPrefix(model, "openai/gpt-oss") || strings.Contains(d, "template=harmony"))
		})
	}
	if !strings.Contains(cs.get(t, "/metrics"), `template="harmony"} 1`) {
		t.Error("no engine found to render harmony")
	}
}

// TestCachesyncShipsTheModelsTemplates: two models, each served with a
// chat template kvroute has no name for, behind a gateway on chat_template
// auto. cachesync holds both templates (each model's tokenizer_config.json),
// finds which one each engine renders with, and ships each model's in the
// snapshot; the gateway renders each model's requests with its own, so
// they match the engines' KV events.
func TestCachesyncShipsTheModelsTemplates(t *testing.T) {
	models := []struct{ name, src string }{
		{"acme/support-chat-7b", `{%- for m in messages %}[[{{ m.role | upper }}]] {{ m.content if m.content is string else '' }}
{% endfor %}{% if add_generation_prompt %}[[ASSISTANT]] {% endif %}`},
		{"acme/sales-chat-7b", `{%- for m in messages %}<{{ m.role }}>{{ m.content if m.content is string else '' }}</{{ m.role }}>
{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}`},
	}
	var es []*vllmsim.Engine
	var files []string
	for _, m := range models {
		dir := t.TempDir()
		cfgJSON, _ := json.Marshal(map[string]any{"chat_template": m.src, "eos_token": "</s>"})
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfgJSON, 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.Join(dir, "tokenizer_config.json"))
		started, err := vllmsim.StartN(context.Background(), 2, vllmsim.Config{Model: m.name, ChatTemplate: m.src, NumGPUBlocks: 1024,
			TimeScale: 0.05, KVEvents: vllmsim.KVEventsConfig{EnableKVCacheEvents: true}})
		if err != nil {
			t.Fatal(err)
		}
		es = append(es, started...)
	}
	t.Cleanup(func() {
		for _, e := range es {
			e.Close()
		}
	})
	cs := startCachesync(t, "127.0.0.1:0", es, true, func(c *daemon.Config) {
		c.ChatTemplateFile = strings.Join(files, ",")
	})
	g := cachesyncGateway(t, es, cs.addr, nil, "chat_template", "auto")
	waitFor(t, 15*time.Second, "cachesync to find every engine rendering its model's template", func() bool {
		return strings.Contains(cs.get(t, "/metrics"), `kvroute_cachesync_engines_by_template{state="agrees"} 4`+"\n")
	})
	chat := func(model, system, user string, maxTokens int) []byte {
		b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": maxTokens,
			"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}}})
		return b
	}
	for i, e := range es {
		model := models[i/2].name
		system := "Tenant " + strconv.Itoa(i) + ". " + strings.Repeat("Refunds take five working days. ", 40)
		if code, _ := post(t, http.DefaultClient, e.URL(), chat(model, system, "first", 1)); code != http.StatusOK {
			t.Fatalf("warming %s: %d", e.Addr(), code)
		}
		waitFor(t, 10*time.Second, "affinity to the warmed "+model+" engine from its KV events", func() bool {
			code, d := post(t, g.client, g.url, chat(model, system, "next", -1))
			return code == http.StatusBadRequest && affineTo(d, e.Addr()) && strings.Contains(d, "template=custom")
		})
	}
}

func TestCachesyncOutagesNeverFailRequests(t *testing.T) {
	es := startEngines(t, 3, vllmsim.Config{NumGPUBlocks: 1024, TimeScale: 0.02})
	cs := startCachesync(t, "127.0.0.1:0", es, true)
	g := cachesyncGateway(t, es, cs.addr, nil)
	system := strings.Repeat("Always answer in French. ", 60)
	post(t, g.client, g.url, simChat(system, "bonjour", 1))
	waitFor(t, 10*time.Second, "a snapshot-driven decision", func() bool {
		return strings.Contains(probe(t, g, system, "q"), "reason=affinity")
	})

	stop := make(chan struct{})
	var sent, failed int
	var mu sync.Mutex
	var wg sync.WaitGroup
	var stopOnce sync.Once
	halt := func() {
		stopOnce.Do(func() { close(stop) })
		wg.Wait()
	}
	t.Cleanup(halt) // the clients stop even if the test fails first
	for c := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				code, _, err := tryPost(g.client, g.url, simChat(system, "client "+strconv.Itoa(c)+" request "+strconv.Itoa(i), 2))
				mu.Lock()
				sent++
				if err != nil || code != http.StatusOK {
					failed++
				}
				mu.Unlock()
			}
		}()
	}
	time.Sleep(time.Second)
	cs.stop() // cachesync dies
	time.Sleep(2 * time.Second)
	restarted := startCachesync(t, cs.addr, es, true) // and comes back on its address
	time.Sleep(2 * time.Second)
	halt()
	if failed > 0 || sent < 20 {
		t.Errorf("%d of %d requests failed while cachesync died and restarted", failed, sent)
	}
	t.Logf("%d requests through a cachesync outage and restart, %d failed", sent, failed)
	waitFor(t, 10*time.Second, "routing by the restarted cachesync's snapshots", func() bool {
		return strings.Contains(probe(t, g, system, "q"), "reason=affinity")
	})
	_ = restarted
	stats, err := g.envoy.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if stats["wasmcustom.kvroute.sync.errors"] == 0 {
		t.Error("the outage left no trace in kvroute.sync.errors")
	}
}

// TestStepClock: while requests stream through the gateway, the gateway
// times the engine's steps by their tokens, and each decision's wait for
// the step under way (step_wait_us) is where that step is: it varies from
// probe to probe within a step's length. Without the clock it is half a
// predicted step, the same for every probe of an unchanging batch. Each
// Envoy worker knows only its own streams, so the streams go over
// connections of their own, which Envoy spreads over both workers.
func TestStepClock(t *testing.T) {
	es := startEngines(t, 1, vllmsim.Config{NumGPUBlocks: 1024, TimeScale: 1})
	cs := startCachesync(t, "127.0.0.1:0", es, true)
	g := cachesyncGateway(t, es, cs.addr, nil)
	system := strings.Repeat("Answer briefly and cite the policy section. ", 20)
	waitFor(t, 10*time.Second, "a snapshot-driven decision", func() bool {
		return strings.Contains(probe(t, g, system, "warm"), "reason=")
	})

	stream, _ := json.Marshal(map[string]any{"model": simModel, "max_tokens": 300, "stream": true,
		"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": "a long answer"}}})
	const streams = 12 // every worker gets some: all 12 on one has odds of 1 in 2,000
	done := make(chan error, streams)
	started := make(chan struct{}, streams)
	for range streams {
		go func() {
			client := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
			resp, err := client.Post(g.url+"/v1/chat/completions", "application/json", bytes.NewReader(stream))
			if err == nil {
				// Its first token is out: the clock starts.
				first := make([]byte, 1)
				if _, err = io.ReadFull(resp.Body, first); err == nil {
					started <- struct{}{}
					_, err = io.Copy(io.Discard, resp.Body)
				}
				resp.Body.Close()
			}
			done <- err
		}()
	}
	t.Cleanup(func() {
		for range streams {
			<-done
		}
	})
	// Probed only once every stream is answering: a fixed half second was
	// too short once under the race detector (2026-12-07), and every probe
	// read the same wait, as without a clock.
	for i := range streams {
		select {
		case <-started:
		case <-time.After(20 * time.Second):
			t.Fatalf("%d of %d streams answered within 20 s", i, streams)
		}
	}
	time.Sleep(50 * time.Millisecond) // a few steps' tokens
	waits := map[int64]bool{}
	var most int64
	for probes, tries := 0, 0; probes < 40; tries++ {
		if tries == 400 {
			t.Fatalf("%d of %d probes routed by a snapshot", probes, tries)
		}
		d := probe(t, g, system, "how long is the wait?")
		_, rest, ok := strings.Cut(d, "; step_wait_us=")
		if !ok && strings.Contains(d, "reason=rendezvous") {
			// The other Envoy worker has no snapshot yet (the warm-up's
			// probe reached one worker): it routes without a price.
			time.Sleep(13 * time.Millisecond)
			continue
		}
		if !ok {
			t.Fatalf("no step_wait_us in %q", d)
		}
		probes++
		us, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ';')], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		waits[us] = true
		most = max(most, us)
		time.Sleep(13 * time.Millisecond)
	}
	if len(waits) < 5 {
		t.Errorf("step waits %v: the same few values, as without a clock", waits)
	}
	if most > 500_000 {
		t.Errorf("a step wait of %d µs, longer than any step here", most)
	}
	t.Logf("%d distinct step waits, up to %d µs", len(waits), most)
}

// oneEngineGateway runs one engine behind cachesync and the gateway, and
// returns once the gateway routes by cachesync's snapshot, with the system
// prompt its probes used.
func oneEngineGateway(t *testing.T, cfg vllmsim.Config) (*runningDaemon, *gateway, string) {
	t.Helper()
	es := startEngines(t, 1, cfg)
	cs := startCachesync(t, "127.0.0.1:0", es, true)
	g := cachesyncGateway(t, es, cs.addr, nil)
	system := strings.Repeat("Answer briefly and cite the policy section. ", 20)
	waitFor(t, 10*time.Second, "a snapshot-driven decision", func() bool {
		return !strings.Contains(probe(t, g, system, "warm"), "reason=rendezvous")
	})
	return cs, g, system
}

// TestNonStreamedPrefillReleased: a non-streamed request's uncached prompt
// counts as load on its endpoint until its prefill is predicted to end, not
// until its answer ends. Its first response byte comes with its last token:
// held until then, a long answer's prompt stood in every later decision's
// backlog for the whole of its decoding.
func TestNonStreamedPrefillReleased(t *testing.T) {
	_, g, system := oneEngineGateway(t, vllmsim.Config{NumGPUBlocks: 2048, TimeScale: 1})
	backlog := func() int {
		n, err := strconv.Atoi(field(probe(t, g, system, "backlog?"), "backlog_tokens"))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	idle := backlog()

	// A prompt of about 2,000 new tokens, and an answer of 400 that takes
	// the simulator four seconds or more to decode.
	long := strings.Repeat("Every clause of this contract is new to the engine. ", 160)
	done := make(chan string, 1)
	go func() {
		_, d, err := tryPost(g.client, g.url, simChat(long, "summarise", 400))
		if err != nil {
			d = "error: " + err.Error()
		}
		done <- d
	}()
	most := 0
	var d string
	deadline := time.After(3 * time.Second)
	for released := false; !released; {
		select {
		case d = <-done:
			t.Fatalf("the answer ended before its prefill was released: %s (backlog at most %d)", d, most)
		case <-deadline:
			t.Fatalf("3 s on, the backlog still counts the prompt (at most %d tokens, %d idle)", most, idle)
		case <-time.After(50 * time.Millisecond):
			n := backlog()
			most = max(most, n)
			released = most > idle+1000 && n < idle+100
		}
	}
	select {
	case d = <-done:
		t.Fatalf("the answer ended as its prefill was released: %s", d)
	default:
	}
	d = <-done
	if want := "ttft_ms="; !strings.Contains(d, want) {
		t.Fatalf("the long request was not priced: %s", d)
	}
	t.Logf("backlog up to %d tokens, released while decoding; predicted TTFT %s ms", most, field(d, "ttft_ms"))
}

// TestOutcomesOnlyFromStreams: cachesync learns time to first token only
// from streamed answers. A non-streamed answer's first byte comes with its
// last token, and an engine's error with none: counted as times to first
// token, a pool of non-streaming clients taught the fit their whole
// latency, and every rejected request a first token within a millisecond.
func TestOutcomesOnlyFromStreams(t *testing.T) {
	cs, g, system := oneEngineGateway(t, vllmsim.Config{NumGPUBlocks: 1024, TimeScale: 0.05})
	const outcomes = "kvroute_cachesync_ttft_prediction_error_ratio"
	counted := func() float64 {
		n, _ := sample(metrics(t, "http://"+cs.addr+"/metrics"), outcomes)
		return n
	}
	before := counted()
	const each = 8
	for i := range each {
		probe(t, g, system, "rejected "+strconv.Itoa(i)) // the engine answers 400
		if code, d := post(t, g.client, g.url, simChat(system, "whole "+strconv.Itoa(i), 16)); code != http.StatusOK || field(d, "reason") == "rendezvous" {
			t.Fatalf("not streamed: status %d, decision %q", code, d)
		}
	}
	for i := range each {
		if s := streamChat(g.client, g.url, system, "streamed "+strconv.Itoa(i), 16); !s.complete {
			t.Fatalf("stream %d incomplete", i)
		}
	}
	// The streams' outcomes come after the others' would have: once they
	// are in, so is everything that was going to be.
	waitFor(t, 5*time.Second, "the streams' outcomes", func() bool { return counted() >= before+each })
	time.Sleep(300 * time.Millisecond) // three ticks for anything straggling
	if got := counted() - before; got != each {
		t.Errorf("cachesync took %v outcomes from %d streamed, %d non-streamed and %d rejected requests; want the streamed ones'", got, each, each, each)
	}
}
