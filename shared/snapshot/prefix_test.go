package snapshot

import (
	"math/rand/v2"
	"testing"
)

// chain returns n distinct random block hashes.
func chain(rng *rand.Rand, n int) []uint64 {
	h := make([]uint64, n)
	for i := range h {
		h[i] = rng.Uint64()
	}
	return h
}

// linear is the reference walk: one lookup per block.
func linear(m model, hashes []uint64, slots int) []Match {
	out := make([]Match, slots)
	for s := range out {
		for out[s].Blocks < int32(len(hashes)) && m[hashes[out[s].Blocks]][s] != 0 {
			out[s].Blocks++
		}
		for out[s].GPU < int32(len(hashes)) && m[hashes[out[s].GPU]][s]&maskGPU != 0 {
			out[s].GPU++
		}
	}
	return out
}

func TestPrefix(t *testing.T) {
	tests := []struct {
		name         string
		endpoints    int
		blocks       int
		distinctRuns int // run lengths drawn from this many values; 0 = any
	}{
		{"one block", 3, 1, 0},
		{"two blocks", 3, 2, 0},
		{"short", 8, 17, 0},
		{"shared prefix few runs", 64, 2000, 3},
		{"every endpoint its own run", 64, 2000, 0},
		{"300 endpoints", 300, 700, 0},
		{"max chain", 16, 8192, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tc.endpoints), uint64(tc.blocks)))
			b := newBuilder(t, BuilderConfig{ShardBits: 4}, tc.endpoints)
			m := model{}
			hashes := chain(rng, tc.blocks)
			runs := make([]int, tc.distinctRuns)
			for i := range runs {
				runs[i] = rng.IntN(tc.blocks + 1)
			}
			for s := range tc.endpoints {
				l := rng.IntN(tc.blocks + 1)
				if len(runs) > 0 {
					l = runs[rng.IntN(len(runs))]
				}
				g := rng.IntN(l + 1)
				if rng.IntN(3) == 0 || len(runs) > 0 {
					g = l // wholly on the GPU
				}
				for i := range l {
					tier := TierCPU
					if i < g {
						tier = TierGPU
					}
					b.Add(s, hashes[i], tier)
					m.add(hashes[i], s, tier)
				}
			}
			for range 5000 { // unrelated entries
				h, s := rng.Uint64(), rng.IntN(tc.endpoints)
				b.Add(s, h, TierGPU)
				m.add(h, s, TierGPU)
			}
			v := publish(t, b)
			out := make([]Match, tc.endpoints)
			probes := v.Prefix(hashes, out)
			want := linear(m, hashes, tc.endpoints)
			for s := range want {
				if out[s] != want[s] {
					t.Fatalf("endpoint %d: got %+v, want %+v", s, out[s], want[s])
				}
			}
			if tc.distinctRuns > 0 && probes > 2+4*tc.distinctRuns*bitsLen(tc.blocks) {
				t.Errorf("%d probes for %d distinct runs over %d blocks", probes, tc.distinctRuns, tc.blocks)
			}
			t.Logf("%d probes", probes)
		})
	}
}

func bitsLen(n int) int {
	b := 0
	for ; n > 0; n >>= 1 {
		b++
	}
	return b
}

// TestPrefixHoles checks the walk on runs with evicted blocks in the
// middle: every answer must still end a held run, and nothing panics.
func TestPrefixHoles(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for trial := range 50 {
		const endpoints, blocks = 12, 300
		b := newBuilder(t, BuilderConfig{ShardBits: 2}, endpoints)
		m := model{}
		hashes := chain(rng, blocks)
		for s := range endpoints {
			for i := range blocks {
				if rng.IntN(4) > 0 {
					tier := Tier(rng.IntN(2))
					b.Add(s, hashes[i], tier)
					m.add(hashes[i], s, tier)
				}
			}
		}
		v := publish(t, b)
		out := make([]Match, endpoints)
		v.Prefix(hashes, out)
		for s, got := range out {
			holds := func(i int) bool { return i >= 0 && i < blocks && m[hashes[i]][s] != 0 }
			k := int(got.Blocks)
			if (k == 0) == holds(0) || (k > 0 && !holds(k-1)) || holds(k) || got.GPU > got.Blocks || got.GPU < 0 {
				t.Fatalf("trial %d endpoint %d: %+v does not end a held run", trial, s, got)
			}
		}
	}
}

// publish builds, fetches and refreshes a view of b's state.
func publish(t testing.TB, b *Builder) *View {
	t.Helper()
	st := newStore()
	st.fetch(t, b.Build(epoch))
	v := NewView(st.keys)
	if _, err := v.Refresh(st.get); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestNoAllocs holds the per-request operations to zero allocations.
func TestNoAllocs(t *testing.T) {
	b := newBuilder(t, BuilderConfig{ShardBits: 4}, 8)
	rng := rand.New(rand.NewPCG(1, 1))
	hashes := chain(rng, 500)
	for s := range 8 {
		for _, h := range hashes[:60*s] {
			b.Add(s, h, TierGPU)
		}
	}
	b.Build(epoch)
	for _, h := range hashes[:50] {
		b.Add(0, h, TierCPU) // some entries in the delta
	}
	v := publish(t, b)
	out := make([]Match, 8)
	m := v.Manifest()
	ops := map[string]func(){
		"Lookup": func() { v.Lookup(hashes[7]) },
		"Prefix": func() { v.Prefix(hashes, out) },
		"Model":  func() { m.Model("meta-llama/Llama-3.1-8B-Instruct") },
		"Endpoint": func() {
			e := m.Endpoint(3)
			_ = e.Serves(0) && e.Health() == HealthHealthy && e.Running()+e.Waiting()+e.PrefillTokens() > 0 && e.PrefillRate() > e.KVCacheUsage()
		},
	}
	for name, op := range ops {
		if n := testing.AllocsPerRun(100, op); n != 0 {
			t.Errorf("%s: %v allocations", name, n)
		}
	}
}
