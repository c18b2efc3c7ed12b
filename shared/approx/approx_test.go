package approx

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute/shared/snapshot"
)

// event is one call the index made on its sink.
type event struct {
	add  bool
	slot int
	h    uint64
}

func (e event) String() string {
	op := "remove"
	if e.add {
		op = "add"
	}
	return op + "(" + strconv.Itoa(e.slot) + "," + strconv.FormatUint(e.h, 10) + ")"
}

type recorder struct{ events []event }

func (r *recorder) Add(slot int, h uint64, t snapshot.Tier) error {
	if t != snapshot.TierGPU {
		return errors.New("tier not GPU")
	}
	r.events = append(r.events, event{true, slot, h})
	return nil
}

func (r *recorder) Remove(slot int, h uint64, t snapshot.Tier) error {
	if t != snapshot.TierGPU {
		return errors.New("tier not GPU")
	}
	r.events = append(r.events, event{false, slot, h})
	return nil
}

func (r *recorder) take() []event {
	e := r.events
	r.events = nil
	return e
}

// lru is the reference: a slice from most to least recently used.
type lru struct {
	cap   int
	order []uint64
}

func (l *lru) touch(slot int, hashes []uint64) []event {
	var ev []event
	hashes = hashes[:min(len(hashes), l.cap)]
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		if at := slices.Index(l.order, h); at >= 0 {
			l.order = slices.Delete(l.order, at, at+1)
		} else {
			if len(l.order) == l.cap {
				ev = append(ev, event{false, slot, l.order[len(l.order)-1]})
				l.order = l.order[:len(l.order)-1]
			}
			ev = append(ev, event{true, slot, h})
		}
		l.order = slices.Insert(l.order, 0, h)
	}
	return ev
}

func newIndex(t testing.TB, caps ...int) (*Index, *recorder) {
	t.Helper()
	x, r := New(), &recorder{}
	for slot, c := range caps {
		if _, err := x.SetCapacity(slot, c, r); err != nil {
			t.Fatal(err)
		}
	}
	return x, r
}

// chain returns n hashes standing for a prompt: a shared prefix of shared
// blocks named by base, then blocks unique to id.
func chain(base, id uint64, shared, n int) []uint64 {
	hs := make([]uint64, n)
	for i := range hs {
		if i < shared {
			hs[i] = mix(base<<32 | uint64(i))
		} else {
			hs[i] = mix(id<<32 | uint64(i) | 1<<63)
		}
	}
	return hs
}

// mix spreads test hashes as real block hashes are spread: a snapshot
// merges hashes that share their top bits.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// TestEvictionOrder checks the order the package documents: a prompt's tail
// goes before its prefix, older prompts before newer ones, and a prefix that
// every prompt shares stays.
func TestEvictionOrder(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cap     int
		prompts [][]uint64
		want    []event // the last touch's events
		held    []uint64
	}{
		{
			name:    "tail of the oldest prompt first",
			cap:     6,
			prompts: [][]uint64{{1, 2, 3, 4}, {10, 11}, {20}},
			want:    []event{{false, 0, 4}, {true, 0, 20}},
			held:    []uint64{20, 10, 11, 1, 2, 3},
		},
		{
			name:    "shared prefix survives",
			cap:     4,
			prompts: [][]uint64{{1, 2, 3}, {1, 2, 4}, {1, 2, 5}},
			want:    []event{{false, 0, 3}, {true, 0, 5}},
			held:    []uint64{1, 2, 5, 4},
		},
		{
			name:    "longer than capacity keeps the prefix",
			cap:     3,
			prompts: [][]uint64{{1, 2, 3, 4, 5}},
			want:    []event{{true, 0, 3}, {true, 0, 2}, {true, 0, 1}},
			held:    []uint64{1, 2, 3},
		},
		{
			name:    "a prompt's own blocks are not evicted for it",
			cap:     4,
			prompts: [][]uint64{{1, 2}, {3, 4}, {3, 4, 5, 6}},
			want:    []event{{false, 0, 2}, {true, 0, 6}, {false, 0, 1}, {true, 0, 5}},
			held:    []uint64{3, 4, 5, 6},
		},
		{
			name:    "touch without change",
			cap:     4,
			prompts: [][]uint64{{1, 2, 3}, {1, 2}},
			want:    nil,
			held:    []uint64{1, 2, 3},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, r := newIndex(t, tc.cap)
			var c Change
			for _, p := range tc.prompts {
				r.take()
				var err error
				if c, err = x.Touch(0, p, r); err != nil {
					t.Fatal(err)
				}
			}
			if got := r.take(); !slices.Equal(got, tc.want) {
				t.Fatalf("events %v, want %v", got, tc.want)
			}
			adds, evs := 0, 0
			for _, e := range tc.want {
				if e.add {
					adds++
				} else {
					evs++
				}
			}
			if c != (Change{Added: adds, Evicted: evs}) {
				t.Fatalf("Change %+v, want %d added and %d evicted", c, adds, evs)
			}
			if got := heldOrder(x, 0); !slices.Equal(got, tc.held) {
				t.Fatalf("held %v, want %v", got, tc.held)
			}
		})
	}
}

// heldOrder lists slot's hashes from most to least recently used.
func heldOrder(x *Index, slot int) []uint64 {
	st := x.get(slot)
	var out []uint64
	for n := st.nodes[0].next; n != 0; n = st.nodes[n].next {
		out = append(out, st.nodes[n].h)
	}
	return out
}

// TestReference runs random prompts (with shared prefixes, repeats and a
// small hash space so that tables collide and shift) through the index and
// through a slice-based reference LRU, and compares events and order.
func TestReference(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) { testReference(t, seed) })
	}
}

func testReference(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(3, seed))
	caps := []int{1, 7, 50, 300}
	x, r := New(), &recorder{}
	x.seed = seed // table layouts differ, results must not
	for slot, c := range caps {
		if _, err := x.SetCapacity(slot, c, r); err != nil {
			t.Fatal(err)
		}
	}
	refs := make([]lru, len(caps))
	for i, c := range caps {
		refs[i].cap = c
	}
	for step := range 4000 {
		slot := rng.IntN(len(caps))
		p := chain(uint64(rng.IntN(5)), uint64(rng.IntN(400)), rng.IntN(6), rng.IntN(40))
		if step%500 == 499 {
			// Resize now and then, shrinking or growing.
			c := 1 + rng.IntN(2*caps[slot])
			if _, err := x.SetCapacity(slot, c, r); err != nil {
				t.Fatal(err)
			}
			var want []event
			for len(refs[slot].order) > c {
				want = append(want, event{false, slot, refs[slot].order[len(refs[slot].order)-1]})
				refs[slot].order = refs[slot].order[:len(refs[slot].order)-1]
			}
			refs[slot].cap = c
			if got := r.take(); !slices.Equal(got, want) {
				t.Fatalf("step %d: resize events %v, want %v", step, got, want)
			}
		}
		if _, err := x.Touch(slot, p, r); err != nil {
			t.Fatal(err)
		}
		if got, want := r.take(), refs[slot].touch(slot, p); !slices.Equal(got, want) {
			t.Fatalf("step %d: events %v, want %v", step, got, want)
		}
		if got := heldOrder(x, slot); !slices.Equal(got, refs[slot].order) {
			t.Fatalf("step %d: order %v, want %v", step, got, refs[slot].order)
		}
	}
	total := 0
	for i := range refs {
		total += len(refs[i].order)
		if x.Len(i) != len(refs[i].order) {
			t.Fatalf("Len(%d) = %d, want %d", i, x.Len(i), len(refs[i].order))
		}
		for _, h := range refs[i].order {
			if !x.Contains(i, h) {
				t.Fatalf("slot %d lost %#x from its table", i, h)
			}
		}
	}
	if x.Entries() != total {
		t.Fatalf("Entries = %d, want %d", x.Entries(), total)
	}
}

// TestDeterministic checks that two indices, whose tables are laid out with
// different random seeds, tell their sinks exactly the same.
func TestDeterministic(t *testing.T) {
	var logs [2][]event
	for i := range logs {
		x, r := newIndex(t, 100, 1000)
		rng := rand.New(rand.NewPCG(5, 6))
		for range 2000 {
			if _, err := x.Touch(rng.IntN(2), chain(uint64(rng.IntN(3)), rng.Uint64()>>34, 10, 20+rng.IntN(20)), r); err != nil {
				t.Fatal(err)
			}
		}
		logs[i] = r.take()
	}
	if !slices.Equal(logs[0], logs[1]) {
		t.Fatal("two indices fed the same reports told their sinks different things")
	}
}

// TestBuilderSink uses a snapshot.Builder as the sink, as the filter's
// no-daemon mode does: the published snapshot must hold exactly what the
// index holds, and the prefix walk must see the routed prefixes.
func TestBuilderSink(t *testing.T) {
	b, err := snapshot.NewBuilder(snapshot.BuilderConfig{ShardBits: 2})
	if err != nil {
		t.Fatal(err)
	}
	x := New()
	for i := range 3 {
		slot, err := b.SetEndpoint(snapshot.EndpointInfo{Addr: "10.0.0." + strconv.Itoa(i) + ":8000", Health: snapshot.HealthHealthy})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := x.SetCapacity(slot, 40, b); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(7, 8))
	last := make([][]uint64, 3)
	for range 200 {
		slot := rng.IntN(3)
		last[slot] = chain(uint64(rng.IntN(4)), rng.Uint64()>>34, 8, 10+rng.IntN(15))
		if _, err := x.Touch(slot, last[slot], b); err != nil {
			t.Fatal(err)
		}
	}
	if b.Entries() > x.Entries() {
		t.Fatalf("snapshot has %d entries, index %d", b.Entries(), x.Entries())
	}
	v := view(t, b)
	for slot := range 3 {
		for _, h := range heldOrder(x, slot) {
			hs := v.Lookup(h)
			found := false
			for i := range hs.Len() {
				found = found || hs.At(i).Endpoint() == slot
			}
			if !found {
				t.Fatalf("slot %d holds %#x in the index but not in the snapshot", slot, h)
			}
		}
		out := make([]snapshot.Match, 3)
		v.Prefix(last[slot], out)
		if int(out[slot].GPU) != len(last[slot]) {
			t.Fatalf("slot %d: prefix walk matched %d of its last prompt's %d blocks", slot, out[slot].GPU, len(last[slot]))
		}
	}

	// An endpoint forgotten and removed leaves nothing in the snapshot.
	x.Forget(1)
	b.RemoveEndpoint("10.0.0.1:8000")
	if _, err := x.Touch(1, last[1], b); !errors.Is(err, ErrNoEndpoint) {
		t.Fatalf("Touch after Forget = %v, want ErrNoEndpoint", err)
	}
	v = view(t, b)
	for _, h := range last[1] {
		hs := v.Lookup(h)
		for i := range hs.Len() {
			if hs.At(i).Endpoint() == 1 {
				t.Fatalf("removed endpoint still holds %#x", h)
			}
		}
	}
}

func view(t *testing.T, b *snapshot.Builder) *snapshot.View {
	t.Helper()
	keys := snapshot.NewKeys("t/")
	kv := map[string][]byte{}
	bd, err := snapshot.ParseBundle(b.Build(time.Unix(1, 0)).AppendBundle(nil, 0))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range bd.Parts() {
		kv[keys.Part(p)] = p.Data
	}
	kv[keys.Head()] = bd.Manifest().AppendHead(nil)
	v := snapshot.NewView(keys)
	if _, err := v.Refresh(func(k string) ([]byte, error) { return kv[k], nil }); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestSinkError checks that a sink refusing a change stops Touch, which
// reports it, and that the index holds nothing the sink was not told.
func TestSinkError(t *testing.T) {
	b, _ := snapshot.NewBuilder(snapshot.BuilderConfig{})
	x := New()
	if _, err := x.SetCapacity(0, 10, b); err != nil {
		t.Fatal(err)
	}
	c, err := x.Touch(0, []uint64{1, 2, 3}, b) // slot 0 not in the builder
	if !errors.Is(err, snapshot.ErrNoEndpoint) {
		t.Fatalf("Touch = %v, want the builder's ErrNoEndpoint", err)
	}
	if c.Added != 1 || x.Len(0) != 1 {
		t.Fatalf("Change %+v, Len %d: want the one hash the sink was asked to add", c, x.Len(0))
	}
}

func TestBadCalls(t *testing.T) {
	x, r := newIndex(t, 5)
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"touch unknown slot", func() error { _, err := x.Touch(3, []uint64{1}, r); return err }()},
		{"touch negative slot", func() error { _, err := x.Touch(-1, []uint64{1}, r); return err }()},
		{"zero capacity", func() error { _, err := x.SetCapacity(0, 0, r); return err }()},
		{"negative slot", func() error { _, err := x.SetCapacity(-1, 5, r); return err }()},
		{"slot past the endpoint table", func() error { _, err := x.SetCapacity(snapshot.MaxEndpoints, 5, r); return err }()},
	} {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	if x.Capacity(0) != 5 || x.Capacity(1) != 0 || x.Len(9) != 0 || x.Contains(9, 1) {
		t.Fatal("bad calls changed the index")
	}
	x.Forget(42) // nothing to forget: no effect
	if len(r.events) != 0 {
		t.Fatalf("bad calls told the sink %v", r.events)
	}
}

func TestSizing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		s      Sizing
		tokens int64
		want   int
	}{
		// vLLM's example cache_config_info: 24978 blocks of 16 tokens.
		{"vllm defaults", Sizing{}, 24978 * 16, 24978},
		{"3 bytes per token", Sizing{BytesPerToken: 3}, 24978 * 16, 24978 * 16 * 3 / 64},
		{"128-byte blocks", Sizing{BlockBytes: 128}, 1000, 31},
		{"nothing", Sizing{}, 0, 1},
		{"negative", Sizing{}, -5, 1},
		{"huge", Sizing{}, math.MaxInt64, MaxCapacity},
	} {
		if got := tc.s.Blocks(tc.tokens); got != tc.want {
			t.Errorf("%s: Blocks(%d) = %d, want %d", tc.name, tc.tokens, got, tc.want)
		}
	}
}

func TestTouchAllocs(t *testing.T) {
	x, r := newIndex(t, 1000)
	r.events = make([]event, 0, 1<<16)
	rng := rand.New(rand.NewPCG(9, 10))
	prompts := make([][]uint64, 64)
	for i := range prompts {
		prompts[i] = chain(uint64(i%4), uint64(i), 20, 100)
	}
	for _, p := range prompts { // fill to capacity
		_, _ = x.Touch(0, p, r)
	}
	got := testing.AllocsPerRun(200, func() {
		r.events = r.events[:0]
		if _, err := x.Touch(0, prompts[rng.IntN(len(prompts))], r); err != nil {
			t.Fatal(err)
		}
	})
	if got != 0 {
		t.Fatalf("%v allocations per Touch at capacity", got)
	}
}

// FuzzTouch drives the index with arbitrary prompts, resizes and forgets
// over a small hash space, and checks it against the reference LRU.
func FuzzTouch(f *testing.F) {
	f.Add(uint64(0), []byte{0, 3, 1, 2, 3, 1, 2, 4, 5, 0, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add(uint64(7), []byte{255, 0, 40, 1, 1, 1, 1, 0x80, 3, 2, 2, 2})
	f.Fuzz(func(t *testing.T, seed uint64, data []byte) {
		x, r := New(), &recorder{}
		x.seed = seed
		refs := []lru{{cap: 3}, {cap: 17}}
		for slot := range refs {
			if _, err := x.SetCapacity(slot, refs[slot].cap, r); err != nil {
				t.Fatal(err)
			}
		}
		for len(data) >= 2 {
			op, n := data[0], int(data[1])%48
			data = data[2:]
			slot := int(op & 1)
			ref := &refs[slot]
			switch {
			case op&0x80 != 0: // resize
				c := 1 + n
				var want []event
				for len(ref.order) > c {
					want = append(want, event{false, slot, ref.order[len(ref.order)-1]})
					ref.order = ref.order[:len(ref.order)-1]
				}
				ref.cap = c
				if _, err := x.SetCapacity(slot, c, r); err != nil {
					t.Fatal(err)
				}
				if got := r.take(); !slices.Equal(got, want) {
					t.Fatalf("resize: events %v, want %v", got, want)
				}
			case op&0x40 != 0: // the endpoint restarts
				x.Forget(slot)
				ref.order = nil
				if _, err := x.SetCapacity(slot, ref.cap, r); err != nil {
					t.Fatal(err)
				}
			default:
				p := make([]uint64, 0, n)
				for _, b := range data[:min(n, len(data))] {
					p = append(p, uint64(b%64)) // a small space: shared blocks and collisions
				}
				data = data[len(p):]
				if _, err := x.Touch(slot, p, r); err != nil {
					t.Fatal(err)
				}
				if got, want := r.take(), ref.touch(slot, p); !slices.Equal(got, want) {
					t.Fatalf("touch %v: events %v, want %v", p, got, want)
				}
			}
			if got := heldOrder(x, slot); !slices.Equal(got, ref.order) {
				t.Fatalf("order %v, want %v", got, ref.order)
			}
			for _, h := range ref.order {
				if !x.Contains(slot, h) {
					t.Fatalf("%d lost from the table", h)
				}
			}
		}
		if x.Entries() != len(refs[0].order)+len(refs[1].order) {
			t.Fatalf("Entries %d", x.Entries())
		}
	})
}
