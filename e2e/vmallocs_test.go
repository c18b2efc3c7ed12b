package e2e

import (
	"context"
	"os"
	"testing"

	"github.com/kvroute/kvroute/e2e/wasmhost"
)

// TestRoutedRequestAllocations: a routed request, headers to stream end,
// allocates only a few objects on the module's Go heap. Every allocation
// inside a Wasm VM is a call deep into Go's runtime and garbage the VM's
// collector walks later; a hostcall's out-parameters left on the stack
// escaped to the heap, two on each of about eight calls a request, and
// nothing else would show it (the time they cost is below what Envoy's
// latency can resolve here).
func TestRoutedRequestAllocations(t *testing.T) {
	skipUnderRace(t)
	code, err := os.ReadFile(wasmPath)
	if err != nil {
		t.Fatal(err)
	}
	h, mallocs, err := wasmhost.NewCounting(context.Background(), code, wasmhost.Fixed, ".runtime.mallocgc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	vm := newVM(t, h, pluginConfig(t, map[string]any{"policy": map[string]any{"mode": "auto"}}))
	body := chatBody(t, "qwen", sharedPrefix, repeatTo("tell me more about prefix caching, please. ", 2<<10))
	const warm, measured = 200, 200
	var from int64
	for i := range warm + measured {
		if i == warm {
			from = mallocs.Load()
		}
		if i%50 == 0 {
			vm.Tick() // the live loop runs beside the requests, as in Envoy
		}
		s := send(t, vm, postHeaders("/v1/chat/completions"), body, len(body))
		if destination(t, s) == "" {
			t.Fatalf("request %d was not routed:\n%s", i, vm.LogText())
		}
		s.SendResponseHeaders([][2]string{{":status", "200"}}, false)
		s.SendResponseBody([]byte(`{"ok":true}`), true)
		s.Close()
	}
	// 7 when written, mostly the stream's own context and state and a few
	// strings (the path, the model's name, the served header). 33 before
	// the hostcalls' out-parameters moved off the stack.
	const most = 10
	if per := float64(mallocs.Load()-from) / measured; per > most {
		t.Errorf("a routed request allocated %.1f objects in the VM, want at most %d", per, most)
	} else {
		t.Logf("%.1f allocations a routed request", per)
	}
}
