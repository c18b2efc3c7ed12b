package e2e

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/e2e/wasmhost"
)

var threeEndpoints = []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}

func pluginConfig(t testing.TB, extra map[string]any) []byte {
	t.Helper()
	cfg := map[string]any{"endpoints": threeEndpoints}
	for k, v := range extra {
		cfg[k] = v
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newHost(t testing.TB, sem wasmhost.Semantics) *wasmhost.Host {
	t.Helper()
	code, err := os.ReadFile(wasmPath)
	if err != nil {
		t.Fatal(err)
	}
	h, err := wasmhost.New(context.Background(), code, sem)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	return h
}

func newVM(t testing.TB, h *wasmhost.Host, cfg []byte) *wasmhost.VM {
	t.Helper()
	vm, err := h.NewVM(context.Background(), wasmhost.VMConfig{
		VMID: "kvroute", RootID: "kvroute", PluginConfiguration: cfg,
		AllowOnHeadersStopIteration: true,
	})
	if err != nil {
		t.Fatalf("start VM: %v\n%s", err, vm.LogText())
	}
	return vm
}

func chatBody(t testing.TB, model string, msgs ...string) []byte {
	t.Helper()
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var m []msg
	for i, c := range msgs {
		role := "user"
		if i == 0 && len(msgs) > 1 {
			role = "system"
		}
		m = append(m, msg{role, c})
	}
	b, err := json.Marshal(map[string]any{"model": model, "messages": m})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func postHeaders(path string, extra ...[2]string) [][2]string {
	return append([][2]string{
		{":method", "POST"}, {":path", path}, {":authority", "gateway"},
		{":scheme", "http"}, {"content-type", "application/json"},
	}, extra...)
}

// send drives one request through the VM, the body in chunks of chunk bytes,
// and returns the stream after the request has fully passed the filter.
func send(t testing.TB, vm *wasmhost.VM, headers [][2]string, body []byte, chunk int) *wasmhost.Stream {
	t.Helper()
	s := vm.NewStream()
	if act := s.SendRequestHeaders(headers, len(body) == 0); len(body) > 0 && act != wasmhost.Pause && isRouted(headers) {
		t.Fatalf("request headers: action %d, want Pause while the body is read", act)
	}
	for off := 0; off < len(body); off += chunk {
		end := min(off+chunk, len(body))
		act := s.SendRequestBody(body[off:end], end == len(body))
		if end < len(body) && act != wasmhost.Pause && s.Upstream.Headers == nil {
			t.Fatalf("body chunk at %d: action %d, want Pause", off, act)
		}
		if end == len(body) && act != wasmhost.Continue && s.Local == nil {
			t.Fatalf("last body chunk: action %d, want Continue (or a local reply)", act)
		}
	}
	if err := vm.Err(); err != nil {
		t.Fatalf("VM failed: %v\n%s", err, vm.LogText())
	}
	return s
}

func isRouted(headers [][2]string) bool {
	var method, path string
	for _, h := range headers {
		switch h[0] {
		case ":method":
			method = h[1]
		case ":path":
			path = h[1]
		}
	}
	return method == "POST" && (path == "/v1/chat/completions" || path == "/v1/completions")
}

func destination(t testing.TB, s *wasmhost.Stream) string {
	t.Helper()
	if s.Upstream.Headers == nil {
		t.Fatal("request headers never reached the upstream")
	}
	d, _ := s.Upstream.Header("x-gateway-destination-endpoint")
	first, _, _ := strings.Cut(d, ",") // the rest are fallbacks, for retries
	return first
}

func metric(t testing.TB, h *wasmhost.Host, name string) int64 {
	t.Helper()
	v, ok := h.Metric(name)
	if !ok {
		t.Fatalf("metric %s not defined", name)
	}
	return v
}

func TestModuleImportsOnlyWhatEnvoyRegisters(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	t.Logf("imports: %s", strings.Join(h.Imports(), " "))
	// New already refuses a module with a disallowed import; this names the
	// guarantee so a regression reads as what it is.
	for _, imp := range h.Imports() {
		if !strings.HasPrefix(imp, "env.proxy_") && !strings.HasPrefix(imp, "wasi_snapshot_preview1.") {
			t.Errorf("unexpected import module: %s", imp)
		}
	}
}

func TestSamePrefixSameEndpoint(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	vm := newVM(t, h, pluginConfig(t, nil))
	system := strings.Repeat("You are a meticulous assistant for the billing team. ", 16)
	var first string
	for i, chunk := range []int{1 << 20, 7, 64, 1000} {
		body := chatBody(t, "qwen", system, "question number "+strconv.Itoa(i))
		got := destination(t, send(t, vm, postHeaders("/v1/chat/completions"), body, chunk))
		if !contains(threeEndpoints, got) {
			t.Fatalf("destination %q is not a configured endpoint", got)
		}
		if i == 0 {
			first = got
		} else if got != first {
			t.Errorf("request %d (chunks of %d) went to %s, earlier ones to %s", i, chunk, got, first)
		}
	}
	if n := metric(t, h, "kvroute.requests.routed"); n != 4 {
		t.Errorf("routed = %d, want 4", n)
	}
}

func TestDifferentPrefixesSpread(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	vm := newVM(t, h, pluginConfig(t, nil))
	seen := map[string]int{}
	for i := range 60 {
		body := chatBody(t, "qwen", "tenant "+strconv.Itoa(i)+" "+strings.Repeat("shared context ", 10))
		seen[destination(t, send(t, vm, postHeaders("/v1/chat/completions"), body, 512))]++
	}
	if len(seen) != len(threeEndpoints) {
		t.Errorf("60 distinct prefixes used %d endpoints: %v", len(seen), seen)
	}
	for ep, n := range seen {
		if n < 8 {
			t.Errorf("endpoint %s got only %d of 60 prefixes: %v", ep, n, seen)
		}
	}
}

func TestCompletionsPromptRouted(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	vm := newVM(t, h, pluginConfig(t, nil))
	body := []byte(`{"model":"qwen","prompt":"` + strings.Repeat("once upon a time ", 10) + `","max_tokens":5}`)
	a := destination(t, send(t, vm, postHeaders("/v1/completions"), body, 100))
	b := destination(t, send(t, vm, postHeaders("/v1/completions?debug=1"), body, 100))
	if a == "" || a != b {
		t.Errorf("completions routed to %q then %q, want one endpoint", a, b)
	}
}

func TestClientCannotSteer(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	vm := newVM(t, h, pluginConfig(t, nil))
	steer := [][2]string{
		{"x-gateway-destination-endpoint", "10.9.9.9:80"},
		{"X-Gateway-Destination-Endpoint", "10.0.0.3:8000"},
		{"x-envoy-original-dst-host", "10.9.9.9:80"},
	}
	body := chatBody(t, "qwen", strings.Repeat("steer me if you can ", 10))
	clean := destination(t, send(t, vm, postHeaders("/v1/chat/completions"), body, 256))
	cases := []struct {
		name    string
		headers [][2]string
		body    []byte
		want    string
	}{
		{"routed request", postHeaders("/v1/chat/completions", steer...), body, clean},
		{"malformed body", postHeaders("/v1/chat/completions", steer...), []byte("{not json"), ""},
		{"other path", append([][2]string{{":method", "GET"}, {":path", "/v1/models"}, {":authority", "gw"}}, steer...), nil, ""},
	}
	for _, c := range cases {
		s := send(t, vm, c.headers, c.body, 64)
		if got := destination(t, s); got != c.want {
			t.Errorf("%s: destination %q, want %q", c.name, got, c.want)
		}
		if _, ok := s.Upstream.Header("x-envoy-original-dst-host"); ok {
			t.Errorf("%s: x-envoy-original-dst-host reached the upstream", c.name)
		}
	}
}

func TestPassThrough(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	vm := newVM(t, h, pluginConfig(t, nil))
	body := chatBody(t, "qwen", strings.Repeat("not for routing ", 10))
	for _, headers := range [][][2]string{
		{{":method", "GET"}, {":path", "/v1/models"}, {":authority", "gw"}},
		{{":method", "POST"}, {":path", "/v1/embeddings"}, {":authority", "gw"}},
		{{":method", "PUT"}, {":path", "/v1/chat/completions"}, {":authority", "gw"}},
	} {
		s := vm.NewStream()
		if act := s.SendRequestHeaders(headers, false); act != wasmhost.Continue {
			t.Errorf("%v: headers action %d, want Continue", headers, act)
		}
		if act := s.SendRequestBody(body, true); act != wasmhost.Continue {
			t.Errorf("%v: body action %d, want Continue", headers, act)
		}
		if string(s.Upstream.Body) != string(body) || !s.Upstream.Ended {
			t.Errorf("%v: body not passed through unchanged", headers)
		}
		s.Close()
	}
	if n := metric(t, h, "kvroute.requests.routed"); n != 0 {
		t.Errorf("routed = %d for pass-through requests", n)
	}
}

func TestFallbacks(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	vm := newVM(t, h, pluginConfig(t, map[string]any{"max_body_bytes": 4096}))
	cases := []struct {
		name, metric string
		body         []byte
	}{
		{"malformed JSON", "invalid_body", []byte(`{"model":"qwen","messages":[{"role":"user","content":"x"}`)},
		{"not an object", "invalid_body", []byte(`["model"]`)},
		{"no prompt", "no_prompt", []byte(`{"model":"qwen","max_tokens":4}`)},
		{"oversized", "body_too_large", chatBody(t, "qwen", strings.Repeat("a", 8192))},
		{"binary junk", "invalid_body", []byte{0xff, 0xfe, 0x00, '{'}},
	}
	for _, c := range cases {
		before, _ := h.Metric("kvroute.requests." + c.metric)
		s := send(t, vm, postHeaders("/v1/chat/completions"), c.body, 1024)
		if got := destination(t, s); got != "" {
			t.Errorf("%s: destination %q, want none (Envoy's own balancing)", c.name, got)
		}
		if string(s.Upstream.Body) != string(c.body) || !s.Upstream.Ended {
			t.Errorf("%s: the body did not reach the upstream intact", c.name)
		}
		if after := metric(t, h, "kvroute.requests."+c.metric); after != before+1 {
			t.Errorf("%s: %s went %d -> %d, want +1", c.name, c.metric, before, after)
		}
		s.Close()
	}
}

func TestInvalidConfigurationRejected(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	cases := []struct {
		config, field string
	}{
		{`{"endpoints":["10.0.0.1"]}`, "endpoints"},
		{`{"endpoints":"10.0.0.1:80"}`, "endpoints"},
		{`{"max_body_bytes":-1}`, "max_body_bytes"},
		{`{"max_body_bytes":"8M"}`, "max_body_bytes"},
		{`{"chat_template":"jinja"}`, "chat_template"},
		{`{"paths":[]}`, "paths"},
		{`{"paths":["v1/chat"]}`, "paths"},
		{`{"maxBodyBytes":10}`, "maxBodyBytes"},
		{`{"endpoints":[`, "not valid JSON"},
	}
	for _, c := range cases {
		vm, err := h.NewVM(context.Background(), wasmhost.VMConfig{VMID: "kvroute", PluginConfiguration: []byte(c.config)})
		if err == nil {
			t.Errorf("%s: configuration accepted", c.config)
			continue
		}
		if !strings.Contains(vm.LogText(), c.field) {
			t.Errorf("%s: log does not name %q:\n%s", c.config, c.field, vm.LogText())
		}
	}
}

// Without allow_on_headers_stop_iteration Envoy turns the filter's header
// pause into StopAllIteration and never calls it with the body: routing
// cannot work, and envoy.yaml must set the flag. The filter notices on its
// tick, lets the request go unrouted and says what to fix.
func TestHeaderPauseNeedsStopIterationFlag(t *testing.T) {
	h := newHost(t, wasmhost.Fixed)
	vm, err := h.NewVM(context.Background(), wasmhost.VMConfig{
		VMID: "kvroute", PluginConfiguration: pluginConfig(t, map[string]any{"hold_timeout_ms": 20}),
	})
	if err != nil {
		t.Fatal(err)
	}
	s := vm.NewStream()
	s.SendRequestHeaders(postHeaders("/v1/chat/completions"), false)
	s.SendRequestBody(chatBody(t, "qwen", "hello"), true)
	if s.Upstream.Headers != nil {
		t.Fatal("headers passed although Envoy stopped all iteration")
	}
	time.Sleep(50 * time.Millisecond)
	vm.Tick()
	if s.Upstream.Headers == nil || !s.Upstream.Ended {
		t.Fatal("the held request was never released")
	}
	if n := metric(t, h, "kvroute.requests.held_too_long"); n != 1 {
		t.Errorf("held_too_long = %d", n)
	}
	if !strings.Contains(vm.LogText(), "allow_on_headers_stop_iteration") {
		t.Error("the log does not tell the operator what to fix")
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// The Go runtime calls poll_oneoff only when it sleeps or idles, and Envoy
// releases before proxy-wasm-cpp-host commit 94091cd answer ENOSYS, which the
// runtime treats as fatal (wasmhost's TestPollOneoffSemantics shows it). This
// records that kvroute's request path never sleeps: a GC-running mixed
// workload on a legacy host makes no poll_oneoff call at all.
func TestRequestPathNeverSleepsOnLegacyHost(t *testing.T) {
	if testing.Short() {
		t.Skip("20,000 requests through wazero: in the full pass only")
	}
	h := newHost(t, wasmhost.Legacy)
	vm := newVM(t, h, pluginConfig(t, map[string]any{"max_body_bytes": 1 << 20}))
	escaped := strings.Repeat(`say \"hi\"\n\tand caf\u00e9 `, 40)
	for i := range 20000 {
		var body []byte
		switch i % 5 {
		case 0:
			body = chatBody(t, "qwen", "system "+strconv.Itoa(i%97), escaped)
		case 1:
			body = []byte(`{"model":"qwen","prompt":[` + strings.Repeat("17,", i%300) + `1]}`)
		case 2:
			body = []byte(`{"model":"qwen","messages":[{"role":"user","content":"` + escaped + strconv.Itoa(i))
		case 3:
			body = chatBody(t, "llama", strings.Repeat("long context ", 1+i%20000))
		case 4:
			body = []byte(`{"model":"qwen","prompt":"` + strings.Repeat("p", i%5000) + `"}`)
		}
		s := send(t, vm, postHeaders("/v1/chat/completions"), body, 16<<10)
		s.Close()
	}
	gc, _ := h.Metric("kvroute.vm.gc_cycles")
	heap, _ := h.Metric("kvroute.vm.heap_bytes")
	t.Logf("20000 requests on a legacy host: %d GC cycles, heap %d bytes, %d pages of linear memory", gc, heap, vm.MemoryPages())
	if n := h.PollCalls(); n != 0 {
		t.Errorf("the request path called poll_oneoff %d times; legacy Envoy hosts abort the VM on it", n)
	}
	if gc == 0 {
		t.Error("no GC cycle ran; the workload no longer exercises the collector")
	}
}
