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

// The load test proves the module survives in real Envoy what kills Go
// modules on older hosts: gjson links package os, so the Go runtime's
// netpoller is live and its scheduler and GC sleep through poll_oneoff, which
// Envoy releases before the proxy-wasm-cpp-host fix (94091cd) answer with
// ENOSYS, aborting the VM. Tens of thousands of large bodies go through two
// workers' VMs; every request must be answered by an engine, each prompt
// must keep its engine throughout, the Go GC must have run many times, and
// Envoy must log no VM failure.
//
// The filter reuses its body buffer, so bodies alone hardly allocate (two GC
// cycles in 30,000 requests when measured). Every request therefore also
// carries a long query string, which the filter copies onto the Go heap when
// it reads :path.
const (
	loadRequests    = 30000
	loadClients     = 24 // concurrent client connections
	loadPrompts     = 64 // distinct prompts, each with its own size
	loadMinBodySize = 64 << 10
	loadMaxBodySize = 256 << 10
	loadQuerySize   = 16 << 10
	// loadMinGCCycles is well under what loadRequests*loadQuerySize of
	// garbage causes with the runtime's 4 MiB minimum heap goal.
	loadMinGCCycles = 50
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
		home            = make([]string, len(bodies)) // the engine each prompt landed on first
	)
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
				if home[i] == "" {
					home[i] = r.Server
				} else if home[i] != r.Server {
					failed++
					failures = append(failures, "prompt "+strconv.Itoa(i)+" moved from "+home[i]+" to "+r.Server)
				}
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
	t.Logf("%d requests, %.0f MiB of bodies (%d-%d KiB) from %d clients in %v (%.0f req/s); %d GC cycles; live heap of all VMs %.1f MiB",
		loadRequests, float64(bytesSent.Load())/(1<<20), loadMinBodySize>>10, loadMaxBodySize>>10, loadClients,
		elapsed.Round(time.Millisecond), float64(loadRequests)/elapsed.Seconds(), gcCycles,
		float64(stats["wasmcustom.kvroute.vm.heap_bytes"])/(1<<20))
}
