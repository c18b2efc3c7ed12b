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

// TestEnvoyHost checks, with a probe module (envoy/testdata/hostprobe) in
// the shipped envoy.yaml, the two facts the other real-Envoy tests rest on:
// the Envoy under test answers poll_oneoff with success, so the Go runtime
// may sleep (proxy-wasm-cpp-host 94091cd; older hosts answer ENOSYS and the
// runtime aborts), and a VM that dies is caught by envoy.Process's
// WasmFailures, which the load test relies on to report a crash.
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
	g := startEnvoy(t, cfg, 2)

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

	if code, body := get("/poll_oneoff"); code != http.StatusOK || body != "errno=0" {
		t.Errorf("Envoy %s: poll_oneoff answered %d %q, want errno=0; Go modules that link os abort under GC on this host",
			version, code, body)
	} else {
		t.Logf("Envoy %s answers poll_oneoff with success (proxy-wasm-cpp-host 94091cd or later)", version)
	}
	if code, body := get("/sleep"); code != http.StatusOK || body != "slept" {
		t.Errorf("Envoy %s: time.Sleep and runtime.GC in a callback: %d %q", version, code, body)
	}
	if code, body := get("/v1/models"); code != http.StatusOK || !strings.Contains(body, `"server"`) {
		t.Errorf("pass-through request: %d %q", code, body)
	}
	if f := g.envoy.WasmFailures(); len(f) > 0 {
		t.Fatalf("Wasm failures before the trap:\n%s", strings.Join(f, "\n"))
	}

	code, _ := get("/trap")
	if code == http.StatusOK {
		t.Errorf("a trapping VM answered 200")
	}
	if f := g.envoy.WasmFailures(); len(f) == 0 {
		t.Errorf("a VM trapped and WasmFailures saw nothing; Envoy's log:\n%s", g.envoy.Log())
	} else {
		t.Logf("a trap logs:\n%s", strings.Join(f, "\n"))
	}

	// failure_policy FAIL_RELOAD: the dead VM is replaced for later requests
	// (after a backoff of 1 s by default), and the filter works again.
	var reloaded bool
	for range 40 {
		if code, body := get("/poll_oneoff"); code != http.StatusOK || body != "errno=0" {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		stats, err := g.envoy.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if reloaded = stats["wasm.kvroute.vm_reload_success"] > 0; reloaded {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !reloaded {
		t.Errorf("no VM reload after the trap; Envoy's log:\n%s", g.envoy.Log())
	}
}
