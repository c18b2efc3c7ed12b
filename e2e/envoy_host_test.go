package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/e2e/envoy"
)

// TestEnvoyHost characterises the Envoy under test with a probe module
// (envoy/testdata/hostprobe) in the shipped envoy.yaml, and proves that
// envoy.Process's WasmFailures, which the other tests rely on to report a
// crashed VM, catches real VM deaths:
//   - poll_oneoff: proxy-wasm-cpp-host before 94091cd answers ENOSYS (52),
//     and the Go runtime aborts whenever it sleeps; later hosts answer 0.
//     kvroute's request path never sleeps (e2e TestEnvoy's load test passes
//     on both), but the probe's time.Sleep must then kill the VM, and the
//     crash must be seen.
//   - a trap (out-of-bounds load) must be seen, and failure_policy
//     FAIL_RELOAD must bring up a new VM for later requests.
func TestEnvoyHost(t *testing.T) {
	ctx := context.Background()
	bin, err := envoy.Path(ctx)
	if err != nil {
		t.Fatal(err)
	}
	version, err := envoy.Version(ctx, bin)
	if err != nil {
		t.Fatal(err)
	}
	probe := filepath.Join(t.TempDir(), "hostprobe.wasm")
	build := exec.CommandContext(ctx, "go", "build", "-buildmode=c-shared", "-o", probe, "./envoy/testdata/hostprobe")
	build.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build probe: %v\n%s", err, out)
	}

	ups := startUpstreams(t, 3)
	cfg := gatewayConfig(t, addrs(ups), nil)
	must(t, cfg.SetWasmCode(pluginName, probe))
	g := launchGateway(t, cfg, 2, false)

	get := func(path string) (int, string) {
		t.Helper()
		resp, err := g.client.Get(g.url + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	_, body := get("/poll_oneoff")
	switch body {
	case "errno=0":
		t.Logf("Envoy %s answers poll_oneoff with success (proxy-wasm-cpp-host 94091cd or later)", version)
		if code, body := get("/sleep"); code != http.StatusOK || body != "slept" {
			t.Errorf("time.Sleep and runtime.GC in a callback: %d %q", code, body)
		}
		if f := g.envoy.WasmFailures(); len(f) > 0 {
			t.Fatalf("Wasm failures before the trap:\n%s", strings.Join(f, "\n"))
		}
	case "errno=52":
		t.Logf("Envoy %s answers poll_oneoff with ENOSYS: a Go module that sleeps dies here", version)
		if code, _ := get("/sleep"); code == http.StatusOK {
			t.Errorf("time.Sleep survived a host whose poll_oneoff fails")
		}
		if f := strings.Join(newFailures(g, 0), "\n"); !strings.Contains(f, "poll_oneoff") {
			t.Errorf("the Go runtime died on poll_oneoff and WasmFailures missed it:\n%s", g.envoy.Log())
		}
		waitReload(t, g, get)
	default:
		t.Fatalf("Envoy %s: /poll_oneoff answered %q", version, body)
	}
	if code, body := get("/v1/models"); code != http.StatusOK || !strings.Contains(body, `"server"`) {
		t.Errorf("pass-through request: %d %q", code, body)
	}

	seen := len(g.envoy.WasmFailures())
	if code, _ := get("/trap"); code == http.StatusOK {
		t.Errorf("a trapping VM answered 200")
	}
	if f := newFailures(g, seen); len(f) == 0 {
		t.Errorf("a VM trapped and WasmFailures saw nothing; Envoy's log:\n%s", g.envoy.Log())
	} else {
		t.Logf("a trap logs:\n%s", strings.Join(f, "\n"))
	}

	waitReload(t, g, get)
}

// waitReload waits for failure_policy FAIL_RELOAD to replace a dead VM
// (after a backoff of 1 s by default) and the filter to answer again.
func waitReload(t *testing.T, g *gateway, get func(string) (int, string)) {
	t.Helper()
	stats, err := g.envoy.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	before := stats["wasm.kvroute.vm_reload_success"]
	for range 50 {
		if code, body := get("/poll_oneoff"); code == http.StatusOK && strings.HasPrefix(body, "errno=") {
			stats, err := g.envoy.Stats(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if stats["wasm.kvroute.vm_reload_success"] > before {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("no VM reload after the VM died; Envoy's log:\n%s", g.envoy.Log())
}

// newFailures waits a little for failure lines past the first seen: Envoy's
// log reaches the test through a pipe, after the response may have.
func newFailures(g *gateway, seen int) []string {
	deadline := time.Now().Add(5 * time.Second)
	for {
		if f := g.envoy.WasmFailures(); len(f) > seen || time.Now().After(deadline) {
			return f[seen:]
		}
		time.Sleep(20 * time.Millisecond)
	}
}
