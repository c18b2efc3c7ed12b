package snapshot

import (
	"flag"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

const benchEntries = 4 << 20

var sweep = flag.Bool("sweep", false, "BenchmarkChurn: sweep shard counts, churn rates and the delta")

// bench4M is a 4M-entry snapshot over 64 endpoints, built once and shared
// by the benchmarks that read it.
var bench4M = sync.OnceValues(func() (*Builder, *View) {
	b := newBuilder(&testing.B{}, BuilderConfig{}, 64)
	fillScale(&testing.B{}, b, 0, benchEntries, 64)
	st := newStore()
	st.fetch(&testing.B{}, b.Build(epoch))
	v := NewView(st.keys)
	if _, err := v.Refresh(st.get); err != nil {
		panic(err)
	}
	return b, v
})

// BenchmarkEncode measures encoding every part of a 4M-entry snapshot, what
// cachesync does once at start-up and a fetcher's first full bundle costs.
func BenchmarkEncode(b *testing.B) {
	bl, _ := bench4M()
	var size int
	b.ReportAllocs()
	for b.Loop() {
		for i := range bl.shards {
			bl.shards[i].part = nil
		}
		size = bl.Build(epoch).Size()
	}
	b.ReportMetric(float64(size), "bytes")
	b.ReportMetric(float64(size)/benchEntries, "B/entry")
	b.SetBytes(int64(size))
}

// BenchmarkRefreshFull measures a reader adopting a whole 4M-entry
// snapshot: the checks on every part (checksums, structure).
func BenchmarkRefreshFull(b *testing.B) {
	bl, _ := bench4M()
	st := newStore()
	st.fetch(b, bl.Build(epoch))
	b.ReportAllocs()
	var size int
	for b.Loop() {
		v := NewView(st.keys)
		if _, err := v.Refresh(st.get); err != nil {
			b.Fatal(err)
		}
		size = v.Size()
	}
	b.SetBytes(int64(size))
}

func BenchmarkLookup(b *testing.B) {
	_, v := bench4M()
	rng := rand.New(rand.NewPCG(1, 2))
	hs := make([]uint64, 1<<16)
	for i := range hs {
		if i%2 == 0 {
			hs[i], _, _, _ = scaleEntry(rng.IntN(benchEntries), 64)
		} else {
			hs[i] = rng.Uint64()
		}
	}
	b.ReportAllocs()
	i, n := 0, 0
	for b.Loop() {
		n += v.Lookup(hs[i&(len(hs)-1)]).Len()
		i++
	}
	if n == 0 {
		b.Fatal("no hits")
	}
}

// prefixScenarios are prompts of 2,000 blocks against the 4M-entry
// snapshot over 64 endpoints.
var prefixScenarios = []struct {
	name string
	runs func(slot int) (blocks, gpu int)
}{
	// A system prompt of 200 blocks cached everywhere, the conversation
	// on two endpoints (one partly offloaded), the rest new.
	{"shared-prefix", func(s int) (int, int) {
		switch s {
		case 7:
			return 1500, 1500
		case 9:
			return 1200, 900
		}
		return 200, 200
	}},
	// Every endpoint holds a different length: the worst case.
	{"distinct-runs", func(s int) (int, int) { return 30 * (s + 1), 30 * (s + 1) }},
	// Nothing cached.
	{"cold", func(int) (int, int) { return 0, 0 }},
}

// prefixView returns the 4M-entry view with a 2,000-block prompt stored
// according to runs, and the prompt.
func prefixView(b *testing.B, runs func(int) (int, int)) (*View, []uint64) {
	bl, _ := bench4M()
	rng := rand.New(rand.NewPCG(xxhash.Sum64String(b.Name()), 7))
	hashes := chain(rng, 2000)
	for s := range 64 {
		l, g := runs(s)
		for i := range l {
			t := TierCPU
			if i < g {
				t = TierGPU
			}
			bl.Add(s, hashes[i], t)
		}
	}
	st := newStore()
	st.fetch(b, bl.Build(epoch))
	v := NewView(st.keys)
	if _, err := v.Refresh(st.get); err != nil {
		b.Fatal(err)
	}
	return v, hashes
}

func BenchmarkPrefix(b *testing.B) {
	for _, sc := range prefixScenarios {
		b.Run(sc.name, func(b *testing.B) {
			v, hashes := prefixView(b, sc.runs)
			out := make([]Match, 64)
			probes := v.Prefix(hashes, out)
			for s := range 64 {
				if l, g := sc.runs(s); out[s] != (Match{int32(l), int32(g)}) {
					b.Fatalf("endpoint %d: %+v, want %d/%d", s, out[s], l, g)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				v.Prefix(hashes, out)
			}
			b.ReportMetric(float64(probes), "lookups")
		})
	}
}

// BenchmarkChurn measures what one sync interval costs a reader at 4M
// entries over 64 endpoints: each interval removes churn/2 random entries,
// adds churn/2 new ones and changes every endpoint's load, then builds,
// fetches the diff bundle and refreshes a reader. After 40 intervals of
// warm-up each iteration is one interval. Run it with -benchtime=40x.
//
// By default it runs 256 shards at 0.31% churn; with -args -sweep it
// sweeps shard counts, churn rates and the delta (several minutes).
//
// Metrics: B/refresh and reads/refresh are what a worker copies and how
// many shared-data values it reads per interval, max-B/refresh the most in
// one interval; build-ms is cachesync's Build; delta-entries is the delta's
// size; view-bytes is what a worker holds.
func BenchmarkChurn(b *testing.B) {
	type config struct {
		shardBits int
		churn     int // changed entries per interval
		budget    int // DeltaBudget
	}
	configs := []config{{DefaultShardBits, 12_800, 0}}
	if *sweep {
		configs = nil
		for _, bits := range []int{4, 6, 8, 10, 12} {
			configs = append(configs, config{bits, 12_800, 0})
		}
		configs = append(configs, config{8, 4_000, 0}, config{8, 40_000, 0}, config{8, 12_800, -1}, config{12, 12_800, -1})
	}
	for _, c := range configs {
		name := "shards=" + strconv.Itoa(1<<c.shardBits) + "/churn=" + strconv.FormatFloat(100*float64(c.churn)/benchEntries, 'f', 2, 64) + "%"
		if c.budget < 0 {
			name += "/no-delta"
		}
		b.Run(name, func(b *testing.B) {
			f := churnFixture(b, name, c.shardBits, c.budget)
			f.rounds(b, c.churn, 40, nil)
			var rs RefreshStats
			var build time.Duration
			peak := 0
			b.ResetTimer()
			for range b.N {
				before := rs.Bytes
				f.rounds(b, c.churn, 1, &rs)
				build += f.build
				peak = max(peak, rs.Bytes-before)
			}
			b.ReportMetric(float64(rs.Bytes)/float64(b.N), "B/refresh")
			b.ReportMetric(float64(peak), "max-B/refresh")
			b.ReportMetric(float64(rs.Calls)/float64(b.N), "reads/refresh")
			b.ReportMetric(float64(build.Milliseconds())/float64(b.N), "build-ms")
			b.ReportMetric(float64(f.b.dirty), "delta-entries")
			b.ReportMetric(float64(f.v.Size()), "view-bytes")
		})
	}
}

type churnState struct {
	name  string
	b     *Builder
	st    *store
	v     *View
	rng   *rand.Rand
	live  []int // synthetic entries present
	next  int
	build time.Duration
}

var lastChurn *churnState

func churnFixture(b *testing.B, name string, bits, budget int) *churnState {
	if lastChurn != nil && lastChurn.name == name {
		return lastChurn
	}
	lastChurn = nil
	f := &churnState{name: name, b: newBuilder(b, BuilderConfig{ShardBits: bits, DeltaBudget: budget}, 64), st: newStore(), rng: rand.New(rand.NewPCG(1, 1))}
	fillScale(b, f.b, 0, benchEntries, 64)
	f.live = make([]int, benchEntries)
	for i := range f.live {
		f.live[i] = i
	}
	f.next = benchEntries
	f.st.fetch(b, f.b.Build(epoch))
	f.v = NewView(f.st.keys)
	if _, err := f.v.Refresh(f.st.get); err != nil {
		b.Fatal(err)
	}
	lastChurn = f
	return f
}

func (f *churnState) rounds(b *testing.B, churn, n int, total *RefreshStats) {
	for range n {
		for range churn / 2 {
			k := f.rng.IntN(len(f.live))
			h, slots, cnt, tier := scaleEntry(f.live[k], 64)
			for _, s := range slots[:cnt] {
				f.b.Remove(s, h, tier)
			}
			f.live[k] = f.next
			fillScale(b, f.b, f.next, f.next+1, 64)
			f.next++
		}
		for s := range 64 {
			info := endpointInfo(s)
			info.Running = f.rng.IntN(100)
			if _, err := f.b.SetEndpoint(info); err != nil {
				b.Fatal(err)
			}
		}
		start := time.Now()
		im := f.b.Build(epoch)
		f.build = time.Since(start)
		f.st.fetch(b, im)
		rs, err := f.v.Refresh(f.st.get)
		if err != nil {
			b.Fatal(err)
		}
		if total != nil {
			total.Bytes += rs.Bytes
			total.Calls += rs.Calls
		}
	}
}
