package snapshot

import (
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"
)

var errNotFound = errors.New("not found")

// store stands in for Envoy shared data: one fetcher writes bundles into
// it, readers Refresh from it.
type store struct {
	keys *Keys
	kv   map[string][]byte
	held *Manifest // what the fetcher stored last
}

func newStore() *store { return &store{keys: NewKeys("kvroute/"), kv: map[string][]byte{}} }

func (s *store) get(k string) ([]byte, error) {
	b, ok := s.kv[k]
	if !ok {
		return nil, errNotFound
	}
	return b, nil
}

// fetch does what the filter's fetcher does with one response: parse,
// check it completes what is held, store parts with the manifest last,
// then the head. It returns the bundle size.
func (s *store) fetch(t testing.TB, im *Image) int {
	t.Helper()
	var since uint64
	if s.held != nil {
		since = s.held.Generation()
	}
	body := im.AppendBundle(nil, since)
	b, err := ParseBundle(body)
	if err != nil {
		t.Fatalf("ParseBundle: %v", err)
	}
	if err := b.Complete(s.held); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	for _, p := range b.Parts() {
		s.kv[s.keys.Part(p)] = p.Data
	}
	s.kv[s.keys.Head()] = b.Manifest().AppendHead(nil)
	s.held = b.Manifest()
	return len(body)
}

// model is the reference index: hash -> slot -> tier mask.
type model map[uint64]map[int]uint8

func (m model) add(h uint64, slot int, t Tier) {
	if m[h] == nil {
		m[h] = map[int]uint8{}
	}
	m[h][slot] |= tierMask(t)
}

func (m model) remove(h uint64, slot int, t Tier) {
	if m[h] == nil {
		return
	}
	if m[h][slot] &^= tierMask(t); m[h][slot] == 0 {
		delete(m[h], slot)
	}
	if len(m[h]) == 0 {
		delete(m, h)
	}
}

func (m model) clearSlot(slot int) {
	for h := range m {
		m.remove(h, slot, TierGPU)
		m.remove(h, slot, TierCPU)
	}
}

// want returns the holders the model expects for h, as holder codes.
func (m model) want(h uint64) []Holder {
	var out []Holder
	for _, s := range slices.Sorted(maps.Keys(m[h])) {
		t := TierCPU
		if m[h][s]&maskGPU != 0 {
			t = TierGPU
		}
		out = append(out, Holder(holderCode(s, t)))
	}
	return out
}

func holderList(h Holders) []Holder {
	var out []Holder
	for i := 0; i < h.Len(); i++ {
		out = append(out, h.At(i))
	}
	return out
}

// checkView compares every hash of the model, and some absent ones, with
// what the view returns.
func checkView(t testing.TB, v *View, m model, absent int, rng *rand.Rand) {
	t.Helper()
	for h := range m {
		if got, want := holderList(v.Lookup(h)), m.want(h); !slices.Equal(got, want) {
			t.Fatalf("Lookup(%#x) = %v, want %v", h, got, want)
		}
	}
	for range absent {
		h := rng.Uint64()
		if _, ok := m[h]; !ok {
			if got := v.Lookup(h); got.Len() != 0 {
				t.Fatalf("Lookup(absent %#x) = %v", h, holderList(got))
			}
		}
	}
}

func endpointInfo(i int) EndpointInfo {
	return EndpointInfo{
		Addr:          "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256) + ":8000",
		Models:        []string{"meta-llama/Llama-3.1-8B-Instruct"},
		Health:        HealthHealthy,
		Running:       i,
		Waiting:       i % 3,
		KVCacheUsage:  0.5,
		PrefillTokens: 1000 * i,
		PrefillRate:   15928,
		// Odd endpoints were scraped i quarter-seconds before the build
		// (at epoch); even ones say nothing.
		LoadAt:       loadAt(i),
		ShowsReports: i%3 == 0,
	}
}

func loadAt(i int) time.Time {
	if i%2 == 0 {
		return time.Time{}
	}
	return epoch.Add(-time.Duration(i) * 250 * time.Millisecond)
}

func newBuilder(t testing.TB, cfg BuilderConfig, endpoints int) *Builder {
	t.Helper()
	b, err := NewBuilder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range endpoints {
		if slot, err := b.SetEndpoint(endpointInfo(i)); err != nil || slot != i {
			t.Fatalf("SetEndpoint(%d) = %d, %v", i, slot, err)
		}
	}
	return b
}

// image builds a manifest of n endpoints, each as endpointInfo(i) after
// set, and returns it parsed and raw.
func image(t *testing.T, n int, set func(i int, info *EndpointInfo)) (*Manifest, []byte) {
	t.Helper()
	b := newBuilder(t, BuilderConfig{ShardBits: 1}, n)
	for i := range n {
		info := endpointInfo(i)
		set(i, &info)
		if _, err := b.SetEndpoint(info); err != nil {
			t.Fatal(err)
		}
	}
	raw := b.Build(epoch).manifest
	m, err := ParseManifest(raw)
	if err != nil {
		t.Fatal(err)
	}
	return m, raw
}

var epoch = time.Unix(1_790_000_000, 0)
