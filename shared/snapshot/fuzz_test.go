package snapshot

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// FuzzParse feeds arbitrary bytes to every decoder, once as given and once
// with the checksum recomputed so that the fuzzer reaches the structural
// checks. Whatever a decoder accepts must then be safe to read in full.
func FuzzParse(f *testing.F) {
	first, second := smallImage(f)
	for _, im := range []*Image{first, second} {
		f.Add(im.manifest)
		f.Add(im.delta)
		for _, s := range im.shards {
			f.Add(s)
		}
		f.Add(im.AppendBundle(nil, 0))
	}
	f.Add(second.AppendBundle(nil, first.Generation()))
	tb := newBuilder(f, BuilderConfig{ShardBits: 1}, 1)
	if _, err := tb.SetChatTemplates([]ChatTemplate{qwenLike}); err != nil {
		f.Fatal(err)
	}
	withTemplates := tb.Build(epoch)
	f.Add(withTemplates.templates)
	f.Add(withTemplates.AppendBundle(nil, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, raw := range [][]byte{b, resealAny(b)} {
			if m, err := ParseManifest(raw); err == nil {
				readManifest(m)
			}
			for _, k := range []Kind{KindShard, KindDelta} {
				if tb, err := parseTable(raw, k); err == nil {
					readTable(t, &tb, k, raw, tb.check(k == KindDelta) == nil)
				}
			}
			if ts, err := parseTemplates(raw); err == nil {
				for i, p := 0, ts.body; i < ts.n; i++ {
					var e templateEntry
					if p, e, err = nextTemplate(p); err != nil {
						t.Fatalf("templates accepted an entry it cannot read: %v", err)
					}
					if _, ok := ts.lookup(string(e.model)); !ok {
						t.Fatalf("template %q listed but not found", e.model)
					}
				}
			}
			if bd, err := ParseBundle(raw); err == nil {
				readManifest(bd.Manifest())
				_ = bd.Complete(bd.Manifest())
				for _, p := range bd.Parts() {
					if p.Kind != KindManifest && p.Kind != KindTemplates {
						tb, err := parseTableFull(p.Data, p.Kind)
						if err != nil {
							t.Fatalf("bundle accepted a part its parser refuses: %v", err)
						}
						readTable(t, &tb, p.Kind, p.Data, true)
					}
				}
			}
			_, _, _ = parseHead(raw)
		}
	})
}

// resealAny fixes the trailing checksum of a part or bundle.
func resealAny(b []byte) []byte {
	if len(b) < 8 {
		return b
	}
	c := slices.Clone(b)
	if len(c) >= headerSize && string(c[:4]) == partMagic {
		binary.LittleEndian.PutUint32(c[16:], uint32(len(c)))
	}
	binary.LittleEndian.PutUint64(c[len(c)-8:], xxhash.Sum64(c[:len(c)-8]))
	return c
}

func readManifest(m *Manifest) {
	_ = m.Created()
	for i := 0; i < m.NumEndpoints(); i++ {
		e := m.Endpoint(i)
		if e.Vacant() {
			continue
		}
		_ = e.Addr()
		for j := 0; j < e.NumModels(); j++ {
			name, _ := e.Model(j)
			if id := m.Model(name); id < 0 || !e.Serves(id) {
				panic("endpoint does not serve a model it lists")
			}
		}
		_ = e.Running() + e.Waiting() + e.PrefillTokens() + e.IndexBlocks() + e.IndexCapacity()
		_ = e.KVCacheUsage() + e.PrefillRate()
	}
}

// readTable looks up every fingerprint the table holds and some it does
// not, and walks a chain of them through a view holding the table. A
// table that passed only the reader's parse must be safe to read; one that
// passed the full check must also find every entry.
func readTable(t *testing.T, tb *table, k Kind, raw []byte, full bool) {
	var hashes []uint64
	for b := 0; b+1 < len(tb.dir)/4; b++ {
		for i := le.Uint32(tb.dir[4*b:]); i < le.Uint32(tb.dir[4*b+4:]); i++ {
			// Go shifts of 64 or more give 0, which covers dirBits or
			// shardBits of 0.
			x := uint64(b)<<(64-tb.dirBits) | uint64(le.Uint32(tb.ents[8*i:]))<<(32-tb.dirBits)
			h := x>>tb.shardBits | uint64(tb.index)<<(64-tb.shardBits)
			hs, ok := tb.find(h)
			if !ok && full {
				t.Fatalf("entry %d of bucket %d not found", i, b)
			}
			for j := 0; j < hs.Len(); j++ {
				_ = hs.At(j).Endpoint()
			}
			hashes = append(hashes, h)
		}
	}
	hashes = append(hashes, xxhash.Sum64(raw), 0, ^uint64(0))
	bits := max(tb.shardBits, 1)
	v := View{loaded: true, shards: make([]table, 1<<bits), shift: 64 - bits}
	if k == KindDelta {
		v.delta = *tb
	} else {
		for i := range v.shards {
			if tb.shardBits == 0 || i == tb.index {
				v.shards[i] = *tb
			}
		}
	}
	for _, h := range hashes {
		v.Lookup(h)
	}
	v.Prefix(hashes, make([]Match, 64))
}

// FuzzIndex runs a program of builder operations read from the input and,
// after each build, checks what a reader sees against a reference model:
// every lookup, and the prefix walk over a chain of the hashes used.
func FuzzIndex(f *testing.F) {
	f.Add([]byte{0, 0, 0x01, 0x12, 0x23, 0xE0, 0x41, 0x52, 0xE0, 0xC3, 0xE0})
	f.Add([]byte{1, 9, 0x00, 0x01, 0x02, 0x03, 0x10, 0x11, 0x12, 0x13, 0xE0, 0x80, 0xE0, 0xA0, 0xE0, 0x00, 0xE0})
	f.Add([]byte{2, 3, 0x05, 0x25, 0x45, 0x65, 0x85, 0xE0, 0xD5, 0xE0, 0xB5, 0xE0})
	f.Fuzz(func(t *testing.T, prog []byte) {
		if len(prog) < 2 {
			return
		}
		const endpoints = 6
		b := newBuilder(t, BuilderConfig{ShardBits: 1 + int(prog[0])%3, DeltaBudget: int(prog[1])%6 - 1}, endpoints)
		var pool [16]uint64
		for i := range pool {
			pool[i] = xxhash.Sum64([]byte{byte(i), prog[0]})
		}
		m := model{}
		st := newStore()
		v := NewView(st.keys)
		for _, op := range prog[2:] {
			slot, h, tier := int(op)%endpoints, pool[int(op>>1)%len(pool)], Tier(op>>4&1)
			switch op >> 5 {
			case 0, 1, 2:
				if b.Add(slot, h, tier) == nil {
					m.add(h, slot, tier)
				}
			case 3, 4:
				if b.Remove(slot, h, tier) == nil {
					m.remove(h, slot, tier)
				}
			case 5:
				if b.live(slot) {
					b.ClearEndpoint(slot)
					m.clearSlot(slot)
				}
			case 6:
				// The endpoint may have come back in another slot.
				if s, ok := b.Endpoint(endpointInfo(slot).Addr); ok {
					b.RemoveEndpoint(endpointInfo(slot).Addr)
					m.clearSlot(s)
				} else if _, err := b.SetEndpoint(endpointInfo(slot)); err != nil {
					t.Fatal(err)
				}
			case 7:
				st.fetch(t, b.Build(epoch))
				if _, err := v.Refresh(st.get); err != nil {
					t.Fatal(err)
				}
				for _, h := range pool {
					if got, want := holderList(v.Lookup(h)), m.want(h); !slices.Equal(got, want) {
						t.Fatalf("Lookup(%#x) = %v, want %v", h, got, want)
					}
				}
				out := make([]Match, endpoints)
				v.Prefix(pool[:], out)
				for s, got := range out {
					holds := func(i int) bool { return i >= 0 && i < len(pool) && m[pool[i]][s] != 0 }
					k := int(got.Blocks)
					if (k == 0) == holds(0) || (k > 0 && !holds(k-1)) || holds(k) || got.GPU > got.Blocks {
						t.Fatalf("endpoint %d: %+v does not end a held run", s, got)
					}
				}
			}
		}
	})
}
