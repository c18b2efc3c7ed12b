package snapshot

import (
	"strconv"

	"github.com/kvroute/kvroute/shared/errdetail"
)

const (
	headMagic = "KVRH"
	headSize  = 24
)

// Keys names the shared-data keys a snapshot is stored under: a small head
// (generation and manifest checksum) that readers poll, the manifest, the
// delta and one key per shard.
type Keys struct {
	prefix, head, manifest, delta, templates string
	shards                                   []string
}

// NewKeys returns the keys of the snapshot stored under prefix.
func NewKeys(prefix string) *Keys {
	return &Keys{prefix: prefix, head: prefix + "head", manifest: prefix + "manifest", delta: prefix + "delta", templates: prefix + "templates"}
}

// Head returns the key of the head.
func (k *Keys) Head() string { return k.head }

// Manifest returns the key of the manifest.
func (k *Keys) Manifest() string { return k.manifest }

// Delta returns the key of the delta.
func (k *Keys) Delta() string { return k.delta }

// Templates returns the key of the chat templates.
func (k *Keys) Templates() string { return k.templates }

// Shard returns the key of shard i.
func (k *Keys) Shard(i int) string {
	for len(k.shards) <= i {
		k.shards = append(k.shards, k.prefix+"shard/"+strconv.Itoa(len(k.shards)))
	}
	return k.shards[i]
}

// Part returns the key of a bundle part.
func (k *Keys) Part(p Part) string {
	switch p.Kind {
	case KindManifest:
		return k.manifest
	case KindDelta:
		return k.delta
	case KindTemplates:
		return k.templates
	}
	return k.Shard(p.Shard)
}

// AppendHead appends the head of the manifest: 24 bytes naming its
// generation and checksum. A fetcher stores it last; a reader that finds
// the head unchanged has nothing to do.
func (m *Manifest) AppendHead(dst []byte) []byte {
	dst = append(dst, headMagic...)
	dst = le.AppendUint16(dst, Version)
	dst = le.AppendUint16(dst, 0)
	dst = le.AppendUint64(dst, m.ref.gen)
	return le.AppendUint64(dst, m.ref.sum)
}

func parseHead(b []byte) (gen, sum uint64, err error) {
	if len(b) != headSize || string(b[:4]) != headMagic || le.Uint16(b[6:]) != 0 {
		return 0, 0, corrupt("bad head")
	}
	if v := le.Uint16(b[4:]); v != Version {
		return 0, 0, errdetail.New(ErrVersion, "head: version "+strconv.Itoa(int(v)))
	}
	return le.Uint64(b[8:]), le.Uint64(b[16:]), nil
}

// View is what one reader (a filter worker) holds of a snapshot: the
// manifest, the delta and every shard, each kept as the byte slice it was
// read as. Lookups run on those bytes. A View is not safe for concurrent
// use.
type View struct {
	keys   *Keys
	m      Manifest
	delta  table
	tmpl   templates
	shards []table
	spare  []table
	shift  uint8
	loaded bool
}

// NewView returns an empty view of the snapshot stored under keys.
func NewView(keys *Keys) *View { return &View{keys: keys} }

// Loaded reports whether the view holds a snapshot.
func (v *View) Loaded() bool { return v.loaded }

// Manifest returns the manifest of the snapshot held, nil if none.
func (v *View) Manifest() *Manifest {
	if !v.loaded {
		return nil
	}
	return &v.m
}

// Size returns the bytes the view holds.
func (v *View) Size() int {
	if !v.loaded {
		return 0
	}
	n := int(v.m.ref.size) + int(v.delta.ref.size) + int(v.tmpl.ref.size)
	for i := range v.shards {
		n += int(v.shards[i].ref.size)
	}
	return n
}

// RefreshStats says what one Refresh read.
type RefreshStats struct {
	Calls   int  // values read
	Bytes   int  // bytes in those values: what was copied into the reader
	Changed bool // a new generation was adopted
}

type readError struct {
	key string
	err error
}

func (e *readError) Error() string { return "snapshot: reading " + e.key + ": " + e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

// Refresh brings the view up to the snapshot stored in shared data, reading
// through get (which returns the value under a key). It reads the head; if
// the generation moved it reads the manifest and then only the parts whose
// generation or checksum differ from those held. The view keeps the slices
// get returns, which must not change afterwards.
//
// Either every part matches the new manifest and the view adopts it, or
// the view keeps the snapshot it had and Refresh returns the error:
// ErrInconsistent means the fetcher was storing a new generation meanwhile
// and a later Refresh will succeed.
func (v *View) Refresh(get func(key string) ([]byte, error)) (RefreshStats, error) {
	var st RefreshStats
	read := func(key string) ([]byte, error) {
		b, err := get(key)
		if err != nil {
			return nil, &readError{key, err}
		}
		st.Calls++
		st.Bytes += len(b)
		return b, nil
	}
	hb, err := read(v.keys.Head())
	if err != nil {
		return st, err
	}
	gen, sum, err := parseHead(hb)
	if err != nil {
		return st, err
	}
	if v.loaded && gen == v.m.ref.gen && sum == v.m.ref.sum {
		return st, nil
	}
	mb, err := read(v.keys.Manifest())
	if err != nil {
		return st, err
	}
	var m Manifest
	if err := m.parse(mb); err != nil {
		return st, err
	}
	if m.ref.gen != gen || m.ref.sum != sum {
		return st, inconsistent("manifest does not match the head")
	}
	same := v.loaded && m.shardBits == v.m.shardBits
	delta := v.delta
	if !v.loaded || !delta.ref.same(m.delta) {
		if delta, err = v.readTable(read, v.keys.Delta(), KindDelta, m.delta); err != nil {
			return st, err
		}
	}
	tmpl := v.tmpl
	switch {
	case m.templates.gen == 0:
		tmpl = templates{}
	case !v.loaded || !tmpl.ref.same(m.templates):
		b, err := read(v.keys.Templates())
		if err != nil {
			return st, err
		}
		if tmpl, err = parseTemplates(b); err != nil {
			return st, &readError{v.keys.Templates(), err}
		}
		if !tmpl.ref.same(m.templates) {
			return st, inconsistent(v.keys.Templates() + " is not the part the manifest lists")
		}
	}
	shards := v.spare[:0]
	for i := 0; i < m.NumShards(); i++ {
		want := m.shardRef(i)
		if same && v.shards[i].ref.same(want) {
			shards = append(shards, v.shards[i])
			continue
		}
		t, err := v.readTable(read, v.keys.Shard(i), KindShard, want)
		if err != nil {
			return st, err
		}
		if t.index != i || t.shardBits != m.shardBits {
			return st, inconsistent("shard " + strconv.Itoa(i) + " is stored under another shard's key")
		}
		shards = append(shards, t)
	}
	v.spare, v.shards = v.shards, shards
	clear(v.spare[:cap(v.spare)]) // drop references to replaced parts
	v.m, v.delta, v.tmpl, v.shift, v.loaded = m, delta, tmpl, 64-m.shardBits, true
	st.Changed = true
	return st, nil
}

func (v *View) readTable(read func(string) ([]byte, error), key string, k Kind, want ref) (table, error) {
	b, err := read(key)
	if err != nil {
		return table{}, err
	}
	t, err := parseTable(b, k)
	if err != nil {
		return table{}, &readError{key, err}
	}
	if !t.ref.same(want) {
		return table{}, inconsistent(key + " is not the part the manifest lists")
	}
	return t, nil
}

// Lookup returns the endpoints holding block h. It does not allocate.
func (v *View) Lookup(h uint64) Holders {
	if !v.loaded {
		return Holders{}
	}
	if hs, ok := v.delta.find(h); ok {
		return hs
	}
	hs, _ := v.shards[h>>v.shift].find(h)
	return hs
}
