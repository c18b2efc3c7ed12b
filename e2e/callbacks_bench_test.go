package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/e2e/wasmhost"
)

// BenchmarkModuleCallbacks times each proxy-wasm callback of one request
// inside the module under wazero, kvroute against the floor module
// (e2e/bench/floor, the least a body-routing Go filter does), for several
// body sizes: where kvroute's time goes. wazero's compiler is not V8's, so
// the split is the figure, not the total.
//
//	go test ./e2e -run '^$' -bench ModuleCallbacks -benchtime 2000x
func BenchmarkModuleCallbacks(b *testing.B) {
	floor := filepath.Join(b.TempDir(), "floor.wasm")
	build := exec.Command("go", "build", "-buildmode=c-shared", "-o", floor, "./bench/floor")
	build.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build the floor module: %v\n%s", err, out)
	}
	kv, err := os.ReadFile(wasmPath)
	if err != nil {
		b.Fatal(err)
	}
	fl, err := os.ReadFile(floor)
	if err != nil {
		b.Fatal(err)
	}
	for _, m := range []struct {
		name string
		code []byte
		cfg  []byte
	}{
		{"kvroute", kv, pluginConfig(b, nil)},
		{"floor", fl, []byte(`{"endpoint":"` + threeEndpoints[0] + `"}`)},
	} {
		h, err := wasmhost.New(context.Background(), m.code, wasmhost.Fixed)
		if err != nil {
			b.Fatal(err)
		}
		vm, err := h.NewVM(context.Background(), wasmhost.VMConfig{VMID: "kvroute", PluginConfiguration: m.cfg, AllowOnHeadersStopIteration: true})
		if err != nil {
			b.Fatal(err)
		}
		for _, size := range []int{2 << 10, 16 << 10, 128 << 10, 512 << 10} {
			body := chatBody(b, "qwen", sharedPrefix, string(make([]byte, 0))+repeatTo("tell me more about prefix caching, please. ", size))
			b.Run(m.name+"/"+sizeName(size), func(b *testing.B) {
				phases := map[string][]time.Duration{}
				at := func(name string, f func()) {
					start := time.Now()
					f()
					phases[name] = append(phases[name], time.Since(start))
				}
				i := 0
				for b.Loop() {
					if i++; i%50 == 0 {
						vm.Tick() // the live loop runs beside the requests, as in Envoy
					}
					s := vm.NewStream()
					at("headers", func() { s.SendRequestHeaders(postHeaders("/v1/chat/completions"), false) })
					at("body", func() { s.SendRequestBody(body, true) })
					at("response", func() {
						s.SendResponseHeaders([][2]string{{":status", "200"}}, false)
						s.SendResponseBody([]byte(`{"ok":true}`), true)
					})
					at("done", s.Close)
				}
				for _, name := range []string{"headers", "body", "response", "done"} {
					ts := phases[name]
					slices.Sort(ts)
					b.ReportMetric(float64(ts[len(ts)/2].Nanoseconds())/1e3, name+"-p50-µs")
				}
			})
		}
		h.Close(context.Background())
	}
}

func repeatTo(s string, n int) string {
	out := make([]byte, 0, n)
	for len(out) < n {
		out = append(out, s...)
	}
	return string(out[:n])
}
