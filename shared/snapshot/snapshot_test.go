package snapshot

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute/shared/predict"
	"github.com/kvroute/kvroute/shared/prompt"
)

func TestRoundTrip(t *testing.T) {
	b := newBuilder(t, BuilderConfig{ShardBits: 2}, 5)
	if _, err := b.SetEndpoint(EndpointInfo{Addr: "10.1.0.9:8000", Models: []string{"qwen"}, Adapters: []string{"sql-lora"}, Health: HealthDraining}); err != nil {
		t.Fatal(err)
	}
	m := model{}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		h := rng.Uint64()
		// 1, 2 or 3+ holders, on either tier, some on both.
		for s := range 1 + i%6 {
			tier := Tier(rng.IntN(2))
			b.Add(s, h, tier)
			m.add(h, s, tier)
			if i%7 == 0 {
				b.Add(s, h, TierCPU)
				m.add(h, s, TierCPU)
			}
		}
	}
	st := newStore()
	st.fetch(t, b.Build(epoch))
	v := NewView(st.keys)
	rs, err := v.Refresh(st.get)
	if err != nil {
		t.Fatal(err)
	}
	if !rs.Changed || rs.Calls != 3+4 {
		t.Errorf("first Refresh = %+v, want a change over 7 reads", rs)
	}
	checkView(t, v, m, 1000, rng)

	man := v.Manifest()
	if man.Generation() != 1 || !man.Created().Equal(epoch) || man.NumShards() != 4 || man.NumEndpoints() != 6 {
		t.Errorf("manifest gen %d created %v shards %d endpoints %d", man.Generation(), man.Created(), man.NumShards(), man.NumEndpoints())
	}
	e := man.Endpoint(3)
	if e.Addr() != "10.0.0.3:8000" || e.Health() != HealthHealthy || e.Running() != 3 || e.Waiting() != 0 ||
		e.PrefillTokens() != 3000 || e.KVCacheUsage() != 0.5 || e.PrefillRate() != 15928 || e.Since() != 1 {
		t.Errorf("endpoint 3 = %s %v %d %d %d %v %v since %d", e.Addr(), e.Health(), e.Running(), e.Waiting(), e.PrefillTokens(), e.KVCacheUsage(), e.PrefillRate(), e.Since())
	}
	if at, ok := e.LoadAt(); !ok || !at.Equal(epoch.Add(-750*time.Millisecond)) {
		t.Errorf("endpoint 3's load read at %v (%v), want 750 ms before the build", at, ok)
	}
	if e.ShowsReports() == man.Endpoint(2).ShowsReports() || !e.ShowsReports() {
		t.Errorf("endpoints 3 and 2 show reports: %v and %v, want true and false", e.ShowsReports(), man.Endpoint(2).ShowsReports())
	}
	if at, ok := man.Endpoint(2).LoadAt(); ok {
		t.Errorf("endpoint 2's load read at %v, want unknown", at)
	}
	llama, qwen, lora := man.Model("meta-llama/Llama-3.1-8B-Instruct"), man.Model("qwen"), man.Model("sql-lora")
	if llama < 0 || qwen < 0 || lora < 0 || man.Model("gpt-4") != -1 {
		t.Fatalf("model ids %d %d %d", llama, qwen, lora)
	}
	q := man.Endpoint(5)
	if !q.Serves(qwen) || !q.Serves(lora) || q.Serves(llama) || e.Serves(qwen) || !e.Serves(llama) {
		t.Error("Serves disagrees with the models set")
	}
	if q.Health() != HealthDraining {
		t.Errorf("endpoint 5 health %v", q.Health())
	}
	if name, adapter := q.Model(1); name != "sql-lora" || !adapter || q.NumModels() != 2 {
		t.Errorf("endpoint 5 model 1 = %q adapter %v of %d", name, adapter, q.NumModels())
	}

	// An unchanged head costs one small read.
	rs, err = v.Refresh(st.get)
	if err != nil || rs.Changed || rs.Calls != 1 || rs.Bytes != headSize {
		t.Errorf("idle Refresh = %+v, %v", rs, err)
	}
}

// TestIncremental runs random index and endpoint changes through many
// generations and checks the view against the model after each refresh,
// with a delta budget small enough that shards compact all the time.
func TestIncremental(t *testing.T) {
	for _, budget := range []int{-1, 50, 0} {
		b := newBuilder(t, BuilderConfig{ShardBits: 3, DeltaBudget: budget, FirstGeneration: 1000}, 8)
		m := model{}
		rng := rand.New(rand.NewPCG(3, uint64(budget+10)))
		st := newStore()
		v := NewView(st.keys)
		var keys []uint64
		for gen := range 60 {
			for range 1 + rng.IntN(200) {
				slot := rng.IntN(8)
				if !b.live(slot) {
					continue
				}
				tier := Tier(rng.IntN(2))
				if len(keys) == 0 || rng.IntN(3) > 0 {
					h := rng.Uint64()
					if rng.IntN(4) == 0 && len(keys) > 0 {
						h = keys[rng.IntN(len(keys))] // more holders for a known block
					} else {
						keys = append(keys, h)
					}
					b.Add(slot, h, tier)
					m.add(h, slot, tier)
				} else {
					h := keys[rng.IntN(len(keys))]
					b.Remove(slot, h, tier)
					m.remove(h, slot, tier)
				}
			}
			switch gen % 20 {
			case 7: // an engine restarts
				b.ClearEndpoint(2)
				m.clearSlot(2)
			case 13: // an endpoint leaves and another takes its slot in the same generation
				addr := endpointInfo(5).Addr
				b.RemoveEndpoint(addr)
				m.clearSlot(5)
				info := endpointInfo(5)
				info.Addr = "10.9.9.9:8000"
				if slot, err := b.SetEndpoint(info); err != nil || slot != 5 {
					t.Fatalf("reused slot = %d, %v", slot, err)
				}
			case 17: // and the new one leaves again, freeing the slot
				b.RemoveEndpoint("10.9.9.9:8000")
				m.clearSlot(5)
			case 18:
				if slot, err := b.SetEndpoint(endpointInfo(5)); err != nil || slot != 5 {
					t.Fatalf("re-add = %d, %v", slot, err)
				}
			}
			im := b.Build(epoch)
			st.fetch(t, im)
			if _, err := v.Refresh(st.get); err != nil {
				t.Fatalf("budget %d gen %d: %v", budget, gen, err)
			}
			if v.Size() != im.Size() {
				t.Fatalf("view holds %d bytes, image has %d", v.Size(), im.Size())
			}
			if got := b.Entries(); got != len(m) {
				t.Fatalf("Entries() = %d, model has %d", got, len(m))
			}
			checkView(t, v, m, 50, rng)
			if budget > 0 && b.dirty > budget {
				t.Fatalf("delta holds %d entries over a budget of %d", b.dirty, budget)
			}
			if budget < 0 && b.dirty != 0 {
				t.Fatalf("delta holds %d entries with the delta disabled", b.dirty)
			}
		}
		if e := v.Manifest().Endpoint(5); e.Addr() != endpointInfo(5).Addr || e.Since() <= 1000 {
			t.Errorf("slot 5 = %s since %d", e.Addr(), e.Since())
		}
	}
}

// TestRefreshKeepsOld checks that a refresh meeting parts of another
// generation, or corrupt ones, adopts nothing and can succeed later.
func TestRefreshKeepsOld(t *testing.T) {
	b := newBuilder(t, BuilderConfig{ShardBits: 2}, 3)
	m := model{}
	rng := rand.New(rand.NewPCG(5, 6))
	add := func(n int) {
		for range n {
			h := rng.Uint64()
			b.Add(0, h, TierGPU)
			m.add(h, 0, TierGPU)
		}
	}
	add(100)
	st := newStore()
	st.fetch(t, b.Build(epoch))
	v := NewView(st.keys)
	if _, err := v.Refresh(st.get); err != nil {
		t.Fatal(err)
	}
	old := maps_clone(m)
	add(100)
	im := b.Build(epoch)

	// The fetcher has stored the new delta but not yet the manifest.
	bd, err := ParseBundle(im.AppendBundle(nil, 1))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range bd.Parts() {
		if p.Kind == KindDelta {
			st.kv[st.keys.Part(p)] = p.Data
		}
	}
	checkView(t, v, old, 0, rng) // the old delta is held; the new one is not read
	st.kv[st.keys.Head()] = bd.Manifest().AppendHead(nil)
	if _, err := v.Refresh(st.get); !errors.Is(err, ErrInconsistent) {
		t.Fatalf("head ahead of the manifest: %v, want ErrInconsistent", err)
	}
	checkView(t, v, old, 0, rng)

	// All stored, but the delta (the part that changed) is corrupt.
	st.held = nil
	st.fetch(t, im)
	key := st.keys.Delta()
	good := st.kv[key]
	bad := slices.Clone(good)
	bad[len(bad)/2] ^= 1
	st.kv[key] = bad
	if _, err := v.Refresh(st.get); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("corrupt delta: %v, want ErrCorrupt", err)
	}
	if v.Manifest().Generation() != 1 {
		t.Fatal("view adopted a generation with a corrupt delta")
	}
	checkView(t, v, old, 0, rng)
	st.kv[key] = good
	if rs, err := v.Refresh(st.get); err != nil || !rs.Changed {
		t.Fatalf("Refresh after repair = %+v, %v", rs, err)
	}
	checkView(t, v, m, 100, rng)

	// A missing key is reported with its name.
	delete(st.kv, st.keys.Head())
	if _, err := v.Refresh(st.get); !errors.Is(err, errNotFound) {
		t.Fatalf("missing head: %v", err)
	}
}

func maps_clone(m model) model {
	c := model{}
	for h, s := range m {
		for slot, mask := range s {
			if c[h] == nil {
				c[h] = map[int]uint8{}
			}
			c[h][slot] = mask
		}
	}
	return c
}

func TestManifestBytesPerToken(t *testing.T) {
	for _, bpt := range []float64{0, 3.5, 4} {
		b := newBuilder(t, BuilderConfig{ShardBits: 1, BytesPerToken: bpt}, 1)
		m, err := ParseManifest(b.Build(epoch).manifest)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.BytesPerToken(); got != bpt {
			t.Errorf("BytesPerToken = %v, want %v", got, bpt)
		}
	}
	for _, bad := range []float64{-1, MaxBytesPerToken + 1, math.NaN()} {
		if _, err := NewBuilder(BuilderConfig{BytesPerToken: bad}); err == nil {
			t.Errorf("builder accepted %v bytes per token", bad)
		}
	}
}

// TestEndpointLoadTerms: the blocks the index holds per endpoint are
// counted whatever the tiers, published with the capacity and the latency
// model, and cleared with the endpoint.
func TestEndpointLoadTerms(t *testing.T) {
	b := newBuilder(t, BuilderConfig{ShardBits: 2}, 0)
	mdl := predict.Default(20000)
	mdl.TTFTSamples = 99
	slot, err := b.SetEndpoint(EndpointInfo{Addr: "10.0.0.1:8000", Health: HealthHealthy, IndexCapacity: 5000, Model: mdl})
	if err != nil {
		t.Fatal(err)
	}
	other, _ := b.SetEndpoint(EndpointInfo{Addr: "10.0.0.2:8000", Health: HealthHealthy})
	for h := uint64(1); h <= 10; h++ {
		b.Add(slot, h, TierGPU)
		b.Add(other, h, TierGPU)
	}
	b.Add(slot, 3, TierCPU)    // a second tier of a held block: still one
	b.Add(slot, 11, TierCPU)   // a CPU-only block counts
	b.Remove(slot, 1, TierGPU) // gone from its only tier
	b.Remove(slot, 99, TierGPU)
	if got := b.Held(slot); got != 10 {
		t.Fatalf("Held = %d, want 10", got)
	}
	for _, c := range []struct {
		slot int
		h    uint64
		tier Tier
		want bool
	}{
		{slot, 3, TierGPU, true}, {slot, 3, TierCPU, true}, {slot, 1, TierGPU, false}, {slot, 11, TierGPU, false},
		{slot, 11, TierCPU, true}, {other, 1, TierGPU, true}, {other, 3, TierCPU, false}, {slot, 99, TierGPU, false}, {7, 3, TierGPU, false},
	} {
		if got := b.Holds(c.slot, c.h, c.tier); got != c.want {
			t.Errorf("Holds(%d, %d, %v) = %v, want %v", c.slot, c.h, c.tier, got, c.want)
		}
	}
	if !b.SetPrefixes(slot, 7) || b.SetPrefixes(slot, 7) || b.SetPrefixes(9, 1) {
		t.Error("SetPrefixes: a change not reported, a non-change or an unknown slot reported")
	}
	m, err := ParseManifest(b.Build(epoch).manifest)
	if err != nil {
		t.Fatal(err)
	}
	e := m.Endpoint(slot)
	if e.IndexBlocks() != 10 || e.IndexCapacity() != 5000 || m.Endpoint(other).IndexBlocks() != 10 {
		t.Errorf("row: %d blocks of %d, other %d", e.IndexBlocks(), e.IndexCapacity(), m.Endpoint(other).IndexBlocks())
	}
	if e.Prefixes() != 7 || m.Endpoint(other).Prefixes() != 0 {
		t.Errorf("prefixes %d and %d, want 7 and 0", e.Prefixes(), m.Endpoint(other).Prefixes())
	}
	if got := e.LatencyModel(); got != mdl {
		t.Errorf("model %+v, want %+v", got, mdl)
	}
	b.ClearEndpoint(slot)
	if b.Held(slot) != 0 || b.Held(other) != 10 {
		t.Errorf("after clearing: %d and %d", b.Held(slot), b.Held(other))
	}
	bad := mdl
	bad.ITLCoef[0] = -1
	if _, err := b.SetEndpoint(EndpointInfo{Addr: "10.0.0.3:8000", Model: bad}); err == nil {
		t.Error("a model with a negative coefficient was taken")
	}
}

// TestModelTemplate: each endpoint's template is published, and a model's
// template is the one most of its endpoints render with, unknown ones not
// counting.
func TestModelTemplate(t *testing.T) {
	b := newBuilder(t, BuilderConfig{ShardBits: 1}, 0)
	for i, e := range []struct {
		model string
		tmpl  prompt.Template
	}{
		{"qwen", prompt.ChatML}, {"qwen", prompt.ChatML}, {"qwen", prompt.Llama3}, {"qwen", prompt.Plain},
		{"llama", prompt.Llama3}, {"gemma", prompt.Plain}, {"tie", prompt.Gemma}, {"tie", prompt.Mistral},
	} {
		addr := "10.0.0." + strconv.Itoa(i) + ":8000"
		if _, err := b.SetEndpoint(EndpointInfo{Addr: addr, Models: []string{e.model}, Template: e.tmpl}); err != nil {
			t.Fatal(err)
		}
	}
	m, err := ParseManifest(b.Build(epoch).manifest)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Endpoint(2).Template(); got != prompt.Llama3 {
		t.Errorf("endpoint 2 renders with %v, want llama3", got)
	}
	for _, c := range []struct {
		model string
		want  prompt.Template
	}{{"qwen", prompt.ChatML}, {"llama", prompt.Llama3}, {"gemma", prompt.Plain}, {"tie", prompt.Mistral}} {
		if got := m.ModelTemplate(m.Model(c.model)); got != c.want {
			t.Errorf("ModelTemplate(%s) = %v, want %v", c.model, got, c.want)
		}
	}
	if got := m.ModelTemplate(-1); got != prompt.Plain {
		t.Errorf("ModelTemplate of an unknown model = %v, want plain", got)
	}
}
