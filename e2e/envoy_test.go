package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/e2e/envoy"
)

// The real-Envoy tests run the repository's envoy.yaml with only ports,
// endpoint addresses, the module path and (where a test says so) the plugin
// configuration rewritten.

const (
	shippedConfig = "../envoy.yaml"
	pluginName    = "kvroute"
	engineCluster = "engines"
	llmListener   = "llm"
	destHeader    = "x-gateway-destination-endpoint"
)

// upstream is a stand-in engine: it answers every request with a reply
// saying who answered and what arrived.
type upstream struct {
	addr string // ip:port, as the filter and Envoy name it
	srv  *httptest.Server
	mu   sync.Mutex
	hits int
}

// reply is what an upstream answers.
type reply struct {
	Server      string `json:"server"`
	Method      string `json:"method"`
	Path        string `json:"path"`
	Destination string `json:"destination"` // the chosen endpoint
	// DestinationList is the whole header: the chosen endpoint, then the
	// fallbacks a retry goes to.
	DestinationList string `json:"destination_list"`
	OriginalDst     string `json:"original_dst"`
	BodyBytes       int64  `json:"body_bytes"`
	BodySHA256      string `json:"body_sha256"`
}

func startUpstreams(t testing.TB, n int) []*upstream {
	t.Helper()
	ups := make([]*upstream, n)
	for i := range ups {
		u := &upstream{}
		u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
		u.addr = u.srv.Listener.Addr().String()
		t.Cleanup(u.srv.Close)
		ups[i] = u
	}
	return ups
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	h := sha256.New()
	n, err := io.Copy(h, r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	u.mu.Lock()
	u.hits++
	u.mu.Unlock()
	w.Header().Set("content-type", "application/json")
	json.NewEncoder(w).Encode(reply{
		Server:          u.addr,
		Method:          r.Method,
		Path:            r.URL.RequestURI(),
		Destination:     first(strings.Join(r.Header.Values(destHeader), ",")),
		DestinationList: strings.Join(r.Header.Values(destHeader), ","),
		OriginalDst:     r.Header.Get("x-envoy-original-dst-host"),
		BodyBytes:       n,
		BodySHA256:      hex.EncodeToString(h.Sum(nil)),
	})
}

// first is the first of a comma-separated list.
func first(list string) string {
	f, _, _ := strings.Cut(list, ",")
	return f
}

func (u *upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hits
}

func addrs(ups []*upstream) []string {
	var out []string
	for _, u := range ups {
		out = append(out, u.addr)
	}
	return out
}

// gateway is the shipped envoy.yaml running in real Envoy in front of
// upstreams.
type gateway struct {
	url    string
	envoy  *envoy.Process
	client *http.Client
}

// gatewayConfig loads envoy.yaml and rewrites what a test run must change:
// free ports, the engines cluster's endpoints, the module path, and the
// plugin's endpoint list (pluginEndpoints, or the cluster's if nil), with no
// cachesync.
func gatewayConfig(t testing.TB, cluster, pluginEndpoints []string) *envoy.Config {
	t.Helper()
	cfg, err := envoy.LoadConfig(shippedConfig)
	if err != nil {
		t.Fatal(err)
	}
	if pluginEndpoints == nil {
		pluginEndpoints = cluster
	}
	abs, err := filepath.Abs(wasmPath)
	if err != nil {
		t.Fatal(err)
	}
	must(t, cfg.UseFreePorts())
	must(t, cfg.SetEndpoints(engineCluster, cluster))
	must(t, cfg.SetWasmCode(pluginName, abs))
	pc, err := cfg.PluginConfiguration(pluginName)
	if err != nil {
		t.Fatal(err)
	}
	pc["endpoints"] = pluginEndpoints
	// Without cachesync the filter keeps its own index: a single gateway's
	// mode, the one these tests exercise.
	delete(pc, "cachesync")
	must(t, cfg.SetPluginConfiguration(pluginName, pc))
	return cfg
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// startGateway runs cfg in Envoy with concurrency workers. It fails the
// test (never skips it) if Envoy cannot run; at cleanup, once Envoy has
// exited and its log is complete, it fails the test if Envoy logged a Wasm
// VM failure.
func startGateway(t testing.TB, cfg *envoy.Config, concurrency int) *gateway {
	t.Helper()
	return launchGateway(t, cfg, concurrency, true)
}

// launchGateway is startGateway; healthy false is for tests that kill VMs
// on purpose.
func launchGateway(t testing.TB, cfg *envoy.Config, concurrency int, healthy bool) *gateway {
	t.Helper()
	b, err := cfg.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p, err := envoy.Start(ctx, envoy.Options{Config: b, Dir: t.TempDir(), Concurrency: concurrency})
	if err != nil {
		t.Fatalf("start Envoy: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("stop Envoy: %v", err)
		}
		if f := p.WasmFailures(); healthy && len(f) > 0 {
			t.Errorf("Envoy logged Wasm failures:\n%s", strings.Join(f, "\n"))
		}
	})
	url, err := p.ListenerURL(ctx, llmListener)
	if err != nil {
		t.Fatal(err)
	}
	return &gateway{
		url:   url,
		envoy: p,
		client: &http.Client{
			Timeout:   time.Minute,
			Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true},
		},
	}
}

// do sends one request through Envoy and decodes the upstream's reply; it
// fails the test on anything but a 200 from an upstream.
func (g *gateway) do(t testing.TB, method, path string, body io.Reader, header http.Header) reply {
	t.Helper()
	r, err := g.send(method, path, body, header)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

func (g *gateway) send(method, path string, body io.Reader, header http.Header) (reply, error) {
	req, err := http.NewRequest(method, g.url+path, body)
	if err != nil {
		return reply{}, err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	if body != nil && req.Header.Get("content-type") == "" {
		req.Header.Set("content-type", "application/json")
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return reply{}, &statusError{resp.StatusCode, string(b)}
	}
	var r reply
	if err := json.Unmarshal(b, &r); err != nil {
		return reply{}, &statusError{resp.StatusCode, "not an upstream reply: " + string(b)}
	}
	return r, nil
}

type statusError struct {
	code int
	body string
}

func (e *statusError) Error() string { return "status " + strconv.Itoa(e.code) + ": " + e.body }

func (g *gateway) chat(t testing.TB, body []byte, header http.Header) reply {
	t.Helper()
	return g.do(t, http.MethodPost, "/v1/chat/completions", bytes.NewReader(body), header)
}

// counters returns the filter's outcome counters (kvroute.requests.*),
// summed over the workers' VMs.
func (g *gateway) counters(t testing.TB) map[string]int64 {
	t.Helper()
	stats, err := g.envoy.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for name, v := range stats {
		if rest, ok := strings.CutPrefix(name, "wasmcustom.kvroute.requests."); ok {
			out[rest] = v
		}
	}
	if len(out) == 0 {
		t.Fatalf("no wasmcustom.kvroute.requests.* stats; Envoy stats are %d names", len(stats))
	}
	return out
}

func sha(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// settle waits for the filter to learn where a prompt went. In local mode
// (no cachesync, as envoy.yaml ships) the VMs share what they routed through
// an index one VM rebuilds every sync interval (100 ms); until then a new
// prompt's next request is balanced by load, not affinity.
func settle() { time.Sleep(time.Second) }

// sharedPrefix is a system prompt of many 64-byte blocks, so requests that
// share it share cached blocks, and a route.
var sharedPrefix = strings.Repeat("You are a meticulous assistant for the billing team. ", 16)

// TestEnvoy runs every check that can share one Envoy: V8 takes seconds to
// compile the module, so each start is expensive.
func TestEnvoy(t *testing.T) {
	skipUnderRace(t)
	ups := startUpstreams(t, 3)
	g := startGateway(t, gatewayConfig(t, addrs(ups), nil), 2)
	members := addrs(ups)
	// A fresh connection per request spreads requests over both workers'
	// VMs, which must agree.
	fresh := http.Header{"Connection": {"close"}}

	t.Run("same prefix same upstream", func(t *testing.T) {
		var first string
		for i := range 20 {
			body := chatBody(t, "qwen", sharedPrefix, "question number "+strconv.Itoa(i))
			r := g.chat(t, body, fresh)
			if !contains(members, r.Destination) {
				t.Fatalf("request %d: destination %q is not an engine", i, r.Destination)
			}
			if r.Server != r.Destination {
				t.Errorf("request %d: routed to %s but answered by %s", i, r.Destination, r.Server)
			}
			if i == 0 {
				first = r.Server
				settle()
			} else if r.Server != first {
				t.Errorf("request %d answered by %s, the first by %s", i, r.Server, first)
			}
		}
	})

	t.Run("different prefixes spread", func(t *testing.T) {
		seen := map[string]int{}
		for i := range 60 {
			body := chatBody(t, "qwen", "tenant "+strconv.Itoa(i)+" "+strings.Repeat("shared context ", 40))
			r := g.chat(t, body, nil)
			if r.Server != r.Destination {
				t.Errorf("routed to %s but answered by %s", r.Destination, r.Server)
			}
			seen[r.Server]++
		}
		// Fresh prompts go to the least-loaded engine, ties broken at
		// random: each engine gets about 20, and fewer than 5 has odds
		// of a few in a million.
		for _, m := range members {
			if seen[m] < 5 {
				t.Errorf("engine %s answered %d of 60 distinct prefixes: %v", m, seen[m], seen)
			}
		}
	})

	t.Run("client cannot steer", func(t *testing.T) {
		body := chatBody(t, "qwen", sharedPrefix, "where do I go?")
		home := g.chat(t, body, nil).Server
		settle()
		var other string
		for _, m := range members {
			if m != home {
				other = m
			}
		}
		outside := "127.0.0.1:1" // not an engine, nothing listens there
		for _, target := range []string{other, outside} {
			steer := http.Header{
				"X-Gateway-Destination-Endpoint": {target},
				"X-Envoy-Original-Dst-Host":      {target},
			}
			r := g.chat(t, body, steer)
			if r.Server != home || r.Destination != home || r.OriginalDst != "" || strings.Contains(r.DestinationList, outside) {
				t.Errorf("chat steered to %s: answered by %s, destination %q, original-dst %q; want %s",
					target, r.Server, r.Destination, r.OriginalDst, home)
			}
			// Requests the filter does not route get Envoy's own balancing,
			// whatever the client asks for.
			byServer := map[string]int{}
			for range 30 {
				r := g.do(t, http.MethodGet, "/v1/models", nil, steer)
				if r.Destination != "" || r.OriginalDst != "" {
					t.Fatalf("GET /v1/models reached %s with destination %q, original-dst %q", r.Server, r.Destination, r.OriginalDst)
				}
				byServer[r.Server]++
			}
			if byServer[target] == 30 || len(byServer) < 2 {
				t.Errorf("30 GETs naming %s landed on %v: the client header steered them", target, byServer)
			}
		}
	})

	t.Run("pass through", func(t *testing.T) {
		before := g.counters(t)
		body := chatBody(t, "qwen", sharedPrefix)
		cases := []struct{ method, path string }{
			{http.MethodGet, "/v1/models"},
			{http.MethodPost, "/v1/embeddings"},
			{http.MethodPut, "/v1/chat/completions"},
			{http.MethodPost, "/healthz?probe=1"},
		}
		for _, c := range cases {
			var rd io.Reader
			if c.method != http.MethodGet {
				rd = bytes.NewReader(body)
			}
			r := g.do(t, c.method, c.path, rd, nil)
			if r.Method != c.method || r.Path != c.path || r.Destination != "" {
				t.Errorf("%s %s arrived as %s %s with destination %q", c.method, c.path, r.Method, r.Path, r.Destination)
			}
			if rd != nil && r.BodySHA256 != sha(body) {
				t.Errorf("%s %s: body changed on the way (%d bytes arrived)", c.method, c.path, r.BodyBytes)
			}
		}
		after := g.counters(t)
		for k, v := range after {
			if v != before[k] {
				t.Errorf("pass-through requests moved kvroute.requests.%s from %d to %d", k, before[k], v)
			}
		}
	})

	t.Run("fallbacks", func(t *testing.T) {
		// Over max_body_bytes (8 MiB) the filter lets go of the body and
		// Envoy balances on its own. Envoy reads up to a connection buffer's
		// worth at once, so the chunk crossing the limit can be large; with
		// too small a request_body_buffer_limit about half of these got a
		// 413 from Envoy, hence the repeats.
		oversized := chatBody(t, "qwen", strings.Repeat("y", 12<<20))
		cases := []struct {
			name, outcome string
			body          []byte
			repeat        int
		}{
			{"malformed JSON", "invalid_body", []byte(`{"model":"qwen","messages":[{"role":"user","content":"x"}`), 1},
			{"binary junk", "invalid_body", []byte{0xff, 0xfe, 0x00, '{'}, 1},
			{"no prompt", "no_prompt", []byte(`{"model":"qwen","max_tokens":4}`), 1},
			{"just routable", "routed", chatBody(t, "qwen", strings.Repeat("z", 8<<20-1024)), 2},
			{"oversized", "body_too_large", oversized, 8},
			{"far oversized", "body_too_large", chatBody(t, "qwen", strings.Repeat("y", 40<<20)), 2},
		}
		for _, c := range cases {
			before := g.counters(t)
			for range c.repeat {
				r, err := g.send(http.MethodPost, "/v1/chat/completions", bytes.NewReader(c.body), nil)
				if err != nil {
					t.Errorf("%s (%d bytes): %v", c.name, len(c.body), err)
					continue
				}
				if routed := c.outcome == "routed"; routed != (r.Destination != "") {
					t.Errorf("%s: destination %q, want one only if routed", c.name, r.Destination)
				}
				if r.BodySHA256 != sha(c.body) {
					t.Errorf("%s: %d of %d body bytes arrived, or they changed", c.name, r.BodyBytes, len(c.body))
				}
				if !contains(members, r.Server) {
					t.Errorf("%s: answered by %s", c.name, r.Server)
				}
			}
			if got := g.counters(t)[c.outcome]; got != before[c.outcome]+int64(c.repeat) {
				t.Errorf("%s: kvroute.requests.%s went %d -> %d, want +%d", c.name, c.outcome, before[c.outcome], got, c.repeat)
			}
		}
	})

	t.Run("chunked request", func(t *testing.T) {
		body := chatBody(t, "qwen", sharedPrefix, strings.Repeat("a long question in many pieces ", 2000))
		want := g.chat(t, body, nil)
		settle()
		pr, pw := io.Pipe()
		go func() {
			// Pieces of odd sizes with pauses, so Envoy hands the filter the
			// body in several calls.
			for off, i := 0, 0; off < len(body); i++ {
				end := min(off+1000+i*977, len(body))
				if _, err := pw.Write(body[off:end]); err != nil {
					return
				}
				off = end
				time.Sleep(time.Millisecond)
			}
			pw.Close()
		}()
		req, err := http.NewRequest(http.MethodPost, g.url+"/v1/chat/completions", pr)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("content-type", "application/json")
		// A body of unknown length goes out with Transfer-Encoding: chunked.
		req.ContentLength = -1
		resp, err := g.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r reply
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d, decode: %v", resp.StatusCode, err)
		}
		if r.Destination != want.Destination || r.Server != want.Server || r.BodySHA256 != sha(body) {
			t.Errorf("chunked: answered by %s, destination %q, %d bytes; unchunked went to %s",
				r.Server, r.Destination, r.BodyBytes, want.Server)
		}
	})

	// Last, so that a VM failure under load cannot hide behind the others.
	t.Run("sustained load", func(t *testing.T) {
		if testing.Short() {
			// The race pass: Envoy runs the module, which the race
			// detector cannot see; the full pass measures this.
			t.Skip("20,000 requests: in the full pass only")
		}
		sustainLoad(t, g, ups)
	})
}

// The plugin may name an endpoint that is not a member of Envoy's cluster
// (a stale list, a typo, a hostile config push). override_host must ignore
// it and the fallback must pick a member: nothing outside the cluster is
// ever reached through the header.
func TestEnvoyOutsideHostUnreachable(t *testing.T) {
	skipUnderRace(t)
	ups := startUpstreams(t, 4)
	members, outsider := ups[:3], ups[3]
	plugin := append(addrs(members), outsider.addr)
	g := startGateway(t, gatewayConfig(t, addrs(members), plugin), 2)

	pickedOutsider := 0
	for i := range 80 {
		body := chatBody(t, "qwen", "tenant "+strconv.Itoa(i)+" "+strings.Repeat("shared context ", 40))
		r := g.chat(t, body, nil)
		if !contains(addrs(members), r.Server) {
			t.Fatalf("request %d answered by %s, not a cluster member", i, r.Server)
		}
		switch r.Destination {
		case outsider.addr:
			pickedOutsider++
		case r.Server:
		default:
			t.Errorf("request %d: destination %q but answered by %s", i, r.Destination, r.Server)
		}
	}
	// A client naming the outsider directly gets nowhere either.
	for range 20 {
		g.do(t, http.MethodGet, "/v1/models", nil, http.Header{"X-Gateway-Destination-Endpoint": {outsider.addr}})
	}
	if pickedOutsider == 0 {
		t.Fatal("the filter never chose the outsider; the test proves nothing")
	}
	if n := outsider.count(); n != 0 {
		t.Errorf("the host outside the cluster got %d requests", n)
	}
	t.Logf("filter chose the outsider for %d of 80 prompts; Envoy sent none there", pickedOutsider)
}

// TestEnvoyRetryGoesToTheFallback: one engine of three refuses connections.
// The filter's destination header lists its choice and then the runner-up,
// and the shipped route retries a refused connection once, so a request
// routed to the dead engine is served by the runner-up the filter named,
// not by whatever Envoy's own balancing picks; the response says who
// served it.
func TestEnvoyRetryGoesToTheFallback(t *testing.T) {
	skipUnderRace(t)
	ups := startUpstreams(t, 2)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens there now: connections are refused
	cfg := gatewayConfig(t, append([]string{dead}, addrs(ups)...), nil)
	pc, err := cfg.PluginConfiguration(pluginName)
	if err != nil {
		t.Fatal(err)
	}
	pc["debug_header"] = true
	must(t, cfg.SetPluginConfiguration(pluginName, pc))
	g := startGateway(t, cfg, 1)
	toDead := 0
	for i := range 45 {
		body := chatBody(t, "qwen", "tenant "+strconv.Itoa(i)+" "+strings.Repeat("own context ", 40))
		req, err := http.NewRequest("POST", g.url+"/v1/chat/completions", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("content-type", "application/json")
		resp, err := g.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var r reply
		err = json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || err != nil {
			t.Fatalf("request %d: %s (%v): a refused connection was not retried", i, resp.Status, err)
		}
		if served := resp.Header.Get("x-gateway-destination-endpoint-served"); served != r.Server {
			t.Errorf("request %d: served header %q, answered by %s", i, served, r.Server)
		}
		list := strings.Split(r.DestinationList, ",")
		if len(list) != 2 {
			t.Fatalf("request %d: destination %q, want the choice and one fallback", i, r.DestinationList)
		}
		if list[0] == dead {
			toDead++
			if r.Server != list[1] {
				t.Errorf("request %d: routed to the dead %s, retried on %s, not the fallback %s", i, dead, r.Server, list[1])
			}
		}
	}
	if toDead == 0 {
		t.Fatal("no request was routed to the dead engine, so no retry was tested")
	}
}
