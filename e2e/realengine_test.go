//go:build realengine

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/e2e/llamacpp"
)

// Real engines: llama.cpp's llama-server with Gemma 3 270M (make llamacpp)
// behind real Envoy with cachesync, as a user runs them. llama.cpp has no
// KV events: cachesync knows it by its metrics, sizes its cache from its
// slots, and indexes it from the gateways' reports. make test-real runs
// these.

func startLlamaServers(t *testing.T, n int, cfg llamacpp.Config) []*llamacpp.Server {
	t.Helper()
	in, err := llamacpp.Find()
	if err != nil {
		t.Fatal(err)
	}
	var out []*llamacpp.Server
	for range n {
		s, err := llamacpp.Start(context.Background(), in, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Stop)
		out = append(out, s)
	}
	return out
}

func serverAddrs(ss []*llamacpp.Server) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.Addr())
	}
	return out
}

// llamaPool starts n servers of two 2,048-token slots, cachesync and a
// gateway in front of them, and waits until cachesync has calibrated them.
func llamaPool(t *testing.T, n int) ([]*llamacpp.Server, *runningDaemon, *gateway) {
	t.Helper()
	ss := startLlamaServers(t, n, llamacpp.Config{Slots: 2, Context: 2048})
	addrs := serverAddrs(ss)
	cs := startDaemon(t, "127.0.0.1:0", addrs, false)
	g := llamaGateway(t, addrs, cs.addr)
	waitFor(t, 30*time.Second, "the servers healthy", func() bool {
		return strings.Contains(cs.get(t, "/metrics"), `kvroute_cachesync_engines_by_health{health="healthy"} `+strconv.Itoa(n))
	})
	calibrated(t, cs, ss)
	return ss, cs, g
}

// llamaGateway runs the shipped envoy.yaml in front of llama.cpp servers,
// with one request per upstream connection, as the README advises for
// them: llama-server closes the connection after every streamed response.
func llamaGateway(t *testing.T, addrs []string, cachesync string) *gateway {
	t.Helper()
	cfg := cachesyncConfig(t, addrs, cachesync, nil)
	must(t, cfg.SetOneRequestPerConnection(engineCluster))
	return startGateway(t, cfg, 2)
}

// handbook is a tenant's system prompt of about 400 Gemma tokens.
func handbook(tenant int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "You answer for tenant %d. Its handbook follows.\n", tenant)
	for i := range 24 {
		fmt.Fprintf(&b, "Rule %d.%d: orders over %d units ship from depot %c within %d days.\n", tenant, i, 10*i+tenant, 'A'+rune(i%7), i%5+1)
	}
	return b.String()
}

// calibrated has each server prefill a long prompt of its own, sent to it
// directly so that no index learns of it, and waits for cachesync to
// calibrate every server's prefill rate from llama.cpp's own timing of it
// (prompt_seconds_total): a CPU's rate is some 60 times below the GPU
// default cachesync starts from.
func calibrated(t *testing.T, cs *runningDaemon, ss []*llamacpp.Server) {
	t.Helper()
	errs := make(chan error, len(ss))
	for i, s := range ss {
		go func() {
			code, _, err := tryPost(http.DefaultClient, s.URL(), llamaChat(handbook(100+i)+handbook(200+i)+handbook(300+i), "Which depot?"))
			if err == nil && code != http.StatusOK {
				err = fmt.Errorf("status %d", code)
			}
			errs <- err
		}()
	}
	for range ss {
		if err := <-errs; err != nil {
			t.Fatalf("calibration prompt: %v", err)
		}
	}
	waitFor(t, 30*time.Second, "cachesync to calibrate the servers", func() bool {
		return calibratedCount(cs.get(t, "/metrics")) == len(ss)
	})
	m := cs.get(t, "/metrics")
	for _, line := range strings.Split(m, "\n") {
		if strings.HasPrefix(line, "kvroute_cachesync_engine_prefill_rate_tokens_per_second") {
			t.Log(line)
		}
	}
	// The rates, and the scrapes after the calibration prompts, reach the
	// gateway with cachesync's next build and its next fetch.
	time.Sleep(500 * time.Millisecond)
}

func calibratedCount(metrics string) int {
	n := 0
	for _, line := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(line, "kvroute_cachesync_engine_prefill_rate_calibrated{") && strings.HasSuffix(line, " 1") {
			n++
		}
	}
	return n
}

func llamaChat(system, user string) []byte {
	b, _ := json.Marshal(map[string]any{
		"model": llamacpp.Model, "max_tokens": 4, "temperature": 0,
		"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}},
	})
	return b
}

// endpointOf reads the endpoint out of a decision header.
func endpointOf(decision string) string {
	rest, ok := strings.CutPrefix(decision, "endpoint=")
	if !ok {
		return ""
	}
	end, _, _ := strings.Cut(rest, ";")
	return end
}

func readCounters(t *testing.T, ss []*llamacpp.Server) []llamacpp.Counters {
	t.Helper()
	var out []llamacpp.Counters
	for _, s := range ss {
		c, err := s.ReadCounters()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

// TestRealEngineAffinity: four tenants' conversations, six questions each,
// in shuffled order, one at a time, over two servers of two slots: each
// tenant's requests stay on one server, the tenants split two and two
// (each server's slots hold exactly two prompts), and the servers' own
// counters show the prompts served from their caches.
func TestRealEngineAffinity(t *testing.T) {
	ss, cs, g := llamaPool(t, 2)
	addrs := serverAddrs(ss)

	type req struct{ tenant, question int }
	var order []req
	for tenant := range 4 {
		for q := range 6 {
			order = append(order, req{tenant, q})
		}
	}
	rng := rand.New(rand.NewPCG(7, 7))
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })

	before := readCounters(t, ss)
	home := map[int]string{}
	perServer := map[string]int{}
	for _, r := range order {
		code, d := post(t, g.client, g.url, llamaChat(handbook(r.tenant), "Question "+strconv.Itoa(r.question)+": which depot?"))
		if code != http.StatusOK {
			t.Fatalf("tenant %d question %d: status %d (%s)", r.tenant, r.question, code, d)
		}
		ep := endpointOf(d)
		if h, ok := home[r.tenant]; !ok {
			home[r.tenant] = ep
			perServer[ep]++
			t.Logf("tenant %d placed: %s", r.tenant, d)
		} else if ep != h || !strings.Contains(d, "reason=affinity") {
			t.Errorf("tenant %d question %d went to %s (%s), not to its home %s by affinity", r.tenant, r.question, ep, d, h)
		}
	}
	if len(perServer) != 2 || perServer[addrs[0]] != 2 {
		t.Errorf("tenants per server %v: want two on each, as many as its slots hold", perServer)
	}
	after := readCounters(t, ss)
	var sum llamacpp.Counters
	for i := range ss {
		d := after[i].Minus(before[i])
		t.Logf("server %s: %.0f prompt tokens, %.0f of them cached (%.0f%%)", addrs[i], d.PromptTokens, d.CachedTokens, 100*d.HitRate())
		sum.PromptTokens += d.PromptTokens
		sum.CachedTokens += d.CachedTokens
	}
	// Four cold prompts of 24: every other one is served from a slot
	// but for its question, about 80% of the tokens.
	if hit := sum.HitRate(); hit < 0.75 {
		t.Errorf("prefix-cache hit rate %.0f%% (llamacpp:prompt_tokens_cached_total), want at least 75%%", 100*hit)
	}
	reportsAccepted(t, g)

	// cachesync checked each server's template through /apply-template.
	waitFor(t, 10*time.Second, "the servers' template check", func() bool {
		m := cs.get(t, "/metrics")
		return strings.Count(m, "kvroute_cachesync_template_agreement{engine=") >= 2
	})
}

// TestRealEngineRestart: a server killed under a tenant's traffic costs no
// request (the route retries the refused connection on the runner-up the
// filter named), is routed around once cachesync sees it down, and after a
// restart with an empty cache is forgotten by the index and takes new
// tenants again.
func TestRealEngineRestart(t *testing.T) {
	ss, cs, g := llamaPool(t, 2)
	ask := func(tenant, q int) string {
		t.Helper()
		code, d := post(t, g.client, g.url, llamaChat(handbook(tenant), "Question "+strconv.Itoa(q)+": which depot?"))
		if code != http.StatusOK {
			t.Fatalf("tenant %d question %d: status %d (%s)", tenant, q, code, d)
		}
		return endpointOf(d)
	}
	victim := ask(0, 0)
	waitFor(t, 10*time.Second, "tenant 0's affinity", func() bool {
		return ask(0, 1) == victim
	})
	var dead *llamacpp.Server
	for _, s := range ss {
		if s.Addr() == victim {
			dead = s
		}
	}
	dead.Kill()

	// Routed to the dead server until cachesync sees it down: each such
	// request is retried on the runner-up.
	for q := 2; q < 8; q++ {
		ask(0, q)
	}
	waitFor(t, 10*time.Second, "the dead server routed around", func() bool {
		return ask(0, 9) != victim
	})
	for q := 10; q < 14; q++ {
		if ep := ask(0, q); ep == victim {
			t.Fatalf("question %d routed to the dead server %s", q, victim)
		}
	}

	if err := dead.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the restarted server healthy", func() bool {
		return strings.Contains(cs.get(t, "/metrics"), `kvroute_cachesync_engines_by_health{health="healthy"} 2`)
	})
	// Its old entries are gone: tenant 0 stays where it moved, and a new
	// tenant goes to the empty cache.
	moved := ask(0, 20)
	if moved == victim {
		t.Errorf("tenant 0 routed back to the restarted server, which lost its prompt")
	}
	if ep := ask(1, 0); ep != victim {
		t.Errorf("a new tenant went to %s, not to the restarted server's empty cache %s", ep, victim)
	}
}

// completion is one /v1/completions answer through the gateway: the
// server's own count of the prompt tokens it served from its cache, and
// the filter's decision.
type completion struct {
	cached, prompt int
	decision       string
}

// complete asks for exactly maxTokens tokens (ignore_eos).
func complete(g *gateway, prompt string, maxTokens int) (completion, error) {
	body, _ := json.Marshal(map[string]any{"model": llamacpp.Model, "prompt": prompt, "max_tokens": maxTokens, "temperature": 0, "ignore_eos": true})
	resp, err := g.client.Post(g.url+"/v1/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		return completion{}, err
	}
	defer resp.Body.Close()
	var r struct {
		Timings struct {
			Cached int `json:"cache_n"`
			Prompt int `json:"prompt_n"`
		} `json:"timings"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != http.StatusOK {
		return completion{}, fmt.Errorf("status %d: %v", resp.StatusCode, err)
	}
	return completion{r.Timings.Cached, r.Timings.Cached + r.Timings.Prompt, resp.Header.Get("x-kvroute-decision")}, nil
}

// TestRealEngineSlotNaming: one server of two slots holds two tenants'
// prompts, one per slot. A tenant's second request while its first is
// running would take the other slot (llama.cpp gives a request any idle
// one) and evict the other tenant; named to its tenant's slot (id_slot,
// from the prompts cachesync reads off /slots), it waits for it instead,
// and both tenants' next requests are served from the cache.
func TestRealEngineSlotNaming(t *testing.T) {
	_, _, g := llamaPool(t, 1)
	prompt := func(tenant, q int) string {
		return handbook(tenant) + "Question " + strconv.Itoa(q) + ": which depot?\n"
	}
	for _, tenant := range []int{1, 2} {
		if _, err := complete(g, prompt(tenant, 0), 4); err != nil {
			t.Fatal(err)
		}
	}
	// cachesync reads the slots with its next scrape, and the gateway
	// fetches them with its next sync.
	time.Sleep(time.Second)

	long := make(chan error, 1)
	// 64 tokens at the 10 ms a token this server takes: the slot is busy
	// for most of a second, and waiting for it costs less than the
	// handbook's prefill (some 2 s on one thread).
	go func() { _, err := complete(g, prompt(1, 1), 64); long <- err }()
	time.Sleep(200 * time.Millisecond)
	second, err := complete(g, prompt(1, 2), 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-long; err != nil {
		t.Fatal(err)
	}
	other, err := complete(g, prompt(2, 1), 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tenant 1's second request: %d of %d prompt tokens cached (%s)", second.cached, second.prompt, second.decision)
	t.Logf("tenant 2's next request: %d of %d prompt tokens cached (%s)", other.cached, other.prompt, other.decision)
	if !strings.Contains(second.decision, "engine_slot=") {
		t.Errorf("tenant 1's second request named no slot: %s", second.decision)
	}
	// The handbook is some 90% of each prompt.
	for name, c := range map[string]completion{"tenant 1's second request": second, "tenant 2's next request": other} {
		if c.cached < c.prompt*3/4 {
			t.Errorf("%s: %d of %d prompt tokens cached, want most of them", name, c.cached, c.prompt)
		}
	}
	stats, err := g.envoy.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n := stats["wasmcustom.kvroute.engine_slots.named"]; n < 1 {
		t.Errorf("kvroute.engine_slots.named = %d, want the requests that named a slot", n)
	}
}
