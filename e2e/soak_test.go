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
// within 10% of what they were once warm (5 minutes in). It also wants no
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

	type reading struct{ heap, rss, anon, cacheHeap, generation float64 }
	read := func() reading {
		stats, err := g.envoy.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		m := metrics(t, "http://"+cs.addr+"/metrics")
		rss, _ := sample(m, "process_resident_memory_bytes")
		heap, _ := sample(m, "go_memstats_heap_inuse_bytes")
		gen, _ := sample(m, "kvroute_cachesync_snapshot_generation")
		return reading{heap: float64(stats["wasmcustom.kvroute.vm.heap_bytes"]), rss: rss, anon: rssAnon(t, cs.cmd.Process.Pid), cacheHeap: heap, generation: gen}
	}
	// The baseline is taken once the engines' caches have filled (the
	// index and cachesync's block maps grow with them until then, by
	// design) and the processes have touched their memory: 5 minutes in,
	// or a third of a shorter soak. Every minute is logged, the first
	// ones too.
	warm := min(5*time.Minute, duration/3)
	builds := func(a, b reading) float64 {
		if a.generation == 0 {
			return 0 // the first minute: no reading before it
		}
		return b.generation - a.generation
	}
	var first, last reading
	for elapsed := time.Duration(0); elapsed < duration; elapsed += time.Minute {
		time.Sleep(time.Minute)
		r := read()
		t.Logf("%3.0f min: %d sent, %d failed; filter VMs' heap %.1f MiB; cachesync RSS %.1f MiB, of it anonymous %.1f MiB (Go heap in use %.1f MiB); %.0f snapshots this minute",
			(elapsed + time.Minute).Minutes(), sent.Load(), failed.Load(), r.heap/(1<<20), r.rss/(1<<20), r.anon/(1<<20), r.cacheHeap/(1<<20), builds(last, r))
		if elapsed+time.Minute == warm.Truncate(time.Minute) {
			first = r
		}
		last = r
	}
	end := last
	t.Logf("soak of %v: %d requests, %d failed; from minute %.0f to the end, filter VMs' live heap %.1f -> %.1f MiB (%+.1f%%), cachesync anonymous RSS %.1f -> %.1f MiB (%+.1f%%), all RSS %.1f -> %.1f MiB (%+.1f%%)",
		duration, sent.Load(), failed.Load(), warm.Truncate(time.Minute).Minutes(), first.heap/(1<<20), end.heap/(1<<20), 100*(end.heap/first.heap-1),
		first.anon/(1<<20), end.anon/(1<<20), 100*(end.anon/first.anon-1), first.rss/(1<<20), end.rss/(1<<20), 100*(end.rss/first.rss-1))
	if failed.Load() > 0 {
		t.Errorf("%d of %d requests failed", failed.Load(), sent.Load())
	}
	if end.heap > 1.1*first.heap {
		t.Errorf("the filter VMs' live heap grew %.1f%%", 100*(end.heap/first.heap-1))
	}
	// The anonymous part: most of cachesync's RSS is its 50 MB executable
	// (the tokenizer's vocabulary is built in), paged in as code paths
	// first run, which the kernel may drop at will; what the process
	// allocates is the rest.
	if end.anon > 1.1*first.anon {
		t.Errorf("cachesync's anonymous resident memory grew %.1f%%", 100*(end.anon/first.anon-1))
	}
}

// rssAnon reads a process's anonymous resident memory (bytes) from /proc.
func rssAnon(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "RssAnon:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb * 1024
		}
	}
	t.Fatal("no RssAnon in /proc/pid/status")
	return 0
}
