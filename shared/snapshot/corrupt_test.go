package snapshot

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// smallImage returns an image with every kind of value: inline and
// extension holder sets, tombstones in the delta, vacant endpoint slots.
func smallImage(t testing.TB) (*Image, *Image) {
	b := newBuilder(t, BuilderConfig{ShardBits: 1, DeltaBudget: 1 << 20}, 4)
	rng := rand.New(rand.NewPCG(7, 7))
	var hs []uint64
	for i := range 40 {
		h := rng.Uint64()
		hs = append(hs, h)
		for s := range 1 + i%4 {
			b.Add(s, h, Tier(i%2))
		}
	}
	b.RemoveEndpoint(endpointInfo(3).Addr)
	first := b.Build(epoch)
	for _, h := range hs[:10] {
		b.Remove(0, h, TierGPU)
		b.Remove(0, h, TierCPU)
		b.Remove(1, h, TierCPU)
		b.Remove(1, h, TierGPU)
		b.Remove(2, h, TierCPU)
		b.Remove(2, h, TierGPU)
	}
	b.Add(2, rng.Uint64(), TierGPU)
	return first, b.Build(epoch)
}

// reseal recomputes a part's checksum so that tests reach the structural
// checks behind it.
func reseal(b []byte) []byte {
	b = slices.Clone(b)
	le.PutUint64(b[len(b)-8:], xxhash.Sum64(b[:len(b)-8]))
	return b
}

func parseAny(k Kind, b []byte) error {
	if k == KindManifest {
		_, err := ParseManifest(b)
		return err
	}
	_, err := parseTableFull(b, k)
	return err
}

func TestCorruptParts(t *testing.T) {
	_, im := smallImage(t)
	if le.Uint32(im.delta[headerSize+8:]) == 0 {
		t.Fatal("test image has an empty delta")
	}
	parts := []struct {
		kind Kind
		b    []byte
	}{{KindManifest, im.manifest}, {KindDelta, im.delta}, {KindShard, im.shards[0]}, {KindShard, im.shards[1]}}
	for _, p := range parts {
		if err := parseAny(p.kind, p.b); err != nil {
			t.Fatalf("intact %v: %v", p.kind, err)
		}
		for n := range len(p.b) {
			if err := parseAny(p.kind, p.b[:n]); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("%v truncated to %d bytes: %v", p.kind, n, err)
			}
		}
		for i := range p.b {
			for _, x := range []byte{1, 0x80, 0xFF} {
				c := slices.Clone(p.b)
				c[i] ^= x
				if err := parseAny(p.kind, c); err == nil {
					t.Fatalf("%v with byte %d ^ %#x accepted", p.kind, i, x)
				}
			}
		}
		if err := parseAny(p.kind, append(slices.Clone(p.b), 0)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%v with a trailing byte: %v", p.kind, err)
		}
		c := slices.Clone(p.b)
		c[4] = Version + 1
		if err := parseAny(p.kind, reseal(c)); !errors.Is(err, ErrVersion) {
			t.Fatalf("%v version %d: %v", p.kind, Version+1, err)
		}
	}
	if _, err := ParseManifest(im.delta); !errors.Is(err, ErrCorrupt) {
		t.Errorf("delta read as a manifest: %v", err)
	}
	if _, err := parseTable(im.shards[0], KindDelta); !errors.Is(err, ErrCorrupt) {
		t.Errorf("shard read as a delta: %v", err)
	}
}

// TestCorruptStructure breaks one structural rule at a time behind a valid
// checksum, as a buggy or hostile writer would.
func TestCorruptStructure(t *testing.T) {
	_, im := smallImage(t)
	body := headerSize + tableFixed
	shard := func(f func(b []byte, t *table)) []byte {
		b := slices.Clone(im.shards[0])
		tb, err := parseTable(b, KindShard)
		if err != nil {
			t.Fatal(err)
		}
		f(b, &tb)
		return reseal(b)
	}
	tbl, _ := parseTable(im.shards[0], KindShard)
	dirAt := body
	entsAt := dirAt + len(tbl.dir)
	valsAt := entsAt + 4 // the first entry's value
	extAt := entsAt + len(tbl.ents)
	if len(tbl.ext) == 0 || tbl.n < 3 {
		t.Fatal("shard 0 needs extension lists and entries")
	}
	cases := []struct {
		name string
		kind Kind
		b    []byte
	}{
		{"directory start", KindShard, shard(func(b []byte, _ *table) { le.PutUint32(b[dirAt:], 1) })},
		{"directory end", KindShard, shard(func(b []byte, tb *table) { le.PutUint32(b[entsAt-4:], uint32(tb.n-1)) })},
		{"fingerprints out of order", KindShard, shard(func(b []byte, tb *table) {
			// Put every entry in bucket 0 and reverse two fingerprints.
			for i := 4; i < len(tb.dir); i += 4 {
				le.PutUint32(b[dirAt+i:], uint32(tb.n))
			}
			x, y := le.Uint32(b[entsAt:]), le.Uint32(b[entsAt+8:])
			le.PutUint32(b[entsAt:], y)
			le.PutUint32(b[entsAt+8:], x)
		})},
		{"empty set in a shard", KindShard, shard(func(b []byte, _ *table) { le.PutUint32(b[valsAt:], emptyVal) })},
		{"inline holders out of order", KindShard, shard(func(b []byte, _ *table) { le.PutUint32(b[valsAt:], 2<<1|1<<1<<16) })},
		{"inline code out of range", KindShard, shard(func(b []byte, _ *table) { le.PutUint32(b[valsAt:], 0x7FFE|noCode<<16) })},
		{"value past the lists", KindShard, shard(func(b []byte, tb *table) { le.PutUint32(b[valsAt:], extFlag|uint32(len(tb.ext)/2)) })},
		{"value inside a list", KindShard, shard(func(b []byte, _ *table) { le.PutUint32(b[valsAt:], extFlag|1) })},
		{"short list", KindShard, shard(func(b []byte, _ *table) { le.PutUint16(b[extAt:], 2) })},
		{"list not canonical", KindShard, shard(func(b []byte, _ *table) { le.PutUint16(b[extAt+2:], 0x7000) })},
		{"geometry", KindShard, shard(func(b []byte, _ *table) { b[body-tableFixed] = MaxShardBits + 1 })},
		{"index out of range", KindShard, shard(func(b []byte, _ *table) { le.PutUint32(b[body-tableFixed+4:], 2) })},
		{"entry count", KindShard, shard(func(b []byte, _ *table) { le.PutUint32(b[body-tableFixed+8:], 1<<30) })},
		{"delta with a shard index", KindDelta, func() []byte {
			b := slices.Clone(im.delta)
			b[body-tableFixed] = 1
			return reseal(b)
		}()},
	}
	for _, tc := range cases {
		if err := parseAny(tc.kind, tc.b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", tc.name, err)
		}
		// A reader's lighter parse may accept it; reading must stay safe.
		if tb, err := parseTable(tc.b, tc.kind); err == nil {
			rng := rand.New(rand.NewPCG(1, 1))
			for range 1000 {
				hs, _ := tb.find(rng.Uint64())
				holderList(hs)
			}
			for i := 0; i < tb.n; i++ {
				holderList(tb.holders(le.Uint32(tb.ents[8*i+4:])))
			}
		}
	}

	man := func(f func(b []byte)) []byte {
		b := slices.Clone(im.manifest)
		f(b)
		return reseal(b)
	}
	m, _ := ParseManifest(im.manifest)
	epAt := manifestFixed + refSize*m.NumShards()
	nameAt := epAt + endpointSize*m.NumEndpoints()
	mcases := []struct {
		name string
		b    []byte
	}{
		{"shard newer than the manifest", man(func(b []byte) { le.PutUint64(b[manifestFixed:], m.Generation()+1) })},
		{"health", man(func(b []byte) { b[epAt+20] = 9 })},
		{"unknown template", man(func(b []byte) { b[epAt+21] = 200 })},
		{"reserved byte", man(func(b []byte) { b[epAt+23] = 1 })},
		{"address past the strings", man(func(b []byte) { le.PutUint32(b[epAt+8:], 1<<20) })},
		{"KV usage NaN", man(func(b []byte) { le.PutUint32(b[epAt+40:], math.Float32bits(float32(math.NaN()))) })},
		{"KV usage above 1", man(func(b []byte) { le.PutUint32(b[epAt+40:], math.Float32bits(1.5)) })},
		{"negative rate", man(func(b []byte) { le.PutUint32(b[epAt+44:], math.Float32bits(-1)) })},
		{"vacant slot with load", man(func(b []byte) { le.PutUint32(b[epAt+3*endpointSize+24:], 5) })},
		{"endpoint since the future", man(func(b []byte) { le.PutUint64(b[epAt:], m.Generation()+1) })},
		{"reserved endpoint bytes", man(func(b []byte) { b[epAt+23] = 1 })},
		{"unknown endpoint flag", man(func(b []byte) { b[epAt+22] = 2 })},
		{"negative TTFT coefficient", man(func(b []byte) { le.PutUint32(b[epAt+68:], math.Float32bits(-1)) })},
		{"infinite ITL coefficient", man(func(b []byte) { le.PutUint32(b[epAt+88:], math.Float32bits(float32(math.Inf(1)))) })},
		{"vacant slot with a model", man(func(b []byte) { le.PutUint32(b[epAt+3*endpointSize+64:], 1) })},
		{"empty name", man(func(b []byte) { le.PutUint16(b[nameAt+4:], 0) })},
		{"name kind", man(func(b []byte) { b[nameAt+6] = 2 })},
		{"shard bits", man(func(b []byte) { b[32] = 0 })},
	}
	for _, tc := range mcases {
		if _, err := ParseManifest(tc.b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("manifest %s: %v, want ErrCorrupt", tc.name, err)
		}
	}
}

func TestBundle(t *testing.T) {
	first, second := smallImage(t)
	full := second.AppendBundle(nil, 0)
	diff := second.AppendBundle(nil, first.Generation())
	if len(diff) >= len(full) {
		t.Errorf("diff bundle %d bytes, full %d", len(diff), len(full))
	}
	for _, body := range [][]byte{full, diff} {
		for n := range len(body) {
			if _, err := ParseBundle(body[:n]); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("bundle truncated to %d: %v", n, err)
			}
		}
		for i := range body {
			c := slices.Clone(body)
			c[i] ^= 0x40
			if _, err := ParseBundle(c); err == nil {
				t.Fatalf("bundle with byte %d flipped accepted", i)
			}
		}
	}
	bf, err := ParseBundle(full)
	if err != nil {
		t.Fatal(err)
	}
	if bf.Since() != 0 || len(bf.Parts()) != 4 || bf.Parts()[3].Kind != KindManifest {
		t.Errorf("full bundle since %d with %d parts", bf.Since(), len(bf.Parts()))
	}
	bd, err := ParseBundle(diff)
	if err != nil {
		t.Fatal(err)
	}
	m1, _ := ParseManifest(first.manifest)
	if err := bd.Complete(m1); err != nil {
		t.Errorf("diff over the right manifest: %v", err)
	}
	if err := bd.Complete(nil); !errors.Is(err, ErrInconsistent) {
		t.Errorf("diff over nothing: %v", err)
	}
	// A diff applied over a manifest from another history (a restarted
	// cachesync that reused generations) must be refused.
	b2 := newBuilder(t, BuilderConfig{ShardBits: 1}, 1)
	b2.Add(0, 42, TierGPU)
	m3, _ := ParseManifest(b2.Build(epoch).manifest)
	if err := bd.Complete(m3); !errors.Is(err, ErrInconsistent) {
		t.Errorf("diff over a foreign manifest: %v", err)
	}
	// A newer since than the image (cachesync restarted) gives a full bundle.
	if b, err := ParseBundle(second.AppendBundle(nil, 1<<40)); err != nil || b.Since() != 0 {
		t.Errorf("since from the future: since %d, %v", b.Since(), err)
	}
	// A bundle that leaves out a changed part is refused.
	bad := buildBundle(second.gen, first.Generation(), second.manifest)
	if _, err := ParseBundle(bad); !errors.Is(err, ErrCorrupt) {
		t.Errorf("diff without its delta: %v", err)
	}
	// A part from another generation is refused.
	bad = buildBundle(second.gen, 0, second.manifest, first.delta, second.shards[0], second.shards[1])
	if _, err := ParseBundle(bad); !errors.Is(err, ErrInconsistent) {
		t.Errorf("bundle with a stale delta: %v", err)
	}
	bad = buildBundle(second.gen, 0, second.manifest, second.delta, second.shards[0], second.shards[0], second.shards[1])
	if _, err := ParseBundle(bad); !errors.Is(err, ErrCorrupt) {
		t.Errorf("bundle with a duplicate shard: %v", err)
	}
}

func buildBundle(gen, since uint64, parts ...[]byte) []byte {
	b := le.AppendUint16([]byte(bundleMagic), Version)
	b = append(b, 0, 0)
	b = le.AppendUint64(b, gen)
	b = le.AppendUint64(b, since)
	b = le.AppendUint32(b, uint32(len(parts)))
	b = le.AppendUint32(b, 0)
	for _, p := range parts {
		b = le.AppendUint32(b, uint32(len(p)))
		b = append(b, p...)
	}
	return le.AppendUint64(b, xxhash.Sum64(b))
}

// TestFingerprintCollision checks hashes that share every bit a table keeps:
// both must find the union of their holders, never nothing.
func TestFingerprintCollision(t *testing.T) {
	b := newBuilder(t, BuilderConfig{ShardBits: 1}, 4)
	const h1 = 0x123456789abcdef0
	h2 := uint64(h1 ^ 1) // differs only in the lowest bit, which no small table keeps
	b.Add(0, h1, TierGPU)
	b.Add(1, h2, TierCPU)
	b.Add(2, h2, TierGPU)
	b.Add(0, h2, TierCPU)
	v := publish(t, b)
	want := []Holder{Holder(holderCode(0, TierGPU)), Holder(holderCode(1, TierCPU)), Holder(holderCode(2, TierGPU))}
	for _, h := range []uint64{h1, h2} {
		if got := holderList(v.Lookup(h)); !slices.Equal(got, want) {
			t.Errorf("Lookup(%#x) = %v, want %v", h, got, want)
		}
	}
	if b.Entries() != 2 {
		t.Errorf("Entries() = %d", b.Entries())
	}
}

func TestSetEndpointValidation(t *testing.T) {
	long := string(make([]byte, 256))
	cases := []struct {
		name string
		info EndpointInfo
	}{
		{"no address", EndpointInfo{}},
		{"long address", EndpointInfo{Addr: long}},
		{"empty model", EndpointInfo{Addr: "a:1", Models: []string{""}}},
		{"negative count", EndpointInfo{Addr: "a:1", Running: -1}},
		{"huge count", EndpointInfo{Addr: "a:1", PrefillTokens: math.MaxUint32 + 1}},
		{"KV usage", EndpointInfo{Addr: "a:1", KVCacheUsage: 1.01}},
		{"NaN KV usage", EndpointInfo{Addr: "a:1", KVCacheUsage: math.NaN()}},
		{"rate", EndpointInfo{Addr: "a:1", PrefillRate: math.Inf(1)}},
		{"health", EndpointInfo{Addr: "a:1", Health: 7}},
		{"template", EndpointInfo{Addr: "a:1", Template: 200}},
	}
	b := newBuilder(t, BuilderConfig{}, 0)
	for _, tc := range cases {
		if _, err := b.SetEndpoint(tc.info); err == nil {
			t.Errorf("%s accepted", tc.name)
		}
	}
	if err := b.Add(0, 1, TierGPU); !errors.Is(err, ErrNoEndpoint) {
		t.Errorf("Add to an empty slot: %v", err)
	}
	if _, err := NewBuilder(BuilderConfig{ShardBits: 13}); err == nil {
		t.Error("13 shard bits accepted")
	}
}
