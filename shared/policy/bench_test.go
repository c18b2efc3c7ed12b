package policy

import (
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/shared/snapshot"
)

// benchSnapshot is a 4M-entry index over 64 endpoints with 2,000-block
// prompts stored in it, built once for the benchmarks.
type benchSnapshot struct {
	v       *snapshot.View
	prompts map[string][][]uint64
}

// Prompt scenarios: how many blocks of a prompt endpoint s holds, and how
// many of those on the GPU.
var scenarios = []struct {
	name string
	runs func(s int) (blocks, gpu int)
}{
	// A 200-block system prompt everywhere, the conversation on two
	// endpoints (one partly offloaded), the rest of the prompt new.
	{"shared-prefix", func(s int) (int, int) {
		switch s {
		case 7:
			return 1900, 1900
		case 9:
			return 1200, 900
		}
		return 200, 200
	}},
	// Every endpoint holds a different length: the walk's worst case.
	{"distinct-runs", func(s int) (int, int) { return 30 * (s + 1), 30 * (s + 1) }},
	// Nothing cached.
	{"cold", func(int) (int, int) { return 0, 0 }},
}

var bench = sync.OnceValue(func() *benchSnapshot {
	const entries, endpoints = 4 << 20, 64
	b, err := snapshot.NewBuilder(snapshot.BuilderConfig{})
	if err != nil {
		panic(err)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	for s := range endpoints {
		backlog, running, waiting := rng.IntN(100_000), rng.IntN(50), rng.IntN(5)
		if s == 7 {
			// The warm endpoint of shared-prefix can take the request:
			// a short backlog, and a batch that decodes within
			// decodeSaturation of the pool's idlest.
			backlog, running, waiting = 2000, 4, 0
		}
		if _, err := b.SetEndpoint(snapshot.EndpointInfo{
			Addr:   "10.0.0." + strconv.Itoa(s) + ":8000",
			Models: []string{model}, Health: snapshot.HealthHealthy,
			Running: running, Waiting: waiting, PrefillTokens: backlog, PrefillRate: 15928,
			IndexCapacity: 1 << 18,
		}); err != nil {
			panic(err)
		}
	}
	bs := &benchSnapshot{prompts: map[string][][]uint64{}}
	for _, sc := range scenarios {
		// 256 prompts per scenario, so that a run of the benchmark
		// touches more of the index than the caches hold.
		for range 256 {
			hashes := make([]uint64, promptBlocks)
			for i := range hashes {
				hashes[i] = rng.Uint64()
			}
			for s := range endpoints {
				l, g := sc.runs(s)
				for i := range l {
					t := snapshot.TierCPU
					if i < g {
						t = snapshot.TierGPU
					}
					b.Add(s, hashes[i], t)
				}
			}
			bs.prompts[sc.name] = append(bs.prompts[sc.name], hashes)
		}
	}
	for b.Entries() < entries {
		h := rng.Uint64()
		for range 1 + rng.IntN(2) {
			b.Add(rng.IntN(endpoints), h, snapshot.Tier(rng.IntN(2)))
		}
	}
	bd, err := snapshot.ParseBundle(b.Build(time.Unix(1_790_000_000, 0)).AppendBundle(nil, 0))
	if err != nil {
		panic(err)
	}
	keys := snapshot.NewKeys("b/")
	kv := map[string][]byte{}
	for _, p := range bd.Parts() {
		kv[keys.Part(p)] = p.Data
	}
	kv[keys.Head()] = bd.Manifest().AppendHead(nil)
	bs.v = snapshot.NewView(keys)
	if _, err := bs.v.Refresh(func(k string) ([]byte, error) { return kv[k], nil }); err != nil {
		panic(err)
	}
	return bs
})

// BenchmarkPick measures one decision over 64 endpoints for a 2,000-block
// prompt against a 4M-entry snapshot. "one-prompt" repeats one prompt (its
// index entries stay in cache); "256-prompts" cycles through 256, as a
// gateway serving many conversations does.
func BenchmarkPick(b *testing.B) {
	bs := bench()
	for _, sc := range scenarios {
		for _, many := range []bool{false, true} {
			name := sc.name + "/one-prompt"
			if many {
				name = sc.name + "/256-prompts"
			}
			b.Run(name, func(b *testing.B) {
				p := picker(b, nil)
				prompts := bs.prompts[sc.name]
				if !many {
					prompts = prompts[:1]
				}
				local := make([]Local, 64)
				r := Request{Model: model, Local: local}
				start := time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC) // the filter's path: decode saturation's clocks kept
				var d Decision
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					r.Hashes = prompts[i%len(prompts)]
					r.Random = uint64(i) * 0x9e3779b97f4a7c15
					r.Now = start.Add(time.Duration(i) * time.Millisecond)
					local[i%64].PrefillTokens = int64(i % 5000)
					d = p.Pick(bs.v, &r)
					i++
				}
				b.ReportMetric(float64(d.Lookups), "lookups")
				if sc.name == "shared-prefix" && d.Endpoint != 7 {
					b.Errorf("chose %d (%v), want the warm endpoint 7", d.Endpoint, d.Reason)
				}
			})
		}
	}
}
