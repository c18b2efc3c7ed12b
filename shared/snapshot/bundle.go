package snapshot

import (
	"strconv"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/shared/errdetail"
)

const (
	bundleMagic  = "KVRB"
	bundleHeader = 32
)

// Image is one encoded generation: the manifest, the delta and every
// shard. Builder.Build makes it; it never changes afterwards and is safe
// for concurrent use, so cachesync can serve it while building the next.
type Image struct {
	gen       uint64
	manifest  []byte
	delta     []byte
	templates []byte // nil when there are none
	shards    [][]byte
}

// Generation returns the image's generation.
func (im *Image) Generation() uint64 { return im.gen }

// Manifest parses the image's manifest (the endpoint table, the models).
func (im *Image) Manifest() (*Manifest, error) { return ParseManifest(im.manifest) }

// Size returns the bytes of all parts: what a reader holds in memory.
func (im *Image) Size() int {
	n := len(im.manifest) + len(im.delta) + len(im.templates)
	for _, s := range im.shards {
		n += len(s)
	}
	return n
}

// AppendBundle appends to dst the bundle that brings a fetcher holding
// generation since up to this image: the manifest and every part written
// after since. since 0, or a generation newer than the image (a restarted
// cachesync), gives a full bundle.
func (im *Image) AppendBundle(dst []byte, since uint64) []byte {
	if since > im.gen {
		since = 0
	}
	var parts [][]byte
	parts = append(parts, im.manifest)
	if since == 0 || le.Uint64(im.delta[8:]) > since {
		parts = append(parts, im.delta)
	}
	if im.templates != nil && (since == 0 || le.Uint64(im.templates[8:]) > since) {
		parts = append(parts, im.templates)
	}
	for _, s := range im.shards {
		if since == 0 || le.Uint64(s[8:]) > since {
			parts = append(parts, s)
		}
	}
	start := len(dst)
	dst = append(dst, bundleMagic...)
	dst = le.AppendUint16(dst, Version)
	dst = le.AppendUint16(dst, 0)
	dst = le.AppendUint64(dst, im.gen)
	dst = le.AppendUint64(dst, since)
	dst = le.AppendUint32(dst, uint32(len(parts)))
	dst = le.AppendUint32(dst, 0)
	for _, p := range parts {
		dst = le.AppendUint32(dst, uint32(len(p)))
		dst = append(dst, p...)
	}
	return le.AppendUint64(dst, xxhash.Sum64(dst[start:]))
}

// Part is one part of a bundle, to be stored under Keys.Part(Kind, Shard).
type Part struct {
	Kind  Kind
	Shard int // the shard's index; 0 for the manifest and the delta
	Data  []byte
}

// Bundle is a parsed transport bundle: a manifest and the parts that
// changed since the generation the fetcher asked from.
type Bundle struct {
	since uint64
	m     *Manifest
	parts []Part
}

// ParseBundle checks b, the body of a snapshot response, and every part in
// it, down to each index entry: the fetcher is where bytes from the network
// enter shared data, and it checks them once for all the workers. The
// bundle's parts keep b; b must not change afterwards.
func ParseBundle(b []byte) (*Bundle, error) {
	if len(b) < bundleHeader+trailerSize {
		return nil, corrupt("bundle: truncated")
	}
	if string(b[:4]) != bundleMagic {
		return nil, corrupt("bundle: bad magic")
	}
	if v := le.Uint16(b[4:]); v != Version {
		return nil, errdetail.New(ErrVersion, "bundle: version "+strconv.Itoa(int(v)))
	}
	if xxhash.Sum64(b[:len(b)-trailerSize]) != le.Uint64(b[len(b)-trailerSize:]) {
		return nil, corrupt("bundle: checksum mismatch")
	}
	if le.Uint16(b[6:]) != 0 || le.Uint32(b[28:]) != 0 {
		return nil, corrupt("bundle: reserved bytes set")
	}
	gen, since, count := le.Uint64(b[8:]), le.Uint64(b[16:]), le.Uint32(b[24:])
	bd := &Bundle{since: since}
	p := b[bundleHeader : len(b)-trailerSize]
	seen := map[int]bool{}
	var mdata []byte
	for i := uint32(0); i < count; i++ {
		if len(p) < 4 || uint64(le.Uint32(p)) > uint64(len(p)-4) {
			return nil, corrupt("bundle: truncated part " + strconv.Itoa(int(i)))
		}
		data := p[4 : 4+le.Uint32(p)]
		p = p[4+len(data):]
		if i == 0 {
			m, err := ParseManifest(data)
			if err != nil {
				return nil, err
			}
			if m.Generation() != gen {
				return nil, corrupt("bundle: manifest generation differs from the bundle's")
			}
			bd.m, mdata = m, data
			continue
		}
		if len(data) > 6 && Kind(data[6]) == KindTemplates {
			t, err := parseTemplates(data)
			if err != nil {
				return nil, err
			}
			if seen[-2] {
				return nil, corrupt("bundle: duplicate templates")
			}
			seen[-2] = true
			if !t.ref.same(bd.m.templates) {
				return nil, inconsistent("bundle: templates differ from the manifest")
			}
			bd.parts = append(bd.parts, Part{Kind: KindTemplates, Data: data})
			continue
		}
		k := KindShard
		if len(data) > 6 && Kind(data[6]) == KindDelta {
			k = KindDelta
		}
		t, err := parseTableFull(data, k)
		if err != nil {
			return nil, err
		}
		want, id := bd.m.delta, -1
		if k == KindShard {
			if t.shardBits != bd.m.shardBits {
				return nil, inconsistent("bundle: shard " + strconv.Itoa(t.index) + " has another shard count")
			}
			want, id = bd.m.shardRef(t.index), t.index
		}
		if seen[id] {
			return nil, corrupt("bundle: duplicate " + k.String())
		}
		seen[id] = true
		if !t.ref.same(want) {
			return nil, inconsistent("bundle: " + k.String() + " " + strconv.Itoa(t.index) + " differs from the manifest")
		}
		bd.parts = append(bd.parts, Part{Kind: k, Shard: t.index, Data: data})
	}
	if bd.m == nil || len(p) != 0 {
		return nil, corrupt("bundle: part count does not match its contents")
	}
	if (since == 0 || bd.m.delta.gen > since) && !seen[-1] {
		return nil, corrupt("bundle: delta missing")
	}
	if bd.m.templates.gen != 0 && (since == 0 || bd.m.templates.gen > since) && !seen[-2] {
		return nil, corrupt("bundle: templates missing")
	}
	for i := 0; i < bd.m.NumShards(); i++ {
		if (since == 0 || bd.m.shardRef(i).gen > since) && !seen[i] {
			return nil, corrupt("bundle: shard " + strconv.Itoa(i) + " missing")
		}
	}
	bd.parts = append(bd.parts, Part{Kind: KindManifest, Data: mdata})
	return bd, nil
}

// Manifest returns the bundle's manifest.
func (b *Bundle) Manifest() *Manifest { return b.m }

// Since returns the generation the bundle brings a fetcher up from; 0 for a
// full bundle.
func (b *Bundle) Since() uint64 { return b.since }

// Parts returns the bundle's parts in the order a fetcher must store them:
// the manifest last, so that a reader that finds a manifest finds the parts
// it lists. After the manifest, store AppendHead's result under Keys.Head.
func (b *Bundle) Parts() []Part { return b.parts }

// Complete reports whether the bundle, applied over the parts of held (the
// manifest the fetcher stored last, nil if none), leaves every part the new
// manifest lists in place. If not, the fetcher must ask for a full bundle.
func (b *Bundle) Complete(held *Manifest) error {
	if b.since == 0 {
		return nil
	}
	if held == nil || held.shardBits != b.m.shardBits {
		return inconsistent("bundle: a diff needs the previous manifest with the same shard count")
	}
	have := map[int]bool{}
	for _, p := range b.parts {
		switch p.Kind {
		case KindDelta:
			have[-1] = true
		case KindTemplates:
			have[-2] = true
		case KindShard:
			have[p.Shard] = true
		}
	}
	if !have[-1] && !held.delta.same(b.m.delta) {
		return inconsistent("bundle: the delta it leaves out is not the one held")
	}
	if !have[-2] && b.m.templates.gen != 0 && !held.templates.same(b.m.templates) {
		return inconsistent("bundle: the templates it leaves out are not the ones held")
	}
	for i := 0; i < b.m.NumShards(); i++ {
		if !have[i] && !held.shardRef(i).same(b.m.shardRef(i)) {
			return inconsistent("bundle: shard " + strconv.Itoa(i) + " it leaves out is not the one held")
		}
	}
	return nil
}
