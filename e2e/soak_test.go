package e2e

import (
	"context"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/e2e/vllmsim"
)

// TestSoak runs moderate load with constant snapshot churn through Envoy
// and cachesync for KVROUTE_SOAK (make soak: 30 minutes) and wants the
// filter VMs' live heap and cachesync's resident memory flat: at the end
// within 10% of what they were after the first minute. It also wants no
// request to fail. Not part of make test.
func TestSoak(t *testing.T) {
	d := os.Getenv("KVROUTE_SOAK")
	if d == "" {
		t.Skip("KVROUTE_SOAK unset: make soak runs it")
	}
	duration, err := time.ParseDuration(d)
	if err != nil || duration < 2*time.Minute {
		t.Fatalf("KVROUTE_SOAK=%q: want a duration of 2m or more", d)
	}
	es := startEngines(t, 3, vllmsim.Config{NumGPUBlocks: 2048, TimeScale: 0.05})
	cs := newCachesyncProcess(t, es, freeAddr(t))
	cs.start(t)
	g := cachesyncGateway(t, es, cs.addr, nil)

	// 4 clients at about 5 requests/s each. Tenants rotate every 30 s, so
	// prefixes keep arriving and leaving the engines' caches: the index
	// and its snapshots change all the time.
	var sent, failed atomic.Int64
	start := time.Now()
	stop := clients(t, 4, func(c, i int) {
		time.Sleep(200 * time.Millisecond)
		epoch := int(time.Since(start) / (30 * time.Second))
		tenant := strconv.Itoa(epoch) + "-" + strconv.Itoa((c*7+i)%16)
		system := "Tenant " + tenant + " rules. " + strings.Repeat("Answer from the tenant's documents only. ", 40)
		code, _, err := tryPost(g.client, g.url, simChat(system, "question "+strconv.Itoa(i), 4))
		sent.Add(1)
		if err != nil || code != http.StatusOK {
			failed.Add(1)
		}
	})
	defer stop()

	type reading struct{ heap, rss, cacheHeap, generation float64 }
	read := func() reading {
		stats, err := g.envoy.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		m := metrics(t, "http://"+cs.addr+"/metrics")
		rss, _ := sample(m, "process_resident_memory_bytes")
		heap, _ := sample(m, "go_memstats_heap_inuse_bytes")
		gen, _ := sample(m, "kvroute_cachesync_snapshot_generation")
		return reading{heap: float64(stats["wasmcustom.kvroute.vm.heap_bytes"]), rss: rss, cacheHeap: heap, generation: gen}
	}
	time.Sleep(time.Minute)
	first := read()
	builds := func(a, b reading) float64 { return b.generation - a.generation }
	last := first
	for elapsed := time.Minute; elapsed < duration; elapsed += time.Minute {
		time.Sleep(time.Minute)
		r := read()
		t.Logf("%3.0f min: %d sent, %d failed; filter VMs' heap %.1f MiB, cachesync RSS %.1f MiB (Go heap in use %.1f MiB), %.0f snapshots this minute",
			(elapsed + time.Minute).Minutes(), sent.Load(), failed.Load(), r.heap/(1<<20), r.rss/(1<<20), r.cacheHeap/(1<<20), builds(last, r))
		last = r
	}
	end := last
	t.Logf("soak of %v: %d requests, %d failed; filter VMs' live heap %.1f -> %.1f MiB (%+.1f%%), cachesync RSS %.1f -> %.1f MiB (%+.1f%%)",
		duration, sent.Load(), failed.Load(), first.heap/(1<<20), end.heap/(1<<20), 100*(end.heap/first.heap-1),
		first.rss/(1<<20), end.rss/(1<<20), 100*(end.rss/first.rss-1))
	if failed.Load() > 0 {
		t.Errorf("%d of %d requests failed", failed.Load(), sent.Load())
	}
	if end.heap > 1.1*first.heap {
		t.Errorf("the filter VMs' live heap grew %.1f%%", 100*(end.heap/first.heap-1))
	}
	if end.rss > 1.1*first.rss {
		t.Errorf("cachesync's resident memory grew %.1f%%", 100*(end.rss/first.rss-1))
	}
}
