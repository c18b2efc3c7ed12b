package snapshot

import (
	"math/rand/v2"
	"testing"
)

// scaleEntry describes entry i of a synthetic index: its hash and holders.
// 75% of blocks have one holder, 20% two, 5% three to five, on both tiers.
func scaleEntry(i, endpoints int) (h uint64, slots [5]int, n int, tier Tier) {
	h = mix64(uint64(i) + 1)
	switch {
	case i%20 == 0:
		n = 3 + i/20%3
	case i%5 == 0:
		n = 2
	default:
		n = 1
	}
	for j := range n {
		slots[j] = (int(h>>32) + j*(endpoints/n+1)) % endpoints
	}
	return h, slots, n, Tier(h >> 7 & 1)
}

func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// fillScale adds entries [from, to) of the synthetic index.
func fillScale(t testing.TB, b *Builder, from, to, endpoints int) {
	for i := from; i < to; i++ {
		h, slots, n, tier := scaleEntry(i, endpoints)
		for _, s := range slots[:n] {
			if err := b.Add(s, h, tier); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func checkScaleEntry(t testing.TB, v *View, i, endpoints int) {
	h, slots, n, tier := scaleEntry(i, endpoints)
	got := v.Lookup(h)
	if got.Len() != n {
		t.Fatalf("entry %d: %d holders, want %d", i, got.Len(), n)
	}
	for j := range n {
		want := false
		for _, s := range slots[:n] {
			want = want || got.At(j).Endpoint() == s
		}
		if !want || got.At(j).Tier() != tier {
			t.Fatalf("entry %d: holder %v not among %v/%v", i, got.At(j), slots[:n], tier)
		}
	}
}

// TestScale builds, transports and reads a snapshot of 4M entries over 256
// endpoints, then one generation of churn through a diff bundle.
func TestScale(t *testing.T) {
	const entries, endpoints = 4 << 20, 256
	b := newBuilder(t, BuilderConfig{}, endpoints)
	fillScale(t, b, 0, entries, endpoints)
	st := newStore()
	size := st.fetch(t, b.Build(epoch))
	v := NewView(st.keys)
	rs, err := v.Refresh(st.get)
	if err != nil {
		t.Fatal(err)
	}
	if b.Entries() != entries || rs.Calls != 3+256 {
		t.Fatalf("%d entries, %d reads", b.Entries(), rs.Calls)
	}
	t.Logf("full: bundle %d bytes, view %d bytes (%.2f B/entry), %d reads", size, v.Size(), float64(v.Size())/entries, rs.Calls)
	rng := rand.New(rand.NewPCG(1, 1))
	for range 200_000 {
		checkScaleEntry(t, v, rng.IntN(entries), endpoints)
	}
	for range 10_000 {
		if h := rng.Uint64(); v.Lookup(h).Len() != 0 && h != 0 {
			// A probe meets a false entry with odds of about 2^-30, so
			// 10,000 probes find none.
			t.Fatalf("absent hash %#x found", h)
		}
	}

	// 0.3% churn: remove some entries, add as many new ones.
	const churn = 12_000
	for i := range churn / 2 {
		h, slots, n, tier := scaleEntry(i*97, endpoints)
		for _, s := range slots[:n] {
			b.Remove(s, h, tier)
		}
	}
	fillScale(t, b, entries, entries+churn/2, endpoints)
	st.fetch(t, b.Build(epoch))
	rs, err = v.Refresh(st.get)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("churn of %d: %d reads, %d bytes", churn, rs.Calls, rs.Bytes)
	if rs.Bytes > v.Size()/10 {
		t.Errorf("a 0.3%% change copied %d of %d bytes", rs.Bytes, v.Size())
	}
	for i := range churn / 2 {
		h, _, _, _ := scaleEntry(i*97, endpoints)
		if got := v.Lookup(h); got.Len() != 0 {
			t.Fatalf("removed entry %d still has %d holders", i*97, got.Len())
		}
		checkScaleEntry(t, v, entries+i, endpoints)
	}
}
