package index

import (
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/kvroute/kvroute/shared/report"
	"github.com/kvroute/kvroute/shared/snapshot"
)

const (
	benchEntries   = 1 << 20
	benchEndpoints = 64
)

// fill gives the index's 64 precise endpoints 1M distinct blocks through
// their sinks, as engine events would: 75% of blocks on one endpoint, 20% on
// two, 5% on three, on either tier.
func fill(b *testing.B, x *Index, sinks []*Sink) []uint64 {
	hs := make([]uint64, benchEntries)
	for i := range hs {
		h := H(uint64(i))
		hs[i] = h
		n := 1
		switch {
		case i%20 == 0:
			n = 3
		case i%5 == 0:
			n = 2
		}
		for j := range n {
			sinks[(int(h>>40)+j*21)%benchEndpoints].Add(h, snapshot.Tier(h>>7&1))
		}
	}
	return hs
}

func preciseIndex(b *testing.B) (*Index, []*Sink) {
	x := newIndex(b, Config{MaxPending: 1 << 30})
	addEndpoints(b, x, benchEndpoints, Precise)
	sinks := make([]*Sink, benchEndpoints)
	for i := range sinks {
		sinks[i] = sink(b, x, addr(i))
	}
	return x, sinks
}

// BenchmarkPublish1M measures the snapshot of a 1M-entry index over 64
// endpoints: "full" is the first build (every shard encoded), "churn" a
// build after 1% of the blocks changed (10k stored, 10k removed across all
// endpoints), what one sync interval of a busy fleet looks like. Both
// include applying the queued changes. Reported: the image's bytes, the
// bundle a fetcher at the previous generation receives, and the heap the
// index holds.
func BenchmarkPublish1M(b *testing.B) {
	b.Run("full", func(b *testing.B) {
		var im *snapshot.Image
		var st Stats
		for b.Loop() {
			b.StopTimer()
			x, sinks := preciseIndex(b)
			fill(b, x, sinks)
			b.StartTimer()
			im = x.Publish()
			st = x.Stats()
		}
		b.ReportMetric(float64(st.BuildTime.Nanoseconds())/1e6, "build-ms")
		b.ReportMetric(float64(im.Size()), "image-bytes")
		b.ReportMetric(float64(im.Size())/float64(st.Entries), "image-B/entry")
	})
	b.Run("churn", func(b *testing.B) {
		x, sinks := preciseIndex(b)
		hs := fill(b, x, sinks)
		var before runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		prev := x.Publish()
		rng := rand.New(rand.NewPCG(1, 2))
		next := uint64(benchEntries)
		var bundle, builds int
		b.ResetTimer()
		for b.Loop() {
			for range benchEntries / 100 {
				i := rng.IntN(len(hs))
				h := hs[i]
				sinks[int(h>>40)%benchEndpoints].Remove(h, snapshot.Tier(h>>7&1))
				hs[i] = H(next)
				next++
				sinks[int(hs[i]>>40)%benchEndpoints].Add(hs[i], snapshot.TierGPU)
			}
			im := x.Publish()
			bundle += len(im.AppendBundle(nil, prev.Generation()))
			builds++
			prev = im
		}
		b.StopTimer()
		var after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(bundle)/float64(builds), "delta-bundle-bytes")
		b.ReportMetric(float64(x.Stats().BuildTime.Nanoseconds())/1e6, "last-build-ms")
		b.ReportMetric(float64(after.HeapAlloc)/(1<<20), "heap-MiB")
		b.ReportMetric(float64(x.Stats().Entries), "entries")
		runtime.KeepAlive(hs)
	})
}

// BenchmarkReports measures the approximate path end to end: decoding
// report batches (1000 records of 125-block prompts: one of 16 system
// prompts of 25 blocks, then a conversation) and applying them to 64
// approximate endpoints holding 1M hashes in all, in hashes per second.
// "new" routes conversations never seen, so that 80% of the hashes are
// added and as many evicted, each a change to the snapshot builder too;
// "repeat" re-routes 800k hashes the index holds. The build is left out
// (see BenchmarkPublish1M).
func BenchmarkReports(b *testing.B) {
	for _, bc := range []struct {
		name   string
		bodies int
	}{{"new", 64}, {"repeat", 8}} {
		b.Run(bc.name, func(b *testing.B) {
			x := newIndex(b, Config{DefaultCapacity: benchEntries / benchEndpoints, MaxPendingHashes: 1 << 30})
			addEndpoints(b, x, benchEndpoints, Approximate)
			bodies := reportBodies(bc.bodies)
			apply := func(body []byte) int {
				bt, err := report.Parse(body, report.Limits{})
				if err != nil {
					b.Fatal(err)
				}
				x.Report(bt)
				x.mu.Lock()
				x.applyReports()
				x.mu.Unlock()
				return bt.NumHashes()
			}
			for _, body := range bodies[:min(32, len(bodies))] { // warm up
				apply(body)
			}
			hashes := 0
			for i := 0; b.Loop(); i++ {
				hashes += apply(bodies[i%len(bodies)])
			}
			b.ReportMetric(float64(hashes)/b.Elapsed().Seconds(), "hashes/s")
		})
	}
}

func reportBodies(n int) [][]byte {
	rng := rand.New(rand.NewPCG(3, 4))
	bodies := make([][]byte, n)
	for i := range bodies {
		var w report.Writer
		for range 1000 {
			sys, conv := uint64(rng.IntN(16)), rng.Uint64()>>20
			hs := make([]uint64, 125)
			for j := range hs {
				if j < 25 {
					hs[j] = H(sys<<32 | uint64(j))
				} else {
					hs[j] = H(conv<<8 | uint64(j))
				}
			}
			_ = w.Add(&report.Record{Endpoint: addr(rng.IntN(benchEndpoints)), Hashes: hs})
		}
		bodies[i] = append([]byte(nil), w.Bytes()...)
	}
	return bodies
}
