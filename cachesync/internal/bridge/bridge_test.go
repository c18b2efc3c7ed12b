package bridge

import (
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/kvroute/kvroute/cachesync/internal/kvevents"
	"github.com/kvroute/kvroute/shared/blockhash"
	"github.com/kvroute/kvroute/shared/snapshot"
)

var small = blockhash.Config{BlockSize: 8}

func tinyDecode(ids []uint32) string { return tinyText(ids) }

// TestRandomHistories drives a reference engine through random stores
// (sharing prefixes, with adapters), removals, offloads and clears, and
// after every batch compares the sink with the text blocks blockhash.Append
// finds in the text of every held block's chain.
func TestRandomHistories(t *testing.T) {
	v := tinyVocab(t)
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 7))
		m := newModel(1+r.IntN(4), "tiny-model")
		s := newSetSink(t)
		e := newEngine(t, Config{Model: "tiny-model", Vocab: v, Hash: small}, s)
		var chains [][]uint32
		held := func() []uint64 {
			var hs []uint64
			for h := range m.blocks {
				hs = append(hs, h)
			}
			slices.Sort(hs)
			return hs
		}
		for step := range 300 {
			switch op := r.IntN(20); {
			case op < 8:
				var toks []uint32
				if len(chains) > 0 && r.IntN(3) > 0 {
					c := chains[r.IntN(len(chains))]
					toks = append(toks, c[:r.IntN(len(c)+1)]...)
				}
				for range r.IntN(20) {
					toks = append(toks, uint32(r.IntN(len(tinyTokens))))
				}
				chains = append(chains, toks)
				lora := ""
				if r.IntN(5) == 0 {
					lora = "adapter-1"
				}
				m.store(0, toks, "GPU", lora)
			case op < 12:
				if hs := held(); len(hs) > 0 {
					m.remove(hs[r.IntN(len(hs))], "GPU")
				}
			case op < 15:
				if hs := held(); len(hs) > 0 {
					m.offload(hs[r.IntN(len(hs))], "CPU")
				}
			case op < 17:
				if hs := held(); len(hs) > 0 {
					m.remove(hs[r.IntN(len(hs))], "CPU")
				}
			case op == 17 && step%50 == 0:
				m.clearGPU()
			case op == 18:
				if hs := held(); len(hs) > 0 {
					m.reuse(hs[r.IntN(len(hs))])
				}
			default:
				m.flush(e)
				check(t, m, s, tinyDecode, small)
			}
		}
		m.flush(e)
		check(t, m, s, tinyDecode, small)
		if st := e.Stats(); st.Skipped != [numSkips]uint64{} {
			t.Fatalf("seed %d: skipped %v", seed, st.Skipped)
		}
	}
}

// TestSameTextTwoTokenizations: two engine blocks completing the same text
// block both back it; removing one keeps it, removing both drops it; and a
// GPU removal leaves the CPU copy.
func TestSameTextTwoTokenizations(t *testing.T) {
	v := tinyVocab(t)
	m := newModel(4, "m")
	s := newSetSink(t)
	e := newEngine(t, Config{Model: "m", Vocab: v, Hash: small}, s)
	// "abababab" twice: as four "ab", and as "a" "b" ... in two blocks.
	one := m.store(0, []uint32{2, 2, 2, 2}, "GPU", "")
	two := m.store(0, []uint32{0, 1, 0, 1, 0, 1, 0, 1}, "GPU", "")
	m.flush(e)
	want := blockhash.Append(nil, blockhash.Seed("m", ""), []byte("abababab"), small)
	if got := s.tier(snapshot.TierGPU); !slices.Equal(got, want) {
		t.Fatalf("GPU holds %x, want %x", got, want)
	}
	m.offload(one[0], "CPU")
	m.remove(one[0], "GPU")
	m.flush(e)
	check(t, m, s, tinyDecode, small)
	if len(s.tier(snapshot.TierGPU)) != 1 || len(s.tier(snapshot.TierCPU)) != 1 {
		t.Fatalf("after the first block's removal: %v", s.set)
	}
	m.remove(two[1], "GPU")
	m.flush(e)
	if len(s.tier(snapshot.TierGPU)) != 0 || len(s.tier(snapshot.TierCPU)) != 1 {
		t.Fatalf("after both removals: %v", s.set)
	}
}

// TestOffloadAfterEviction: an offload event that follows the GPU removal
// of the same block (as the simulator and offloading connectors order
// them) still resolves the block.
func TestOffloadAfterEviction(t *testing.T) {
	v := tinyVocab(t)
	m := newModel(2, "m")
	s := newSetSink(t)
	e := newEngine(t, Config{Model: "m", Vocab: v, Hash: small}, s)
	hs := m.store(0, []uint32{4, 3, 5, 6, 4, 3, 5, 6}, "GPU", "")
	m.flush(e)
	for i := len(hs) - 1; i >= 0; i-- {
		m.remove(hs[i], "GPU")
		m.offload(hs[i], "CPU")
	}
	m.flush(e)
	check(t, m, s, tinyDecode, small)
	if len(s.tier(snapshot.TierCPU)) == 0 || len(s.tier(snapshot.TierGPU)) != 0 {
		t.Fatalf("holds %v", s.set)
	}
	if st := e.Stats(); st.Stored != 8 || st.Removed != 4 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSkips(t *testing.T) {
	v := tinyVocab(t)
	toks := []uint32{4, 3, 5, 6}
	tests := []struct {
		name string
		ev   kvevents.Event
		why  Skip
		kept int // blocks before the skipped one
	}{
		{"unknown parent", kvevents.Event{Hashes: []uint64{1, 2}, Parent: 99, HasParent: true, Tokens: append(toks, toks...), BlockSize: 4}, SkipUnknownParent, 0},
		{"unknown offload", kvevents.Event{Hashes: []uint64{1}, BlockSize: 4, Medium: "CPU"}, SkipUnknownBlock, 0},
		{"cache salt past the first block", kvevents.Event{Hashes: []uint64{1, 2}, Tokens: append(toks, toks...), BlockSize: 4, Extra: []kvevents.Extra{{}, {Keys: []string{"salt"}}}}, SkipExtraKeys, 1},
		{"cache salt and an image", kvevents.Event{Hashes: []uint64{1}, Tokens: toks, BlockSize: 4, Extra: []kvevents.Extra{{Keys: []string{"salt"}, Other: 1}}}, SkipExtraKeys, 0},
		{"multimodal", kvevents.Event{Hashes: []uint64{1}, Tokens: toks, BlockSize: 4, Extra: []kvevents.Extra{{Other: 1}}}, SkipExtraKeys, 0},
		{"adapter by id", kvevents.Event{Hashes: []uint64{1}, Tokens: toks, BlockSize: 4, LoRAID: 3}, SkipAdapter, 0},
		{"unknown token", kvevents.Event{Hashes: []uint64{1}, Tokens: []uint32{1, 2, 3, 1000}, BlockSize: 4}, SkipTokens, 0},
		{"token count", kvevents.Event{Hashes: []uint64{1, 2}, Tokens: toks, BlockSize: 4}, SkipShape, 0},
		{"sliding window", kvevents.Event{Hashes: []uint64{1}, Tokens: toks, BlockSize: 4, SpecKind: "sliding_window"}, SkipGroup, 0},
		{"remote", kvevents.Event{Hashes: []uint64{1}, Tokens: toks, BlockSize: 4, Locality: "REMOTE"}, SkipGroup, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSetSink(t)
			e := newEngine(t, Config{Model: "m", Vocab: v, Hash: small}, s)
			tt.ev.Kind = kvevents.BlockStored
			e.Batch(&kvevents.Batch{Events: []kvevents.Event{tt.ev}})
			st := e.Stats()
			if st.Skipped[tt.why] != uint64(len(tt.ev.Hashes)-tt.kept) || len(s.set) != tt.kept || st.Blocks != tt.kept {
				t.Fatalf("skipped %v, sink %v, %d blocks", st.Skipped, s.set, st.Blocks)
			}
		})
	}
	// A skipped block's descendants are unknown too.
	s := newSetSink(t)
	e := newEngine(t, Config{Model: "m", Vocab: v, Hash: small}, s)
	e.Batch(&kvevents.Batch{Events: []kvevents.Event{
		{Kind: kvevents.BlockStored, Hashes: []uint64{1}, Tokens: toks, BlockSize: 4, Extra: []kvevents.Extra{{Other: 1}}},
		{Kind: kvevents.BlockStored, Hashes: []uint64{2}, Parent: 1, HasParent: true, Tokens: toks, BlockSize: 4},
	}})
	if st := e.Stats(); st.Skipped[SkipExtraKeys] != 1 || st.Skipped[SkipUnknownParent] != 1 {
		t.Fatalf("skipped %v", st.Skipped)
	}
}

// TestAdapterSeed: an adapter's blocks are hashed with the adapter's name
// as the model, as the filter hashes a request naming the adapter, and
// extra keys holding just that name are fine.
func TestAdapterSeed(t *testing.T) {
	v := tinyVocab(t)
	s := newSetSink(t)
	e := newEngine(t, Config{Model: "base", Vocab: v, Hash: small}, s)
	toks := []uint32{4, 3, 5, 6} // "hello world\n"
	e.Batch(&kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: []uint64{1}, Tokens: toks, BlockSize: 4,
		LoRAID: 1, LoRAName: "sql", Extra: []kvevents.Extra{{Keys: []string{"sql"}}}}}})
	want := blockhash.Append(nil, blockhash.Seed("sql", ""), []byte("hello world\n"), small)
	if got := s.tier(snapshot.TierGPU); !slices.Equal(got, want) {
		t.Fatalf("holds %x, want %x", got, want)
	}
}

// TestCacheSaltSeed: a prompt stored with vLLM's cache_salt (a string key
// on its first block, beside an adapter's name) is hashed from the salted
// seed, as the filter hashes a request carrying that salt, children
// included.
func TestCacheSaltSeed(t *testing.T) {
	v := tinyVocab(t)
	toks := []uint32{4, 3, 5, 6} // "hello world\n"
	for _, lora := range []string{"", "sql"} {
		s := newSetSink(t)
		e := newEngine(t, Config{Model: "base", Vocab: v, Hash: small}, s)
		first := kvevents.Extra{Keys: []string{"tenant-a"}}
		var id int64
		if lora != "" {
			first.Keys, id = []string{lora, "tenant-a"}, 1
		}
		e.Batch(&kvevents.Batch{Events: []kvevents.Event{
			{Kind: kvevents.BlockStored, Hashes: []uint64{1}, Tokens: toks, BlockSize: 4, LoRAID: id, LoRAName: lora, Extra: []kvevents.Extra{first}},
			{Kind: kvevents.BlockStored, Hashes: []uint64{2}, Parent: 1, HasParent: true, Tokens: toks, BlockSize: 4, LoRAID: id, LoRAName: lora},
		}})
		model := lora
		if model == "" {
			model = "base"
		}
		want := blockhash.Append(nil, blockhash.Salted(blockhash.Seed(model, ""), "tenant-a"), []byte("hello world\nhello world\n"), small)
		if got := s.tier(snapshot.TierGPU); !sameSet(got, want) {
			t.Errorf("adapter %q: holds %x, want %x", lora, got, want)
		}
	}
}

func sameSet(a, b []uint64) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// TestTextCap: past the filter's cap on blocks, nothing is hashed, and the
// blocks after it cost no text.
func TestTextCap(t *testing.T) {
	v := tinyVocab(t)
	cfg := blockhash.Config{BlockSize: 4, MaxBlocks: 3}
	m := newModel(2, "m")
	s := newSetSink(t)
	e := newEngine(t, Config{Model: "m", Vocab: v, Hash: cfg}, s)
	m.store(0, []uint32{4, 4, 5, 5, 7, 7, 4, 5}, "GPU", "") // 34 bytes: 8 text blocks uncapped
	m.flush(e)
	check(t, m, s, tinyDecode, cfg)
	if n := len(s.tier(snapshot.TierGPU)); n != 3 {
		t.Fatalf("%d text blocks, want 3", n)
	}
}

// TestCapacity: an engine that stores more blocks than its capacity loses
// its oldest blocks from the sink too, and the sink never holds a text
// block no tracked block backs.
func TestCapacity(t *testing.T) {
	v := tinyVocab(t)
	s := newSetSink(t)
	e := newEngine(t, Config{Model: "m", Vocab: v, Hash: small, Capacity: 1}, s) // room for 1025 blocks
	m := newModel(2, "m")
	r := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		var toks []uint32
		for range 20 {
			toks = append(toks, uint32(r.IntN(len(tinyTokens))))
		}
		m.store(0, toks, "GPU", "")
		m.flush(e)
	}
	st := e.Stats()
	if st.Evicted == 0 || st.Blocks != 1025 {
		t.Fatalf("stats %+v", st)
	}
	// What the tracked blocks back is exactly what the sink holds.
	backed := map[uint64]bool{}
	for i := firstSlot; i < len(e.slab); i++ {
		en := &e.slab[i]
		if en.flags&flagUsed != 0 && en.media != 0 {
			for j := range int(en.nh) {
				backed[e.textHash(en, j)] = true
			}
		}
	}
	got := s.tier(snapshot.TierGPU)
	if len(got) != len(backed) {
		t.Fatalf("sink holds %d text blocks, tracked blocks back %d", len(got), len(backed))
	}
	for _, h := range got {
		if !backed[h] {
			t.Fatalf("sink holds %x, which no tracked block backs", h)
		}
	}
}

func TestClear(t *testing.T) {
	v := tinyVocab(t)
	s := newSetSink(t)
	e := newEngine(t, Config{Model: "m", Vocab: v, Hash: small}, s)
	m := newModel(2, "m")
	hs := m.store(0, []uint32{4, 3, 5, 6, 4, 3}, "GPU", "")
	m.flush(e)
	e.Reset(kvevents.Restart)
	if len(s.set) != 0 || s.clears != 1 || e.Stats().Blocks != 0 {
		t.Fatalf("after reset: %v, %d clears, %+v", s.set, s.clears, e.Stats())
	}
	// After a reset the engine's old blocks are unknown: a child of one is
	// skipped, a removal of one ignored.
	e.Batch(&kvevents.Batch{Events: []kvevents.Event{
		{Kind: kvevents.BlockStored, Hashes: []uint64{7}, Parent: hs[2], HasParent: true, Tokens: []uint32{4, 4}, BlockSize: 2},
		{Kind: kvevents.BlockRemoved, Hashes: hs, Medium: "GPU"},
	}})
	if st := e.Stats(); st.Skipped[SkipUnknownParent] != 1 || len(s.set) != 0 {
		t.Fatalf("stats %+v, sink %v", st, s.set)
	}
}

func TestConfig(t *testing.T) {
	v := tinyVocab(t)
	for _, cfg := range []Config{
		{Model: "m"},
		{Vocab: v},
		{Model: "m", Vocab: v, Hash: blockhash.Config{BlockSize: 300}},
		{Model: "m", Vocab: v, Capacity: -1},
	} {
		if _, err := New(cfg, newSetSink(t)); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

func TestTable(t *testing.T) {
	var tb table
	ref := map[uint64]uint32{}
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 200000 {
		k := uint64(r.IntN(5000)) // small keys, key 0 included, many collisions
		if i%3 == 0 {
			k = r.Uint64()
		}
		switch r.IntN(3) {
		case 0, 1:
			tb.put(k, uint32(i))
			ref[k] = uint32(i)
		case 2:
			tb.del(k)
			delete(ref, k)
		}
	}
	if tb.len() != len(ref) {
		t.Fatalf("%d keys, want %d", tb.len(), len(ref))
	}
	for k, v := range ref {
		if got, ok := tb.get(k); !ok || got != v {
			t.Fatalf("get(%d) = %d %v, want %d", k, got, ok, v)
		}
	}
	for k := range uint64(5000) {
		if _, ok := tb.get(k); ok != (ref[k] != 0 || hasKey(ref, k)) {
			t.Fatalf("get(%d) found %v", k, ok)
		}
	}
}

func hasKey(m map[uint64]uint32, k uint64) bool { _, ok := m[k]; return ok }

func TestEntrySize(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n != entrySize {
		t.Fatalf("an entry takes %d bytes; the memory account says %d", n, entrySize)
	}
}

// TestTierRules follows vLLM 0.33's publishers event by event: which
// removals take a copy away and which leave it.
func TestTierRules(t *testing.T) {
	v := tinyVocab(t)
	toks := []uint32{4, 3, 5, 6, 4, 3, 5, 6} // "hello world\nhello world\n": three 8-byte text blocks
	stored := func(medium, locality, ownership string) kvevents.Event {
		return kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{1, 2}, Tokens: toks, BlockSize: 4,
			Medium: medium, Locality: locality, Ownership: ownership}
	}
	offload := func(medium, locality, ownership string) kvevents.Event {
		return kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{1, 2}, Medium: medium, Locality: locality, Ownership: ownership}
	}
	removed := func(medium, locality, ownership string) kvevents.Event {
		return kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []uint64{1, 2}, Medium: medium, Locality: locality, Ownership: ownership}
	}
	cleared := kvevents.Event{Kind: kvevents.AllBlocksCleared}
	tests := []struct {
		name     string
		events   []kvevents.Event
		reset    bool // the subscriber resets the engine after the events
		gpu, cpu bool // whether the text blocks are held in each tier after
	}{
		{"a GPU reuse report is idempotent", []kvevents.Event{stored("GPU", "", ""), stored("GPU", "", ""), removed("GPU", "", "")}, false, false, false},
		{"an offloaded hash announced by two chunks stays until both go",
			[]kvevents.Event{stored("GPU", "", ""), offload("CPU", "LOCAL", ""), offload("CPU", "LOCAL", ""), removed("CPU", "LOCAL", "")}, false, true, true},
		{"... and goes with the second removal",
			[]kvevents.Event{stored("GPU", "", ""), offload("CPU", "LOCAL", ""), offload("CPU", "LOCAL", ""), removed("CPU", "LOCAL", ""), removed("CPU", "LOCAL", "")}, false, true, false},
		{"self-describing offload stores (tokens and all) count too",
			[]kvevents.Event{stored("CPU", "LOCAL", ""), stored("CPU", "LOCAL", ""), removed("CPU", "LOCAL", "")}, false, false, true},
		{"AllBlocksCleared leaves offloaded copies",
			[]kvevents.Event{stored("GPU", "", ""), offload("CPU", "", ""), cleared}, false, false, true},
		{"a REMOTE removal leaves the LOCAL copy",
			[]kvevents.Event{stored("GPU", "", ""), offload("CPU", "LOCAL", ""), removed("CPU", "REMOTE", "")}, false, true, true},
		{"a REMOTE store is not the engine's", []kvevents.Event{stored("CPU", "REMOTE", "")}, false, false, false},
		{"a secondary tier's removal leaves the primary copy",
			[]kvevents.Event{stored("GPU", "", ""), offload("CPU", "LOCAL", ""), offload("CPU", "LOCAL", "kvcr"), removed("CPU", "LOCAL", "kvcr")}, false, true, true},
		{"the primary's removal leaves the secondary tier's copy",
			[]kvevents.Event{stored("GPU", "", ""), offload("CPU", "LOCAL", ""), offload("STORAGE", "LOCAL", "kvcr"), removed("CPU", "LOCAL", ""), removed("GPU", "", "")}, false, false, true},
		{"unspecified locality is the publisher's own",
			[]kvevents.Event{stored("GPU", "", ""), offload("CPU", "", ""), removed("CPU", "LOCAL", "")}, false, true, false},
		{"an engine reset (restart) drops every tier",
			[]kvevents.Event{stored("GPU", "", ""), offload("CPU", "", "")}, true, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetSink(t)
			e := newEngine(t, Config{Model: "m", Vocab: v, Hash: small}, s)
			for i := range tc.events {
				e.Batch(&kvevents.Batch{Events: tc.events[i : i+1]})
			}
			if tc.reset {
				e.Reset(kvevents.Restart)
			}
			if got := len(s.tier(snapshot.TierGPU)) > 0; got != tc.gpu {
				t.Errorf("GPU tier holds the prefix: %v, want %v (%v)", got, tc.gpu, s.set)
			}
			if got := len(s.tier(snapshot.TierCPU)) > 0; got != tc.cpu {
				t.Errorf("CPU tier holds the prefix: %v, want %v (%v)", got, tc.cpu, s.set)
			}
		})
	}
}
