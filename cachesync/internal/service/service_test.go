package service

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/cachesync/internal/index"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/report"
	"github.com/kvroute/kvroute/shared/snapshot"
	"github.com/kvroute/kvroute/shared/syncapi"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

const token = "s3cret-token"

type fixture struct {
	ix  *index.Index
	srv *Server
	ts  *httptest.Server
	// auth is the Authorization header pair a gateway sends, if the
	// server has tokens.
	auth []string
}

func newFixture(t *testing.T, cfg Config, icfg index.Config) *fixture {
	t.Helper()
	reg := prometheus.NewRegistry()
	icfg.Registerer, icfg.Logger = reg, quiet
	ix, err := index.New(icfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Index, cfg.Registry, cfg.Logger = ix, reg, quiet
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	f := &fixture{ix: ix, srv: srv, ts: ts}
	if len(cfg.Tokens) > 0 {
		f.auth = []string{"Authorization", "Bearer " + cfg.Tokens[0]}
	}
	return f
}

func addr(i int) string { return "10.0.0." + strconv.Itoa(i) + ":8000" }

func (f *fixture) endpoints(t *testing.T, n int, mode index.Mode) {
	t.Helper()
	for i := range n {
		if err := f.ix.SetEndpoint(snapshot.EndpointInfo{Addr: addr(i), Models: []string{"m"}, Health: snapshot.HealthHealthy}); err != nil {
			t.Fatal(err)
		}
		if err := f.ix.SetMode(addr(i), mode); err != nil {
			t.Fatal(err)
		}
	}
}

func (f *fixture) do(t *testing.T, method, path string, body []byte, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, f.ts.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := f.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func TestSnapshotETag(t *testing.T) {
	f := newFixture(t, Config{}, index.Config{})
	if resp, _ := f.do(t, "GET", "/v1/snapshot", nil); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("before the first build: %s, want 503 with Retry-After", resp.Status)
	}
	f.endpoints(t, 1, index.Precise)
	im := f.ix.Publish()
	etag := `"` + strconv.FormatUint(im.Generation(), 10) + `"`

	resp, body := f.do(t, "GET", "/v1/snapshot", nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("ETag") != etag || resp.Header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("GET: %s ETag %q type %q", resp.Status, resp.Header.Get("ETag"), resp.Header.Get("Content-Type"))
	}
	bd, err := snapshot.ParseBundle(body)
	if err != nil || bd.Since() != 0 || bd.Manifest().Generation() != im.Generation() || bd.Manifest().Endpoint(0).Addr() != addr(0) {
		t.Fatalf("bundle: %v", err)
	}

	for _, tc := range []struct {
		inm  string
		want int
	}{
		{etag, http.StatusNotModified},
		{"W/" + etag, http.StatusNotModified},
		{`"1", ` + etag, http.StatusNotModified},
		{"*", http.StatusNotModified},
		{`"1"`, http.StatusOK},
		{strings.Trim(etag, `"`), http.StatusOK}, // unquoted is not an entity tag
	} {
		resp, body := f.do(t, "GET", "/v1/snapshot?since=5", nil, "If-None-Match", tc.inm)
		if resp.StatusCode != tc.want {
			t.Errorf("If-None-Match %s: %s, want %d", tc.inm, resp.Status, tc.want)
		}
		if tc.want == http.StatusNotModified && (len(body) != 0 || resp.Header.Get("ETag") != etag) {
			t.Errorf("If-None-Match %s: 304 with %d bytes, ETag %q", tc.inm, len(body), resp.Header.Get("ETag"))
		}
	}

	// A new generation no longer matches the old tag.
	sink, _ := f.ix.Sink(addr(0))
	sink.Add(12345, snapshot.TierGPU)
	f.ix.Publish()
	if resp, _ := f.do(t, "GET", "/v1/snapshot", nil, "If-None-Match", etag); resp.StatusCode != http.StatusOK {
		t.Fatalf("after a rebuild: %s", resp.Status)
	}
	for _, bad := range []string{"since=x", "since=-1", "since=1e3"} {
		if resp, _ := f.do(t, "GET", "/v1/snapshot?"+bad, nil); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %s, want 400", bad, resp.Status)
		}
	}
	if resp, _ := f.do(t, "POST", "/v1/snapshot", nil); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /v1/snapshot: %s", resp.Status)
	}
}

// fetcher does what the filter's fetcher does: ask for what changed since
// the generation it holds, check the bundle completes it, store the parts
// with the manifest last.
type fetcher struct {
	keys *snapshot.Keys
	kv   map[string][]byte
	held *snapshot.Manifest
}

func newFetcher() *fetcher {
	return &fetcher{keys: snapshot.NewKeys("kvroute/"), kv: map[string][]byte{}}
}

func (fe *fetcher) fetch(t *testing.T, f *fixture) (size int, since uint64) {
	t.Helper()
	path := "/v1/snapshot"
	if fe.held != nil {
		path += "?since=" + strconv.FormatUint(fe.held.Generation(), 10)
	}
	resp, body := f.do(t, "GET", path, nil, f.auth...)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", path, resp.Status)
	}
	bd, err := snapshot.ParseBundle(body)
	if err != nil {
		t.Fatal(err)
	}
	if err := bd.Complete(fe.held); err != nil {
		t.Fatalf("bundle since %d does not complete the held generation: %v", bd.Since(), err)
	}
	for _, p := range bd.Parts() {
		fe.kv[fe.keys.Part(p)] = p.Data
	}
	fe.kv[fe.keys.Head()] = bd.Manifest().AppendHead(nil)
	fe.held = bd.Manifest()
	return len(body), bd.Since()
}

func (fe *fetcher) view(t *testing.T) *snapshot.View {
	t.Helper()
	v := snapshot.NewView(fe.keys)
	if _, err := v.Refresh(func(k string) ([]byte, error) {
		b, ok := fe.kv[k]
		if !ok {
			return nil, errors.New("missing " + k)
		}
		return b, nil
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestDeltas applies a sequence of since-bundles and checks that what the
// fetcher reassembles equals a fresh full fetch, generation after
// generation, and that a delta is smaller than the whole.
func TestDeltas(t *testing.T) {
	f := newFixture(t, Config{}, index.Config{Snapshot: snapshot.BuilderConfig{ShardBits: 4}})
	const eps = 8
	f.endpoints(t, eps, index.Precise)
	sinks := make([]interface {
		Add(uint64, snapshot.Tier)
		Remove(uint64, snapshot.Tier)
		Clear()
	}, eps)
	for i := range sinks {
		s, err := f.ix.Sink(addr(i))
		if err != nil {
			t.Fatal(err)
		}
		sinks[i] = s
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var known []uint64
	for range 20000 {
		h := rng.Uint64()
		known = append(known, h)
		sinks[rng.IntN(eps)].Add(h, snapshot.Tier(rng.IntN(2)))
	}
	f.ix.Publish()
	incr := newFetcher()
	if _, since := incr.fetch(t, f); since != 0 {
		t.Fatalf("first fetch since %d", since)
	}
	deltas := 0
	for step := range 12 {
		for range 200 {
			switch s := sinks[rng.IntN(eps)]; rng.IntN(3) {
			case 0:
				h := rng.Uint64()
				known = append(known, h)
				s.Add(h, snapshot.TierGPU)
			default:
				s.Remove(known[rng.IntN(len(known))], snapshot.Tier(rng.IntN(2)))
			}
		}
		if step == 6 {
			sinks[3].Clear()
		}
		if step%4 == 3 {
			_ = f.ix.SetEndpoint(snapshot.EndpointInfo{Addr: addr(1), Health: snapshot.HealthHealthy, Running: step})
		}
		f.ix.Publish()
		size, since := incr.fetch(t, f)
		full := newFetcher()
		fullSize, _ := full.fetch(t, f)
		if since != 0 {
			deltas++
			if size >= fullSize {
				t.Fatalf("step %d: delta bundle %d bytes, full %d", step, size, fullSize)
			}
		}
		a, b := incr.view(t), full.view(t)
		if a.Manifest().Generation() != b.Manifest().Generation() {
			t.Fatalf("step %d: generations %d and %d", step, a.Manifest().Generation(), b.Manifest().Generation())
		}
		for _, h := range known {
			if x, y := a.Lookup(h), b.Lookup(h); !x.Equal(y) {
				t.Fatalf("step %d: hash %#x: incremental has %d holders, full fetch %d", step, h, x.Len(), y.Len())
			}
		}
		if a.Manifest().Endpoint(1).Running() != b.Manifest().Endpoint(1).Running() {
			t.Fatalf("step %d: endpoint table differs", step)
		}
	}
	if deltas == 0 {
		t.Fatal("no fetch was served as a delta")
	}

	// A fetcher that holds the current generation but did not say so
	// with If-None-Match gets the manifest alone.
	gen := incr.held.Generation()
	resp, body := f.do(t, "GET", "/v1/snapshot?since="+strconv.FormatUint(gen, 10), nil)
	if bd, err := snapshot.ParseBundle(body); resp.StatusCode != http.StatusOK || err != nil || len(bd.Parts()) != 1 || bd.Complete(incr.held) != nil {
		t.Fatalf("since the current generation: %s, %v", resp.Status, err)
	}

	// A fetcher holding a generation from another cachesync (in the
	// future) gets everything.
	resp, body = f.do(t, "GET", "/v1/snapshot?since=18446744073709551615", nil)
	if bd, err := snapshot.ParseBundle(body); resp.StatusCode != http.StatusOK || err != nil || bd.Since() != 0 {
		t.Fatalf("future since: %s, %v", resp.Status, err)
	}
}

func TestBundleCache(t *testing.T) {
	f := newFixture(t, Config{}, index.Config{})
	f.endpoints(t, 1, index.Precise)
	im := f.ix.Publish()
	var bodies [][]byte
	for range 3 {
		_, b := f.do(t, "GET", "/v1/snapshot?since=1", nil)
		bodies = append(bodies, b)
	}
	if !bytes.Equal(bodies[0], bodies[1]) || !bytes.Equal(bodies[0], bodies[2]) {
		t.Fatal("the same request gave different bundles")
	}
	// Many distinct since values: served, not all kept.
	for i := range 3 * maxCachedBundles {
		resp, b := f.do(t, "GET", "/v1/snapshot?since="+strconv.Itoa(i+2), nil)
		if resp.StatusCode != http.StatusOK || !bytes.Equal(b, im.AppendBundle(nil, uint64(i+2))) {
			t.Fatalf("since=%d: %s", i+2, resp.Status)
		}
	}
	f.srv.cache.mu.Lock()
	n, gen := len(f.srv.cache.bundles), f.srv.cache.gen
	f.srv.cache.mu.Unlock()
	if n > maxCachedBundles || gen != im.Generation() {
		t.Fatalf("cache holds %d bundles of generation %d", n, gen)
	}
	// A new generation replaces the cache.
	sink, _ := f.ix.Sink(addr(0))
	sink.Add(1, snapshot.TierGPU)
	im = f.ix.Publish()
	if _, b := f.do(t, "GET", "/v1/snapshot?since=1", nil); !bytes.Equal(b, im.AppendBundle(nil, 1)) {
		t.Fatal("stale bundle served after a rebuild")
	}
}

func batchBytes(t *testing.T, recs ...report.Record) []byte {
	t.Helper()
	var w report.Writer
	for i := range recs {
		if err := w.Add(&recs[i]); err != nil {
			t.Fatal(err)
		}
	}
	return bytes.Clone(w.Bytes())
}

func holds(t *testing.T, f *fixture, slot int, hs []uint64) bool {
	t.Helper()
	fe := newFetcher()
	f.ix.Publish()
	fe.fetch(t, f)
	v := fe.view(t)
	for _, h := range hs {
		found := false
		l := v.Lookup(h)
		for i := range l.Len() {
			found = found || l.At(i).Endpoint() == slot
		}
		if !found {
			return false
		}
	}
	return true
}

func TestReports(t *testing.T) {
	f := newFixture(t, Config{Tokens: []string{token}, MaxReportBytes: 4096, ReportLimits: report.Limits{MaxRecords: 4, MaxHashes: 100}}, index.Config{})
	f.endpoints(t, 2, index.Approximate)
	hs := []uint64{0x1111111111111111, 0x2222222222222222, 0x3333333333333333}
	good := batchBytes(t, report.Record{Endpoint: addr(1), Model: "m", Hashes: hs, Cached: 1})
	auth := "Bearer " + token
	corrupt := bytes.Clone(good)
	corrupt[len(corrupt)/2] ^= 0x40
	var recs []report.Record
	for range 5 {
		recs = append(recs, report.Record{Endpoint: addr(0), Hashes: hs})
	}
	tooMany := batchBytes(t, recs...)
	for _, tc := range []struct {
		name   string
		method string
		body   []byte
		header []string
		want   int
	}{
		{"no token", "POST", good, nil, http.StatusUnauthorized},
		{"wrong token", "POST", good, []string{"Authorization", "Bearer nope"}, http.StatusUnauthorized},
		{"token prefix", "POST", good, []string{"Authorization", "Bearer " + token[:5]}, http.StatusUnauthorized},
		{"basic scheme", "POST", good, []string{"Authorization", "Basic " + token}, http.StatusUnauthorized},
		{"corrupt", "POST", corrupt, []string{"Authorization", auth}, http.StatusBadRequest},
		{"truncated", "POST", good[:len(good)-9], []string{"Authorization", auth}, http.StatusBadRequest},
		{"empty", "POST", nil, []string{"Authorization", auth}, http.StatusBadRequest},
		{"not a batch", "POST", []byte(`{"endpoint":"10.0.0.1:8000"}`), []string{"Authorization", auth}, http.StatusBadRequest},
		{"too many records", "POST", tooMany, []string{"Authorization", auth}, http.StatusRequestEntityTooLarge},
		{"too large", "POST", make([]byte, 5000), []string{"Authorization", auth}, http.StatusRequestEntityTooLarge},
		{"GET", "GET", nil, []string{"Authorization", auth}, http.StatusMethodNotAllowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, _ := f.do(t, tc.method, "/v1/reports", tc.body, tc.header...)
			if resp.StatusCode != tc.want {
				t.Fatalf("%s, want %d", resp.Status, tc.want)
			}
			if tc.want == http.StatusUnauthorized && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Fatal("401 without a Bearer challenge")
			}
		})
	}
	if holds(t, f, 0, hs[:1]) || holds(t, f, 1, hs[:1]) {
		t.Fatal("a refused report reached the index")
	}
	if resp, _ := f.do(t, "POST", "/v1/reports", good, "Authorization", "bearer "+token); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("good report: %s", resp.Status)
	}
	if !holds(t, f, 1, hs) {
		t.Fatal("an accepted report did not reach the snapshot")
	}

	// Chunked, without Content-Length, over the limit.
	req, _ := http.NewRequest("POST", f.ts.URL+"/v1/reports", io.MultiReader(bytes.NewReader(make([]byte, 3000)), bytes.NewReader(make([]byte, 3000))))
	req.Header.Set("Authorization", auth)
	resp, err := f.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked over the limit: %s", resp.Status)
	}

	_, metrics := f.do(t, "GET", "/metrics", nil)
	for _, want := range []string{
		`kvroute_cachesync_report_rejects_total{reason="unauthorized"} 4`,
		`kvroute_cachesync_report_rejects_total{reason="corrupt"} 4`,
		`kvroute_cachesync_report_rejects_total{reason="over_limit"} 1`,
		`kvroute_cachesync_report_rejects_total{reason="too_large"} 2`,
		`kvroute_cachesync_report_batches_total 1`,
		`kvroute_cachesync_report_records_total{outcome="applied"} 1`,
		`kvroute_cachesync_report_hashes_total 3`,
	} {
		if !strings.Contains(string(metrics), want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestReportsDisabled(t *testing.T) {
	f := newFixture(t, Config{}, index.Config{})
	f.endpoints(t, 1, index.Approximate)
	hs := []uint64{0x4444444444444444}
	body := batchBytes(t, report.Record{Endpoint: addr(0), Hashes: hs})
	for _, h := range [][]string{nil, {"Authorization", "Bearer "}, {"Authorization", "Bearer anything"}} {
		if resp, _ := f.do(t, "POST", "/v1/reports", body, h...); resp.StatusCode != http.StatusForbidden {
			t.Fatalf("reports with no token configured: %s, want 403", resp.Status)
		}
	}
	if holds(t, f, 0, hs) {
		t.Fatal("a report reached the index with reports disabled")
	}
}

func TestReadiness(t *testing.T) {
	discovered := make(chan struct{})
	f := newFixture(t, Config{Discovered: discovered}, index.Config{})
	check := func(path string, want int) {
		t.Helper()
		if resp, _ := f.do(t, "GET", path, nil); resp.StatusCode != want {
			t.Fatalf("%s: %s, want %d", path, resp.Status, want)
		}
	}
	check("/healthz", http.StatusOK)
	check("/readyz", http.StatusServiceUnavailable)
	f.ix.Publish()
	check("/readyz", http.StatusServiceUnavailable) // discovery has not run
	close(discovered)
	check("/readyz", http.StatusOK)

	n := newFixture(t, Config{Notes: func() []string { return []string{"engine 10.0.0.1:8000 is routed approximately"} }}, index.Config{})
	n.ix.Publish()
	if resp, body := n.do(t, "GET", "/readyz", nil); resp.StatusCode != http.StatusOK || string(body) != "ready\nengine 10.0.0.1:8000 is routed approximately\n" {
		t.Fatalf("readyz with notes: %s %q", resp.Status, body)
	}

	g := newFixture(t, Config{}, index.Config{})
	if resp, _ := g.do(t, "GET", "/readyz", nil); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("ready before the first snapshot: %s", resp.Status)
	}
}

func TestOwnRegistry(t *testing.T) {
	ix, _ := index.New(index.Config{Logger: quiet})
	s, err := New(Config{Index: ix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	resp, err := ts.Client().Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "go_goroutines") || !strings.Contains(string(b), "kvroute_cachesync_snapshot_sent_bytes_total") {
		t.Fatal("a server's own registry lacks the runtime or its own metrics")
	}
	if s.Registry() == nil {
		t.Fatal("no registry")
	}
	if _, err := New(Config{}); err == nil {
		t.Fatal("New without an index succeeded")
	}
}

func TestServeShutdown(t *testing.T) {
	ix, _ := index.New(index.Config{Logger: quiet})
	s, err := New(Config{Index: ix, Logger: quiet, ShutdownGrace: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	url := "http://" + ln.Addr().String()
	resp, err := http.Get(url + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz: %v", err)
	}
	resp.Body.Close()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
	if _, err := http.Get(url + "/healthz"); err == nil {
		t.Fatal("still serving after shutdown")
	}
}

// TestTokens: with tokens the snapshot needs one too (its hashes would
// tell a stranger which prompts were sent lately); several are accepted at
// once, so gateways move to a new token before the old one is dropped.
func TestTokens(t *testing.T) {
	f := newFixture(t, Config{Tokens: []string{"old"}}, index.Config{})
	f.endpoints(t, 1, index.Approximate)
	f.ix.Publish()
	snap := func(tok string) int {
		var h []string
		if tok != "" {
			h = []string{"Authorization", "Bearer " + tok}
		}
		resp, _ := f.do(t, "GET", "/v1/snapshot", nil, h...)
		if resp.StatusCode == http.StatusUnauthorized && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Error("401 without a Bearer challenge")
		}
		return resp.StatusCode
	}
	report := func(tok string) int {
		body := batchBytes(t, report.Record{Endpoint: addr(0), Model: "m", Hashes: []uint64{1}})
		resp, _ := f.do(t, "POST", "/v1/reports", body, "Authorization", "Bearer "+tok)
		return resp.StatusCode
	}
	steps := []struct {
		name           string
		tokens         []string
		tok            string
		snap, reported int
	}{
		{"no token", []string{"old"}, "", http.StatusUnauthorized, http.StatusUnauthorized},
		{"wrong token", []string{"old"}, "guess", http.StatusUnauthorized, http.StatusUnauthorized},
		{"the token", []string{"old"}, "old", http.StatusOK, http.StatusAccepted},
		{"rotating: the old one still works", []string{"old", "new"}, "old", http.StatusOK, http.StatusAccepted},
		{"rotating: so does the new one", []string{"old", "new"}, "new", http.StatusOK, http.StatusAccepted},
		{"rotated: the old one is refused", []string{"new"}, "old", http.StatusUnauthorized, http.StatusUnauthorized},
		{"no tokens: reports off, the snapshot open", nil, "", http.StatusOK, http.StatusForbidden},
	}
	for _, st := range steps {
		f.srv.SetTokens(st.tokens...)
		if got := snap(st.tok); got != st.snap {
			t.Errorf("%s: snapshot %d, want %d", st.name, got, st.snap)
		}
		if got := report(st.tok); got != st.reported {
			t.Errorf("%s: report %d, want %d", st.name, got, st.reported)
		}
	}
	if _, m := f.do(t, "GET", "/metrics", nil); !strings.Contains(string(m), `kvroute_cachesync_snapshot_requests_total{result="unauthorized"} 3`) {
		t.Error("refused snapshot requests are not counted as unauthorized")
	}
}

// TestGatewayTemplates: the templates gateways name when they fetch are
// remembered for the checks of engines' templates, but only from
// authorised fetches and only names kvroute renders.
func TestGatewayTemplates(t *testing.T) {
	f := newFixture(t, Config{Tokens: []string{"tok"}}, index.Config{})
	f.ix.Publish()
	for _, q := range []struct {
		path string
		auth []string
	}{
		{"/v1/snapshot?since=0&template=llama3", []string{"Authorization", "Bearer tok"}},
		{"/v1/snapshot?since=0&template=gemma", nil},                                                // refused: no token
		{"/v1/snapshot?since=0&template=no-such-template", []string{"Authorization", "Bearer tok"}}, // unknown
		{"/v1/snapshot?since=0&template=chatml", []string{"Authorization", "Bearer tok"}},
		{"/v1/snapshot?since=0&template=chatml", []string{"Authorization", "Bearer tok"}},
		{"/v1/snapshot?since=0&template=auto", nil}, // refused: no token
	} {
		f.do(t, "GET", q.path, nil, q.auth...)
	}
	got, auto := f.srv.GatewayTemplates(time.Minute)
	if want := []prompt.Template{prompt.ChatML, prompt.Llama3}; !slices.Equal(got, want) || auto {
		t.Errorf("GatewayTemplates = %v, %v; want %v, false", got, auto, want)
	}
	f.do(t, "GET", "/v1/snapshot?since=0&template=auto", nil, "Authorization", "Bearer tok")
	if _, auto := f.srv.GatewayTemplates(time.Minute); !auto {
		t.Error("a gateway named auto, GatewayTemplates says none did")
	}
	if got, auto := f.srv.GatewayTemplates(0); len(got) != 0 || auto {
		t.Errorf("GatewayTemplates(0) = %v, %v; want none", got, auto)
	}
}

// A gateway on chat_template custom is checked against a custom template
// only when it names one cachesync holds (GatewayCustom says which);
// another is remembered as unknown, and the bare name "custom" is no
// template at all.
func TestGatewayCustomTemplate(t *testing.T) {
	const held, other = prompt.CustomPrefix + "00000000000000aa", prompt.CustomPrefix + "00000000000000cc"
	f := newFixture(t, Config{Tokens: []string{"tok"}, CustomTemplates: []string{other, held}}, index.Config{})
	f.ix.Publish()
	for _, name := range []string{prompt.CustomPrefix + "00000000000000bb", "custom", held} {
		f.do(t, "GET", "/v1/snapshot?since=0&template="+name, nil, "Authorization", "Bearer tok")
	}
	if got, _ := f.srv.GatewayTemplates(time.Minute); !slices.Equal(got, []prompt.Template{prompt.Custom}) {
		t.Errorf("GatewayTemplates = %v, want [custom]", got)
	}
	if got := f.srv.UnknownCustom(); got != prompt.CustomPrefix+"00000000000000bb" {
		t.Errorf("UnknownCustom = %q", got)
	}
	if got := f.srv.GatewayCustom(); got != held {
		t.Errorf("GatewayCustom = %q, want %q", got, held)
	}
}

// TestEpochs: a since from another cachesync's history (a replica, or this
// process's predecessor) gets a whole snapshot, and its If-None-Match does
// not match; this epoch's since gets a diff.
func TestEpochs(t *testing.T) {
	f := newFixture(t, Config{}, index.Config{})
	f.endpoints(t, 1, index.Precise)
	im := f.ix.Publish()
	gen := strconv.FormatUint(im.Generation(), 10)
	etag := `"` + gen + `"`
	resp, _ := f.do(t, "GET", "/v1/snapshot", nil)
	epoch := resp.Header.Get(syncapi.EpochHeader)
	if !syncapi.ValidEpoch(epoch) || epoch != f.srv.Epoch() {
		t.Fatalf("epoch header %q, server's %q", epoch, f.srv.Epoch())
	}
	if other := newFixture(t, Config{}, index.Config{}); other.srv.Epoch() == epoch {
		t.Fatal("two servers share an epoch")
	}
	sink, _ := f.ix.Sink(addr(0))
	sink.Add(777, snapshot.TierGPU)
	f.ix.Publish()
	for _, tc := range []struct {
		query string
		inm   string
		since uint64 // of the bundle; 0 is whole
		code  int
	}{
		{"since=" + gen + "&epoch=" + epoch, "", im.Generation(), http.StatusOK},
		{"since=" + gen, "", im.Generation(), http.StatusOK}, // a filter that names no epoch
		{"since=" + gen + "&epoch=0123456789abcdef", "", 0, http.StatusOK},
		{"since=" + gen + "&epoch=0123456789abcdef", etag, 0, http.StatusOK},
	} {
		resp, body := f.do(t, "GET", "/v1/snapshot?"+tc.query, nil, "If-None-Match", tc.inm)
		if resp.StatusCode != tc.code {
			t.Errorf("%s: %s", tc.query, resp.Status)
			continue
		}
		bd, err := snapshot.ParseBundle(body)
		if err != nil || bd.Since() != tc.since {
			t.Errorf("%s: bundle since %d, want %d (%v)", tc.query, bd.Since(), tc.since, err)
		}
	}
	f.ix.Publish()
	cur := `"` + strconv.FormatUint(f.ix.Image().Generation(), 10) + `"`
	if resp, _ := f.do(t, "GET", "/v1/snapshot?since=1&epoch="+epoch, nil, "If-None-Match", cur); resp.StatusCode != http.StatusNotModified {
		t.Errorf("this epoch's current tag: %s, want 304", resp.Status)
	}
	if resp, _ := f.do(t, "GET", "/v1/snapshot?since=1&epoch=0123456789abcdef", nil, "If-None-Match", cur); resp.StatusCode != http.StatusOK {
		t.Errorf("another epoch's tag: %s, want a whole snapshot", resp.Status)
	}
}

// TestPeersForwardReports: a batch a gateway sends to one replica reaches
// the other's index; a forwarded batch is not forwarded again, and one that
// comes back to its sender is not applied twice.
func TestPeersForwardReports(t *testing.T) {
	b := newFixture(t, Config{Tokens: []string{token}}, index.Config{})
	a := newFixture(t, Config{Tokens: []string{token}, Peers: []string{strings.TrimPrefix(b.ts.URL, "http://")}}, index.Config{})
	for _, f := range []*fixture{a, b} {
		f.endpoints(t, 1, index.Approximate)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a.srv.runPeers(ctx)
	hs := []uint64{0xaaaa, 0xbbbb}
	resp, _ := a.do(t, "POST", "/v1/reports", batchBytes(t, report.Record{Endpoint: addr(0), Hashes: hs, Reason: "least-load"}), a.auth...)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("report to a: %s", resp.Status)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !holds(t, b, 0, hs) {
		if time.Now().After(deadline) {
			t.Fatal("b never learned a's report")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !holds(t, a, 0, hs) {
		t.Error("a did not apply its own report")
	}
	var sent dto.Metric
	a.srv.pm.forwarded.WithLabelValues(strings.TrimPrefix(b.ts.URL, "http://"), "sent").Write(&sent)
	if n := sent.GetCounter().GetValue(); n != 1 {
		t.Errorf("a forwarded %v batches, want 1", n)
	}
	// b got it forwarded: it forwards nothing (it has no peers anyway, but
	// a forwarded batch must not even be queued).
	b.srv.peers = []*peer{{addr: "unused", batches: make(chan []byte, 1)}}
	b.do(t, "POST", "/v1/reports", batchBytes(t, report.Record{Endpoint: addr(0), Hashes: []uint64{1}}), append(b.auth, ForwardedHeader, a.srv.Epoch())...)
	if len(b.srv.peers[0].batches) != 0 {
		t.Error("a forwarded batch was queued for forwarding again")
	}
	// A batch back at its sender is taken and ignored.
	b.ix.Publish()
	before := b.ix.Decisions()["unknown"]
	if resp, _ := b.do(t, "POST", "/v1/reports", batchBytes(t, report.Record{Endpoint: addr(0), Hashes: []uint64{2}}), append(b.auth, ForwardedHeader, b.srv.Epoch())...); resp.StatusCode != http.StatusAccepted {
		t.Errorf("own batch back: %s", resp.Status)
	}
	b.ix.Publish()
	if b.ix.Decisions()["unknown"] != before {
		t.Error("a batch back at its sender was applied")
	}
}
