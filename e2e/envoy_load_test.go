package e2e

import (
	"bytes"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The load test proves the module survives sustained load in real Envoy
// with the Go GC running. gjson links package os, so the Go runtime's
// netpoller is live; Envoy releases whose proxy-wasm-cpp-host predates
// 94091cd (1.37 and older) answer poll_oneoff with ENOSYS, and a runtime that
// sleeps there aborts the VM (TestEnvoyHost shows it), so kvroute's request
// path must never make the runtime sleep, GC included. Tens of thousands of
// large bodies go through two workers' VMs; every request must be answered
// by the engine the filter chose, the GC must have run many times, and
// Envoy must log no VM failure. (Prompts may change engines under this
// load: the policy is sticky until saturated.) Run it on another Envoy
// with ENVOY_PATH.
//
// The filter reuses its body buffer, so bodies alone make little garbage.
// Every request therefore also carries a long query string, which the
// filter copies onto the Go heap when it reads :path.
const (
	loadRequests    = 20000
	loadClients     = 24 // concurrent client connections
	loadPrompts     = 64 // distinct prompts, each with its own size
	loadMinBodySize = 64 << 10
	loadMaxBodySize = 256 << 10
	loadQuerySize   = 32 << 10
	// loadMinGCCycles is well under the cycles that loadRequests*loadQuerySize
	// (640 MiB) of garbage causes: 63 to 85 measured, with the live heap the
	// filter's local index keeps.
	loadMinGCCycles = 30
)

// loadBodies returns chat bodies from loadMinBodySize to loadMaxBodySize
// bytes, each with its own prompt. Texts carry quotes, backslashes,
// newlines and non-ASCII, so the filter's JSON decoding does real work.
func loadBodies(t testing.TB) [][]byte {
	rng := rand.New(rand.NewPCG(1, 2))
	words := []string{"cache", "token", "prefill", "decode", "\"quoted\"", "back\\slash", "line\nbreak", "naïve", "日本語", "tab\there"}
	bodies := make([][]byte, loadPrompts)
	for i := range bodies {
		size := loadMinBodySize + i*(loadMaxBodySize-loadMinBodySize)/(loadPrompts-1)
		var b strings.Builder
		b.WriteString("conversation " + strconv.Itoa(i) + ": ")
		for b.Len() < size {
			b.WriteString(words[rng.IntN(len(words))])
			b.WriteByte(' ')
		}
		text := b.String()
		half := len(text) / 2
		bodies[i] = chatBody(t, "qwen", text[:half], text[half:])
	}
	return bodies
}

func sustainLoad(t *testing.T, g *gateway, ups []*upstream) {
	bodies := loadBodies(t)
	statsBefore, err := g.envoy.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	hitsBefore := 0
	for _, u := range ups {
		hitsBefore += u.count()
	}

	var (
		next, bytesSent atomic.Int64
		mu              sync.Mutex
		failures        []string
		failed          int
		landed          = make([]map[string]int, len(bodies)) // per prompt, requests per engine
	)
	for i := range landed {
		landed[i] = map[string]int{}
	}
	fail := func(msg string) {
		mu.Lock()
		defer mu.Unlock()
		if failed++; len(failures) < 10 {
			failures = append(failures, msg)
		}
	}
	path := "/v1/chat/completions?trace=" + strings.Repeat("q", loadQuerySize)
	start := time.Now()
	var wg sync.WaitGroup
	for range loadClients {
		wg.Go(func() {
			for {
				n := int(next.Add(1)) - 1
				if n >= loadRequests {
					return
				}
				i := (n * 7) % len(bodies) // neighbours differ in size
				body := bodies[i]
				r, err := g.send(http.MethodPost, path, bytes.NewReader(body), nil)
				if err != nil {
					fail("request " + strconv.Itoa(n) + ": " + err.Error())
					continue
				}
				bytesSent.Add(int64(len(body)))
				if r.Destination == "" || r.Server != r.Destination || r.BodyBytes != int64(len(body)) {
					fail("request " + strconv.Itoa(n) + ": destination " + strconv.Quote(r.Destination) +
						", answered by " + r.Server + ", " + strconv.FormatInt(r.BodyBytes, 10) + " body bytes")
					continue
				}
				mu.Lock()
				landed[i][r.Server]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	if failed > 0 {
		t.Errorf("%d of %d requests failed; first ones:\n%s", failed, loadRequests, strings.Join(failures, "\n"))
	}
	hits := -hitsBefore
	for _, u := range ups {
		hits += u.count()
	}
	if hits != loadRequests {
		t.Errorf("engines answered %d requests, want %d", hits, loadRequests)
	}
	stats, err := g.envoy.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	delta := func(name string) int64 { return stats[name] - statsBefore[name] }
	if d := delta("wasmcustom.kvroute.requests.routed"); d != loadRequests {
		t.Errorf("kvroute.requests.routed rose by %d, want %d", d, loadRequests)
	}
	if d := delta("cluster.engines.upstream_rq_2xx"); d != loadRequests {
		t.Errorf("cluster.engines.upstream_rq_2xx rose by %d, want %d", d, loadRequests)
	}
	// A VM that died was replaced (failure_policy FAIL_RELOAD): that shows
	// as a reload or a VM created after startup.
	for _, name := range []string{"wasm.kvroute.vm_reload", "wasm.kvroute.vm_reload_failure", "wasm.envoy.wasm.runtime.v8.created"} {
		if _, ok := stats[name]; !ok {
			t.Errorf("Envoy has no stat %s", name)
		} else if d := delta(name); d != 0 {
			t.Errorf("%s rose by %d under load", name, d)
		}
	}
	if f := g.envoy.WasmFailures(); len(f) > 0 {
		t.Errorf("Envoy logged Wasm failures under load:\n%s", strings.Join(f, "\n"))
	}
	// The VMs publish their GC count every 64 streams, so it lags a little.
	gcCycles := delta("wasmcustom.kvroute.vm.gc_cycles")
	if gcCycles < loadMinGCCycles {
		t.Errorf("the VMs ran %d GC cycles under load, want at least %d: the load no longer exercises the GC", gcCycles, loadMinGCCycles)
	}
	atHome := 0 // requests on their prompt's busiest engine
	for _, byEngine := range landed {
		atHome += maxCount(byEngine)
	}
	t.Logf("%d requests, %.0f MiB of bodies (%d-%d KiB) from %d clients in %v (%.0f req/s); %d GC cycles; live heap of all VMs %.1f MiB; %.0f%% of requests on their prompt's main engine",
		loadRequests, float64(bytesSent.Load())/(1<<20), loadMinBodySize>>10, loadMaxBodySize>>10, loadClients,
		elapsed.Round(time.Millisecond), float64(loadRequests)/elapsed.Seconds(), gcCycles,
		float64(stats["wasmcustom.kvroute.vm.heap_bytes"])/(1<<20), 100*float64(atHome)/loadRequests)
}

func maxCount(m map[string]int) int {
	n := 0
	for _, v := range m {
		n = max(n, v)
	}
	return n
}
