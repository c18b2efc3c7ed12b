package e2e

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/e2e/wasmhost"
	"github.com/kvroute/kvroute/shared/blockhash"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/report"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// fakeCachesync answers the filter's callouts like cachesync: snapshot
// bundles from a snapshot.Builder, and reports.
type fakeCachesync struct {
	mu      sync.Mutex
	t       testing.TB
	b       *snapshot.Builder
	img     *snapshot.Image
	fail    bool // answer every call with a failure
	corrupt bool // answer with a damaged bundle
	fetches []string
	reports []report.Batch
	auth    []string
	// snapshotAuth is each snapshot request's authorization header.
	snapshotAuth []string
}

// fakeEpoch is the fake cachesync's snapshot history.
const fakeEpoch = "00000000000000ab"

func newFakeCachesync(t testing.TB, eps ...snapshot.EndpointInfo) *fakeCachesync {
	return newFakeCachesyncWith(t, snapshot.BuilderConfig{FirstGeneration: 100}, eps...)
}

func newFakeCachesyncWith(t testing.TB, cfg snapshot.BuilderConfig, eps ...snapshot.EndpointInfo) *fakeCachesync {
	b, err := snapshot.NewBuilder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range eps {
		if _, err := b.SetEndpoint(e); err != nil {
			t.Fatal(err)
		}
	}
	f := &fakeCachesync{t: t, b: b}
	f.build()
	return f
}

func (f *fakeCachesync) build() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.img = f.b.Build(time.Now())
}

// hold records that endpoint addr holds the given blocks on the GPU.
func (f *fakeCachesync) hold(addr string, hashes []uint64) {
	f.mu.Lock()
	slot, ok := f.b.Endpoint(addr)
	for _, h := range hashes {
		if err := f.b.Add(slot, h, snapshot.TierGPU); err != nil || !ok {
			f.t.Fatalf("add %s: %v", addr, err)
		}
	}
	f.mu.Unlock()
	f.build()
}

func (f *fakeCachesync) setEndpoint(e snapshot.EndpointInfo) {
	f.mu.Lock()
	if _, err := f.b.SetEndpoint(e); err != nil {
		f.t.Fatal(err)
	}
	f.mu.Unlock()
	f.build()
}

func (f *fakeCachesync) serve(c *wasmhost.Callout) wasmhost.CalloutResponse {
	f.mu.Lock()
	defer f.mu.Unlock()
	path := c.Header(":path")
	if f.fail {
		return wasmhost.CalloutResponse{Fail: true}
	}
	if strings.HasPrefix(path, "/v1/reports") {
		f.auth = append(f.auth, c.Header("authorization"))
		batch, err := report.Parse(c.Body, report.Limits{})
		if err != nil {
			f.t.Errorf("filter sent a corrupt report batch: %v", err)
		}
		f.reports = append(f.reports, batch)
		// What cachesync answers: the batch is applied later.
		return wasmhost.CalloutResponse{Headers: [][2]string{{":status", "202"}}}
	}
	f.fetches = append(f.fetches, path)
	f.snapshotAuth = append(f.snapshotAuth, c.Header("authorization"))
	since, _ := strconv.ParseUint(path[strings.Index(path, "since=")+6:], 10, 64)
	if since == f.img.Generation() {
		return wasmhost.CalloutResponse{Headers: [][2]string{{":status", "304"}}}
	}
	body := f.img.AppendBundle(nil, since)
	if f.corrupt {
		body[len(body)/2] ^= 0xff
	}
	return wasmhost.CalloutResponse{Headers: [][2]string{{":status", "200"}, {"x-kvroute-epoch", fakeEpoch}}, Body: body}
}

func liveConfig(t testing.TB, extra map[string]any) []byte {
	cfg := map[string]any{
		"cachesync":        map[string]any{"cluster": "cachesync", "report_token": "s3cret"},
		"sync_interval_ms": 100,
		"debug_header":     true,
	}
	for k, v := range extra {
		cfg[k] = v
	}
	return pluginConfig(t, cfg)
}

func newLiveVM(t testing.TB, h *wasmhost.Host, f *fakeCachesync, cfg []byte) *wasmhost.VM {
	t.Helper()
	vm, err := h.NewVM(context.Background(), wasmhost.VMConfig{
		VMID: "kvroute", PluginConfiguration: cfg, AllowOnHeadersStopIteration: true,
		Clusters: map[string]func(*wasmhost.Callout) wasmhost.CalloutResponse{"cachesync": f.serve},
	})
	if err != nil {
		t.Fatalf("start VM: %v\n%s", err, vm.LogText())
	}
	return vm
}

// sync runs ticks and callouts on every VM until the callouts settle.
func syncVMs(vms ...*wasmhost.VM) {
	for range 3 {
		for _, vm := range vms {
			vm.Tick()
			vm.DeliverCallouts()
		}
	}
}

// filterHashes is what the filter hashes for a body: prompt rendering and
// block hashing from shared/, as cachesync's bridge reproduces them.
func filterHashes(t testing.TB, body []byte) []uint64 {
	t.Helper()
	p, err := prompt.Render(nil, body, prompt.ChatML)
	if err != nil {
		t.Fatal(err)
	}
	return blockhash.Append(nil, blockhash.Seed(p.Model, ""), p.Text, blockhash.Config{})
}

func engines(addrs ...string) []snapshot.EndpointInfo {
	var eps []snapshot.EndpointInfo
	for _, a := range addrs {
		eps = append(eps, snapshot.EndpointInfo{Addr: a, Models: []string{"qwen"}, Health: snapshot.HealthHealthy, PrefillRate: 10000,
			Template: prompt.ChatML}) // as cachesync's template check publishes it
	}
	return eps
}

func decisionOf(t testing.TB, s *wasmhost.Stream) string {
	t.Helper()
	s.SendResponseHeaders([][2]string{{":status", "200"}}, false)
	d, _ := s.Downstream.Header("x-kvroute-decision")
	return d
}

func TestSnapshotRoutingFollowsCachesync(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	f := newFakeCachesync(t, engines(threeEndpoints...)...)
	vms := []*wasmhost.VM{newLiveVM(t, h, f, liveConfig(t, nil)), newLiveVM(t, h, f, liveConfig(t, nil))}
	syncVMs(vms...)

	body := chatBody(t, "qwen", strings.Repeat("the warm prefix of tenant seven ", 40), "what is due?")
	warm := threeEndpoints[2]
	f.hold(warm, filterHashes(t, body))
	syncVMs(vms...)
	for i, vm := range vms {
		s := send(t, vm, postHeaders("/v1/chat/completions"), body, 4096)
		if got := destination(t, s); got != warm {
			t.Errorf("VM %d routed to %s, want the endpoint holding the prefix %s", i, got, warm)
		}
		if d := decisionOf(t, s); !strings.Contains(d, "reason=affinity") {
			t.Errorf("VM %d decision %q, want affinity", i, d)
		}
		s.Close()
	}

	// Only one VM fetches, and it asks only for what changed.
	calls := 0
	for _, vm := range vms {
		calls += len(vm.PendingCallouts())
	}
	var sinces []string
	for i, path := range f.fetches {
		u, err := url.Parse(path)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		sinces = append(sinces, q.Get("since"))
		if full := q.Get("since") == "0"; full != (i == 0) {
			t.Errorf("fetch %d was %s: only the first fetch may ask for a whole snapshot", i, path)
		}
		// A since is only meaningful in the history that gave it.
		if epoch := q.Get("epoch"); (i == 0 && epoch != "") || (i > 0 && epoch != fakeEpoch) {
			t.Errorf("fetch %d was %s: want the epoch of the snapshot held (%s) after the first", i, path, fakeEpoch)
		}
		// cachesync checks the engines' chat templates against it.
		if q.Get("template") != "auto" {
			t.Errorf("fetch %d was %s: the gateway does not name its chat template", i, path)
		}
	}
	if !contains(sinces, strconv.FormatUint(f.img.Generation()-1, 10)) {
		t.Errorf("fetches %v: none asked for the change since the previous generation", f.fetches)
	}
	lockHolders := 0
	for _, vm := range vms {
		if strings.Contains(vm.LogText(), "now keeps the snapshot") {
			lockHolders++
		}
	}
	if lockHolders != 1 {
		t.Errorf("%d VMs fetched snapshots, want exactly one", lockHolders)
	}
}

// TestSnapshotBytesPerToken: the filter estimates prompt tokens with the
// bytes per token cachesync publishes (its -bytes-per-token), not a
// constant of its own.
func TestSnapshotBytesPerToken(t *testing.T) {
	body := chatBody(t, "qwen", strings.Repeat("a prompt nobody holds yet ", 80))
	p, err := prompt.Render(nil, body, prompt.ChatML)
	if err != nil {
		t.Fatal(err)
	}
	for _, bpt := range []float64{2, 4, 8} {
		h := newHost(t, wasmhost.Fixed)
		f := newFakeCachesyncWith(t, snapshot.BuilderConfig{FirstGeneration: 100, BytesPerToken: bpt}, engines(threeEndpoints...)...)
		vm := newLiveVM(t, h, f, liveConfig(t, nil))
		syncVMs(vm)
		s := send(t, vm, postHeaders("/v1/chat/completions"), body, 4096)
		want := "uncached_tokens=" + strconv.Itoa(int(float64(len(p.Text))/bpt))
		if d := decisionOf(t, s); !strings.Contains(d, want) {
			t.Errorf("bytes per token %v: decision %q, want %s", bpt, d, want)
		}
		s.Close()
	}
}

func TestReportsReachCachesyncWithToken(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	f := newFakeCachesync(t, engines(threeEndpoints...)...)
	vm := newLiveVM(t, h, f, liveConfig(t, nil))
	syncVMs(vm)
	body := chatBody(t, "qwen", strings.Repeat("report me ", 50))
	s := send(t, vm, postHeaders("/v1/chat/completions"), body, 4096)
	dest := destination(t, s)
	s.Close()
	syncVMs(vm)
	if len(f.reports) == 0 {
		t.Fatal("no report reached cachesync")
	}
	if f.auth[0] != "Bearer s3cret" {
		t.Errorf("report authorization %q", f.auth[0])
	}
	for _, a := range f.snapshotAuth {
		if a != "Bearer s3cret" {
			t.Errorf("snapshot fetched with authorization %q: its hashes would be open to anyone", a)
		}
	}
	p, err := prompt.Render(nil, body, prompt.ChatML)
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for e := range f.reports[0].Records() {
		if string(e.Endpoint()) != dest || string(e.Model()) != "qwen" {
			t.Errorf("report for %s/%s, want %s/qwen", e.Endpoint(), e.Model(), dest)
		}
		// What cachesync sets against the engine's prompt tokens.
		if e.Bytes() != len(p.Text) {
			t.Errorf("reported a prompt of %d bytes, want the rendered %d", e.Bytes(), len(p.Text))
		}
		got = e.AppendHashes(got)
	}
	if want := filterHashes(t, body); len(got) != len(want) || got[0] != want[0] {
		t.Errorf("reported %d hashes, want the prompt's %d", len(got), len(want))
	}
	if sent, _ := h.Metric("kvroute.reports.sent"); sent == 0 {
		t.Error("kvroute.reports.sent is 0 after a batch reached cachesync")
	}
	if errs, _ := h.Metric("kvroute.reports.errors"); errs != 0 {
		t.Errorf("kvroute.reports.errors = %d for batches cachesync accepted", errs)
	}
}

func TestReportTokenFromVMEnvironment(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	f := newFakeCachesync(t, engines(threeEndpoints...)...)
	cfg := pluginConfig(t, map[string]any{"cachesync": map[string]any{"cluster": "cachesync", "report_token_env": "KVROUTE_REPORT_TOKEN"}})
	clusters := map[string]func(*wasmhost.Callout) wasmhost.CalloutResponse{"cachesync": f.serve}
	if _, err := h.NewVM(context.Background(), wasmhost.VMConfig{VMID: "kvroute", PluginConfiguration: cfg, Clusters: clusters}); err == nil {
		t.Fatal("configuration accepted with the token's variable missing from the VM environment")
	}
	vm, err := h.NewVM(context.Background(), wasmhost.VMConfig{
		VMID: "kvroute", PluginConfiguration: cfg, AllowOnHeadersStopIteration: true, Clusters: clusters,
		Env: []string{"KVROUTE_REPORT_TOKEN=from-a-secret"},
	})
	if err != nil {
		t.Fatal(err)
	}
	syncVMs(vm)
	send(t, vm, postHeaders("/v1/chat/completions"), chatBody(t, "qwen", strings.Repeat("token ", 40)), 4096).Close()
	syncVMs(vm)
	if len(f.auth) == 0 || f.auth[0] != "Bearer from-a-secret" {
		t.Errorf("reports sent with authorization %q", f.auth)
	}
}

func TestInFlightLoadSpillsAndReleases(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	eps := engines(threeEndpoints...)
	f := newFakeCachesync(t, eps...)
	cfg := liveConfig(t, nil)
	vm := newLiveVM(t, h, f, cfg)
	body := chatBody(t, "qwen", strings.Repeat("hot prefix everybody shares ", 300), "q")
	warm := threeEndpoints[0]
	f.hold(warm, filterHashes(t, body))
	syncVMs(vm)

	// Each request to the warm endpoint adds uncached tokens and a running
	// request; cold ones would prefill the whole prompt. Once the warm
	// one's predicted latency passes theirs, the request spills.
	var open []*wasmhost.Stream
	spilled := ""
	for i := range 100 {
		b := chatBody(t, "qwen", strings.Repeat("hot prefix everybody shares ", 300), "q", strings.Repeat("new question "+strconv.Itoa(i)+" ", 20))
		s := send(t, vm, postHeaders("/v1/chat/completions"), b, 1<<20)
		open = append(open, s)
		if d := destination(t, s); d != warm {
			spilled = decisionOf(t, s)
			break
		}
	}
	if !strings.Contains(spilled, "reason=saturated-release") {
		t.Fatalf("the warm endpoint never released affinity under load (last decision %q)", spilled)
	}
	// Drain: first bytes and stream ends release the load; affinity returns.
	for _, s := range open {
		s.SendResponseHeaders([][2]string{{":status", "200"}}, false)
		s.SendResponseBody([]byte("data: x\n\n"), true)
		s.Close()
	}
	syncVMs(vm)
	s := send(t, vm, postHeaders("/v1/chat/completions"), body, 1<<20)
	if d := decisionOf(t, s); !strings.Contains(d, "endpoint="+warm) || !strings.Contains(d, "reason=affinity") {
		t.Errorf("after draining, decision %q; want affinity back to %s", d, warm)
	}
	s.Close()
}

func TestCachesyncFailuresNeverFailRequests(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	f := newFakeCachesync(t, engines(threeEndpoints...)...)
	vm := newLiveVM(t, h, f, liveConfig(t, nil))
	body := chatBody(t, "qwen", strings.Repeat("resilient ", 60))

	// No snapshot yet, cachesync down: rendezvous over the configured list.
	f.fail = true
	syncVMs(vm)
	s := send(t, vm, postHeaders("/v1/chat/completions"), body, 4096)
	if d := decisionOf(t, s); !strings.Contains(d, "reason=rendezvous") {
		t.Errorf("with cachesync down and no snapshot: %q, want rendezvous", d)
	}
	s.Close() // finished: no load of this gateway's own is left to price
	// A snapshot arrives, then cachesync breaks: corrupt bundles are
	// rejected and the last good snapshot keeps routing.
	f.fail = false
	syncVMs(vm)
	gen, _ := h.Metric("kvroute.snapshot.generation")
	f.hold(threeEndpoints[1], filterHashes(t, body))
	f.corrupt = true
	syncVMs(vm)
	if errs, _ := h.Metric("kvroute.sync.errors"); errs == 0 {
		t.Error("a corrupt bundle was not counted as a sync error")
	}
	if g, _ := h.Metric("kvroute.snapshot.generation"); g != gen {
		t.Errorf("generation moved from %d to %d on a corrupt bundle", gen, g)
	}
	s = send(t, vm, postHeaders("/v1/chat/completions"), body, 4096)
	if d := decisionOf(t, s); !strings.Contains(d, "reason=") || strings.Contains(d, "fallback=") {
		t.Errorf("with a corrupt bundle: %q, want a routed decision from the last good snapshot", d)
	}
	s.Close()
	f.corrupt = false
	syncVMs(vm)
	s = send(t, vm, postHeaders("/v1/chat/completions"), body, 4096)
	if got := destination(t, s); got != threeEndpoints[1] {
		t.Errorf("after recovery routed to %s, want %s", got, threeEndpoints[1])
	}
	if err := vm.Err(); err != nil {
		t.Fatal(err)
	}
}

func TestLocalModeLearnsAcrossVMs(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	cfg := pluginConfig(t, map[string]any{"debug_header": true, "sync_interval_ms": 100})
	vm1, vm2 := newVM(t, h, cfg), newVM(t, h, cfg)
	conversation := strings.Repeat("a long shared conversation so far ", 80)
	first := send(t, vm1, postHeaders("/v1/chat/completions"), chatBody(t, "qwen", conversation, "turn 1"), 4096)
	home := destination(t, first)
	first.Close()
	for range 3 {
		vm1.Tick()
		vm2.Tick()
	}
	// The other worker, which never saw the conversation, sends the next
	// turn to the same endpoint because the index says it holds the prefix.
	s := send(t, vm2, postHeaders("/v1/chat/completions"), chatBody(t, "qwen", conversation, "turn 1", "turn 2"), 4096)
	if d := decisionOf(t, s); !strings.Contains(d, "endpoint="+home) || !strings.Contains(d, "reason=affinity") {
		t.Errorf("second turn on another VM: %q, want affinity to %s", d, home)
	}
}

// TestPlacementSeenAcrossVMsBeforeTheSnapshot: a new prefix's first request
// is still prefilling, so no snapshot shows it anywhere; a second request
// sharing the prefix, on another worker VM, goes to the same endpoint
// instead of being placed as new and splitting the prefix over two caches.
func TestPlacementSeenAcrossVMsBeforeTheSnapshot(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	eps := engines(threeEndpoints...)
	for i := range eps {
		eps[i].IndexCapacity = 1_000
	}
	f := newFakeCachesync(t, eps...)
	cfg := liveConfig(t, nil)
	vm1, vm2 := newLiveVM(t, h, f, cfg), newLiveVM(t, h, f, cfg)
	syncVMs(vm1, vm2)
	system := strings.Repeat("a tenant's long system prompt ", 800)
	first := send(t, vm1, postHeaders("/v1/chat/completions"), chatBody(t, "qwen", system, "question one"), 1<<20)
	home := destination(t, first)
	if d := decisionOf(t, first); !strings.Contains(d, "reason=least-load") {
		t.Fatalf("first request: %q, want a least-load placement", d)
	}
	s := send(t, vm2, postHeaders("/v1/chat/completions"), chatBody(t, "qwen", system, "question two"), 1<<20)
	d := decisionOf(t, s)
	if !strings.Contains(d, "endpoint="+home) || !strings.Contains(d, "reason=affinity") {
		t.Errorf("second request on another VM: %q, want affinity to %s", d, home)
	}
	// The header shows what placement weighs: the prefix placed there,
	// and the cache's fill with its pending blocks (375 of 1,000).
	if got, want := field(d, "prefixes")+" "+field(d, "fill_pct"), "1 38"; got != want {
		t.Errorf("second request's prefixes and fill_pct %q, want %q (%s)", got, want, d)
	}
	s.Close()
	first.Close()
}

// TestDecodeSaturationInTheHeader: an engine whose batch the snapshot shows
// decoding more than 1.3 times slower than the pool's fastest is marked
// saturated by its decode load, at once while no group is being moved and
// once the load has lasted while one is; the request goes elsewhere, and
// the debug header says so; an idle pool marks none.
func TestDecodeSaturationInTheHeader(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	eps := engines(threeEndpoints...)
	f := newFakeCachesync(t, eps...)
	vm := newLiveVM(t, h, f, liveConfig(t, nil))
	syncVMs(vm)
	ask := func(q string) string {
		s := send(t, vm, postHeaders("/v1/chat/completions"), chatBody(t, "qwen", q), 1<<20)
		defer s.Close()
		return decisionOf(t, s)
	}
	if d := ask("an idle pool"); field(d, "decode_saturated_endpoints") != "0" || field(d, "decode_saturated") != "0" {
		t.Errorf("idle pool: %q, want no endpoint saturated", d)
	}
	busy := eps[1]
	busy.Running = 40 // ITL 23 ms at the default model against 10 ms idle
	f.setEndpoint(busy)
	syncVMs(vm)
	d := ask("a busy engine")
	if field(d, "decode_saturated_endpoints") != "1" {
		t.Errorf("one engine decoding 40 requests: %q, want decode_saturated_endpoints=1", d)
	}
	if field(d, "endpoint") == busy.Addr || field(d, "decode_saturated") != "0" {
		t.Errorf("one engine decoding 40 requests: %q, want another, not saturated, chosen", d)
	}

	// While another group is pinned (the planner is moving groups), a
	// fresh load must last a turnover first: the filter's clock, fed by
	// each request's time.
	busy.Running = 0
	f.setEndpoint(busy)
	moving, loaded := eps[0], eps[2]
	moving.Pins = []uint64{0x5eed}
	loaded.Running = 40
	f.setEndpoint(moving)
	f.setEndpoint(loaded)
	syncVMs(vm)
	if d := ask("another busy engine, just now"); field(d, "decode_saturated_endpoints") != "0" {
		t.Errorf("groups moving, one engine decoding 40 requests for a moment: %q, want none saturated yet", d)
	}
	// Asked twice a second, as traffic would: a load seen only once a
	// turnover has not been seen to last.
	d = ask("another busy engine")
	for deadline := time.Now().Add(15 * time.Second); field(d, "decode_saturated_endpoints") != "1" && time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
		d = ask("another busy engine")
	}
	if field(d, "decode_saturated_endpoints") != "1" || field(d, "endpoint") == loaded.Addr {
		t.Errorf("groups moving, one engine decoding 40 requests for 15 s: %q, want it saturated and passed over", d)
	}
}

// TestCacheSaltIsolatesTenants: a request with vLLM's cache_salt matches
// only blocks cached under the same salt, as in the engine: one tenant's
// prefix never draws another tenant's request, nor an unsalted one.
func TestCacheSaltIsolatesTenants(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	eps := engines(threeEndpoints...)
	f := newFakeCachesync(t, eps...)
	vm := newLiveVM(t, h, f, liveConfig(t, nil))
	plain := chatBody(t, "qwen", strings.Repeat("a prefix both tenants send ", 100), "q")
	salted := func(salt string) []byte { return append([]byte(`{"cache_salt":"`+salt+`",`), plain[1:]...) }
	p, err := prompt.Render(nil, plain, prompt.ChatML)
	if err != nil {
		t.Fatal(err)
	}
	hashesOf := func(salt string) []uint64 {
		return blockhash.Append(nil, blockhash.Salted(blockhash.Seed(p.Model, ""), salt), p.Text, blockhash.Config{})
	}
	f.hold(threeEndpoints[0], hashesOf(""))
	f.hold(threeEndpoints[1], hashesOf("tenant-a"))
	syncVMs(vm)
	for _, tc := range []struct {
		name   string
		body   []byte
		want   string // endpoint, "" for any placement by load
		reason string
	}{
		{"unsalted: the unsalted copy", plain, threeEndpoints[0], "reason=affinity"},
		{"tenant a: its own copy", salted("tenant-a"), threeEndpoints[1], "reason=affinity"},
		{"tenant b: nobody's copy is its", salted("tenant-b"), "", "reason=least-load"},
	} {
		s := send(t, vm, postHeaders("/v1/chat/completions"), tc.body, 1<<20)
		d := decisionOf(t, s)
		if !strings.Contains(d, tc.reason) || (tc.want != "" && !strings.Contains(d, "endpoint="+tc.want+";")) {
			t.Errorf("%s: %q, want %s %s", tc.name, d, tc.reason, tc.want)
		}
		s.Close()
	}
}

// TestEndpointPickerHeaders: the destination header is the Endpoint Picker
// Protocol's ordered list, the choice then the runner-up (where a retry
// goes); the response names the endpoint that served; and with
// failure_mode closed a request no endpoint can take gets a 503 instead of
// Envoy's own balancing.
func TestEndpointPickerHeaders(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	f := newFakeCachesync(t, engines(threeEndpoints...)...)
	vm := newLiveVM(t, h, f, liveConfig(t, nil))
	syncVMs(vm)
	s := send(t, vm, postHeaders("/v1/chat/completions"), chatBody(t, "qwen", strings.Repeat("pick me ", 100)), 1<<20)
	list, _ := s.Upstream.Header(destHeader)
	d := decisionOf(t, s)
	chosen, runner := field(d, "endpoint"), field(d, "runner_up")
	if list != chosen+","+runner || runner == "" {
		t.Errorf("destination %q, want the choice then the runner-up of %q", list, d)
	}
	if served, _ := s.Downstream.Header("x-gateway-destination-endpoint-served"); served != chosen {
		t.Errorf("served header %q, want %s", served, chosen)
	}
	s.Close()

	for _, tc := range []struct {
		mode   string
		status string // "" when the request goes on unrouted
	}{{"open", ""}, {"closed", "503"}} {
		f := newFakeCachesync(t, engines(threeEndpoints...)...)
		f.fail = true // no snapshot ever arrives
		cfg := liveConfig(t, map[string]any{"failure_mode": tc.mode, "endpoints": []string{}})
		// A host of its own: the first one's shared data holds a snapshot.
		vm := newLiveVM(t, newHost(t, wasmhost.Fixed), f, cfg)
		syncVMs(vm)
		s := send(t, vm, postHeaders("/v1/chat/completions"), chatBody(t, "qwen", "hello"), 4096)
		status := ""
		if s.Local != nil {
			status = strconv.Itoa(int(s.Local.Status))
		}
		if dest, _ := s.Upstream.Header(destHeader); status != tc.status || dest != "" {
			t.Errorf("failure_mode %s with no endpoint: status %q, destination %q; want status %q", tc.mode, status, dest, tc.status)
		}
		s.Close()
	}
}

// field returns the value of key in a decision header.
func field(decision, key string) string {
	for kv := range strings.SplitSeq(decision, "; ") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// TestSubsetHeader: with trust_subset_header, a subset a filter in front
// names bounds the choice, even away from the endpoint holding the prefix;
// without it the header is removed unread, since it would let a client
// choose its upstream.
func TestSubsetHeader(t *testing.T) {
	body := chatBody(t, "qwen", strings.Repeat("a prefix one endpoint holds ", 100))
	for _, trusted := range []bool{true, false} {
		h := newHost(t, wasmhost.Fixed)
		f := newFakeCachesync(t, engines(threeEndpoints...)...)
		f.hold(threeEndpoints[0], filterHashes(t, body))
		vm := newLiveVM(t, h, f, liveConfig(t, map[string]any{"trust_subset_header": trusted}))
		syncVMs(vm)
		headers := append(postHeaders("/v1/chat/completions"), [2]string{"x-gateway-destination-endpoint-subset", threeEndpoints[2] + ", not-an-address"})
		s := send(t, vm, headers, body, 1<<20)
		want := threeEndpoints[0] // the holder, by affinity
		if trusted {
			want = threeEndpoints[2]
		}
		if got := destination(t, s); got != want {
			t.Errorf("trusted %v: routed to %s, want %s (%s)", trusted, got, want, decisionOf(t, s))
		}
		if v, ok := s.Upstream.Header("x-gateway-destination-endpoint-subset"); ok {
			t.Errorf("trusted %v: the subset header %q went upstream", trusted, v)
		}
		s.Close()
	}
}

// TestSessionHeader: with session_header, a session's next request goes
// where its last one went, on any worker, even when its prompt shares
// nothing with the last one (what the prefix index cannot see), until that
// endpoint's load prices it out; then the pin follows it.
func TestSessionHeader(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	eps := engines(threeEndpoints...)
	f := newFakeCachesync(t, eps...)
	cfg := liveConfig(t, map[string]any{"session_header": "X-Session-ID"})
	vm1, vm2 := newLiveVM(t, h, f, cfg), newLiveVM(t, h, f, cfg)
	syncVMs(vm1, vm2)
	session := func(id string) [][2]string {
		return append(postHeaders("/v1/chat/completions"), [2]string{"x-session-id", id})
	}
	turn := func(i int) []byte {
		return chatBody(t, "qwen", strings.Repeat("turn "+strconv.Itoa(i)+" of a chat whose history the engine keeps ", 40))
	}
	first := send(t, vm1, session("s-1"), turn(1), 1<<20)
	home := destination(t, first)
	first.Close()
	for i := range 5 {
		s := send(t, []*wasmhost.VM{vm1, vm2}[i%2], session("s-1"), turn(i+2), 1<<20)
		if d := decisionOf(t, s); !strings.Contains(d, "endpoint="+home+";") || !strings.Contains(d, "reason=affinity") {
			t.Fatalf("turn %d: %q, want affinity to the session's %s", i+2, d, home)
		}
		s.Close()
	}
	// Other sessions are not pinned there.
	seen := map[string]bool{}
	for i := range 12 {
		s := send(t, vm1, session("other-"+strconv.Itoa(i)), turn(100+i), 1<<20)
		seen[destination(t, s)] = true
		s.Close()
	}
	if len(seen) < 2 {
		t.Errorf("12 other sessions all went to %v", seen)
	}
	// Saturated: the pinned endpoint's backlog outprices a cold prefill.
	for _, e := range eps {
		if e.Addr == home {
			e.PrefillTokens = 50 * 10000 // 50 s at the test engines' rate
			f.setEndpoint(e)
		}
	}
	syncVMs(vm1, vm2)
	s := send(t, vm2, session("s-1"), turn(50), 1<<20)
	moved := destination(t, s)
	if d := decisionOf(t, s); moved == home || !strings.Contains(d, "reason=saturated-release") {
		t.Fatalf("saturated: %q, want a release away from %s", d, home)
	}
	s.Close()
	s = send(t, vm1, session("s-1"), turn(51), 1<<20)
	if got := destination(t, s); got != moved {
		t.Errorf("after the release the session went to %s, want its new home %s", got, moved)
	}
	s.Close()
}

// TestShedding: with shed on, a request marked sheddable that no endpoint
// is predicted to serve within its SLO gets 429 with retry-after, and goes
// nowhere; one that is not sheddable, or has an SLO an endpoint meets, is
// routed. Shedding is off by default.
func TestShedding(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	f := newFakeCachesync(t, engines(threeEndpoints...)...)
	on := newLiveVM(t, h, f, liveConfig(t, map[string]any{"policy": map[string]any{"shed": true}}))
	off := newLiveVM(t, h, f, liveConfig(t, nil))
	syncVMs(on, off)
	body := chatBody(t, "qwen", strings.Repeat("a question that takes a while ", 200))
	for _, tc := range []struct {
		name    string
		vm      *wasmhost.VM
		headers [][2]string
		shed    bool
	}{
		// No engine answers within a millisecond: one step alone is 10.
		{"sheddable, SLO none can meet", on, [][2]string{{"x-kvroute-slo-ttft-ms", "1"}, {"x-kvroute-sheddable", "true"}}, true},
		{"not sheddable", on, [][2]string{{"x-kvroute-slo-ttft-ms", "1"}}, false},
		{"sheddable, SLO met", on, [][2]string{{"x-kvroute-slo-ttft-ms", "10000"}, {"x-kvroute-sheddable", "true"}}, false},
		{"shedding off", off, [][2]string{{"x-kvroute-slo-ttft-ms", "1"}, {"x-kvroute-sheddable", "true"}}, false},
	} {
		s := send(t, tc.vm, postHeaders("/v1/chat/completions", tc.headers...), body, 1<<20)
		dest, _ := s.Upstream.Header(destHeader)
		if tc.shed {
			retry := ""
			if s.Local != nil {
				for _, kv := range s.Local.Headers {
					if kv[0] == "retry-after" {
						retry = kv[1]
					}
				}
			}
			if s.Local == nil || s.Local.Status != 429 || retry != "1" || dest != "" {
				t.Errorf("%s: local reply %+v, destination %q; want 429 with retry-after 1, routed nowhere", tc.name, s.Local, dest)
			}
		} else if s.Local != nil || dest == "" {
			t.Errorf("%s: local reply %+v, destination %q; want routed", tc.name, s.Local, dest)
		}
		s.Close()
	}
}
