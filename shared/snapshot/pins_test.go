package snapshot

import "testing"

func TestGroupKey(t *testing.T) {
	long := make([]uint64, 40)
	for i := range long {
		long[i] = uint64(i + 1)
	}
	for _, tc := range []struct {
		name   string
		hashes []uint64
		key    uint64
		ok     bool
	}{
		{"no block", nil, 0, false},
		{"one block", long[:1], 1, true},
		{"shorter than the depth", long[:9], 9, true},
		{"at the depth", long[:GroupDepth], GroupDepth, true},
		{"longer: its head names it", long, GroupDepth, true},
	} {
		if key, ok := GroupKey(tc.hashes); key != tc.key || ok != tc.ok {
			t.Errorf("%s: GroupKey = %d, %v; want %d, %v", tc.name, key, ok, tc.key, tc.ok)
		}
	}
}

func pinImage(t *testing.T, pins ...[]uint64) (*Manifest, []byte) {
	t.Helper()
	return image(t, len(pins), func(i int, info *EndpointInfo) { info.Pins = pins[i] })
}

func TestPinned(t *testing.T) {
	m, _ := pinImage(t, []uint64{30, 10}, nil, []uint64{20, 10, 1 << 63})
	for _, tc := range []struct {
		key  uint64
		slot int
		ok   bool
	}{
		{10, 0, true}, // pinned twice: the lower slot's
		{20, 2, true},
		{30, 0, true},
		{1 << 63, 2, true},
		{0, 0, false},
		{15, 0, false},
		{1<<64 - 1, 0, false},
	} {
		if slot, ok := m.Pinned(tc.key); slot != tc.slot || ok != tc.ok {
			t.Errorf("Pinned(%d) = %d, %v; want %d, %v", tc.key, slot, ok, tc.slot, tc.ok)
		}
	}
	for i, want := range []int{2, 0, 2} {
		if got := m.Endpoint(i).Pins(); got != want {
			t.Errorf("endpoint %d pins %d groups, want %d", i, got, want)
		}
	}
	if !m.HasPins() {
		t.Error("HasPins is false")
	}
	if none, _ := pinImage(t, nil, nil); none.HasPins() {
		t.Error("a snapshot without pins has some")
	}
	if allocs := testing.AllocsPerRun(100, func() { m.Pinned(20) }); allocs != 0 {
		t.Errorf("Pinned allocates %v times", allocs)
	}
	info := endpointInfo(0)
	info.Pins = make([]uint64, MaxPins+1)
	if err := info.validate(); err == nil {
		t.Error("more than MaxPins pins: no error")
	}
}

func TestCorruptPinRows(t *testing.T) {
	_, raw := pinImage(t, []uint64{10, 30}, []uint64{20})
	rows := len(raw) - trailerSize - 3*pinRowSize
	row := func(k, off int) int { return rows + k*pinRowSize + off }
	epRow := manifestFixed + refSize*2 // shard bits 1: two shard references
	for name, f := range map[string]func(b []byte){
		"a row for an absent endpoint":      func(b []byte) { le.PutUint16(b[row(0, 8):], 7) },
		"keys out of order":                 func(b []byte) { le.PutUint64(b[row(1, 0):], 5) },
		"a key twice":                       func(b []byte) { le.PutUint64(b[row(1, 0):], 10) },
		"reserved bytes":                    func(b []byte) { b[row(2, 15)] = 1 },
		"counts that do not match the rows": func(b []byte) { le.PutUint16(b[row(1, 8):], 0) },
		"a count beyond the bytes":          func(b []byte) { b[epRow+23] = 3 },
		"counts moved to another endpoint":  func(b []byte) { b[epRow+endpointSize+23] = 0; b[epRow+23] = 3 },
	} {
		corruptEach(t, raw, name, f)
	}
}
