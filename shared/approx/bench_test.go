package approx

import (
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/kvroute/kvroute/shared/snapshot"
)

type nopSink struct{}

func (nopSink) Add(int, uint64, snapshot.Tier) error    { return nil }
func (nopSink) Remove(int, uint64, snapshot.Tier) error { return nil }

const benchEntries = 1 << 20

// benchWorkload returns prompts of 125 blocks (8 KB of text): 16 system
// prompts of 25 blocks, each followed by a conversation of its own.
func benchWorkload(n int) [][]uint64 {
	rng := rand.New(rand.NewPCG(1, 2))
	prompts := make([][]uint64, n)
	for i := range prompts {
		prompts[i] = chain(uint64(rng.IntN(16)), rng.Uint64()>>34, 25, 125)
	}
	return prompts
}

// BenchmarkTouch measures Touch on one endpoint holding 1M hashes (64 MiB of
// text), in hashes per second: "repeat" re-routes prompts it holds, "new"
// routes prompts it has not seen, each evicting an old one's tail.
func BenchmarkTouch(b *testing.B) {
	for _, bc := range []struct {
		name  string
		fresh bool
	}{{"repeat", false}, {"new", true}} {
		b.Run(bc.name, func(b *testing.B) {
			x := New()
			if _, err := x.SetCapacity(0, benchEntries, nopSink{}); err != nil {
				b.Fatal(err)
			}
			warm := benchWorkload(benchEntries / 110) // 950k distinct hashes
			for _, p := range warm {
				_, _ = x.Touch(0, p, nopSink{})
			}
			prompts := warm
			if bc.fresh {
				prompts = benchWorkload(benchEntries / 20)[benchEntries/110:]
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				_, _ = x.Touch(0, prompts[i%len(prompts)], nopSink{})
				i++
			}
			b.ReportMetric(float64(i*125)/b.Elapsed().Seconds(), "hashes/s")
		})
	}
}

// BenchmarkMemory fills 1M entries over 16 endpoints and reports the bytes
// per entry the index accounts for and the heap it grew by.
func BenchmarkMemory(b *testing.B) {
	prompts := benchWorkload(benchEntries / 50)
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		x := New()
		for slot := range 16 {
			_, _ = x.SetCapacity(slot, benchEntries/16, nopSink{})
		}
		for i, p := range prompts {
			_, _ = x.Touch(i%16, p, nopSink{})
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(x.Bytes())/float64(x.Entries()), "B/entry")
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(x.Entries())*1e6/(1<<20), "heapMiB/M-entries")
		runtime.KeepAlive(x)
	}
}
