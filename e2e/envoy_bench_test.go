package e2e

import (
	"bytes"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkEnvoyRequest measures one chat request through real Envoy (one
// keep-alive connection, one request at a time) with the shipped envoy.yaml
// and with the same file minus the Wasm filter. It reports the median and
// 99th percentile per request, since a single slow request (a GC pause, the
// machine's other work) distorts the mean.
//
//	go test ./e2e -run '^$' -bench EnvoyRequest -benchtime 2000x
func BenchmarkEnvoyRequest(b *testing.B) {
	ups := startUpstreams(b, 3)
	withFilter := startGateway(b, gatewayConfig(b, addrs(ups), nil), 2)
	cfg := gatewayConfig(b, addrs(ups), nil)
	must(b, cfg.RemoveWasmFilters())
	without := startGateway(b, cfg, 2)

	for _, size := range []int{4 << 10, 128 << 10} {
		body := chatBody(b, "qwen", sharedPrefix, strings.Repeat("tell me more about caching ", size/27))
		for _, v := range []struct {
			name     string
			g        *gateway
			wantDest bool
		}{{"filter", withFilter, true}, {"no-filter", without, false}} {
			b.Run(v.name+"/"+sizeName(len(body)), func(b *testing.B) {
				times := make([]time.Duration, 0, b.N)
				for b.Loop() {
					start := time.Now()
					r, err := v.g.send(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body), nil)
					times = append(times, time.Since(start))
					if err != nil {
						b.Fatal(err)
					}
					if (r.Destination != "") != v.wantDest {
						b.Fatalf("destination %q", r.Destination)
					}
				}
				slices.Sort(times)
				b.ReportMetric(float64(times[len(times)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(times[len(times)*99/100].Microseconds()), "p99-µs")
			})
		}
	}
}

func sizeName(n int) string { return strconv.Itoa(n>>10) + "KiB" }
