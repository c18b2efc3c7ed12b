package snapshot

import (
	"errors"
	"testing"

	"github.com/kvroute/kvroute/shared/blockhash"
)

// textHashes returns the chained block hashes of text under a model's seed.
func textHashes(text string) []uint64 {
	return blockhash.Append(nil, blockhash.Seed("gemma-3-270m", ""), []byte(text), blockhash.Config{BlockSize: 4})
}

func slotImage(t *testing.T, slots ...[]EngineSlot) *Manifest {
	t.Helper()
	m, _ := image(t, len(slots), func(i int, info *EndpointInfo) { info.Slots = slots[i] })
	return m
}

func TestSlotHolding(t *testing.T) {
	// 14 blocks of 4 bytes, 17 with " Group A's "
	system := "You are a support agent for a company that sells things."
	groupA, groupB := textHashes(system+" Group A's rules."), textHashes("Another tenant entirely, with its own prompt.")
	m := slotImage(t,
		[]EngineSlot{{ID: 1, Hashes: groupB}, {ID: 0, Busy: true, Remaining: 12, Hashes: groupA}},
		nil,
		[]EngineSlot{{ID: 0, Busy: true, Remaining: 3, Hashes: groupA}, {ID: 1, Hashes: groupA}, {ID: 2}},
	)
	cases := []struct {
		name     string
		endpoint int
		prompt   []uint64
		want     SlotMatch
		ok       bool
	}{
		{"the slot holding the system prompt, busy", 0, textHashes(system + " Group A's other question?"), SlotMatch{ID: 0, Busy: true, Remaining: 12, Blocks: 16}, true},
		{"the other tenant's slot", 0, textHashes("Another tenant entirely, with its own prompt. And a question."), SlotMatch{ID: 1, Blocks: 8}, true},
		{"the whole prompt", 0, groupB, SlotMatch{ID: 1, Blocks: 8}, true},
		{"nobody's prompt", 0, textHashes("Nothing anyone holds here at all."), SlotMatch{}, false},
		{"two blocks in common", 0, textHashes("You are someone else entirely."), SlotMatch{ID: 0, Busy: true, Remaining: 12, Blocks: 2}, true},
		{"an endpoint without slots", 1, groupA, SlotMatch{}, false},
		{"an idle copy before a busy one", 2, groupA, SlotMatch{ID: 1, Blocks: 16}, true},
		{"an empty prompt", 0, nil, SlotMatch{}, false},
	}
	for _, c := range cases {
		got, ok := m.SlotHolding(c.endpoint, c.prompt)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: SlotHolding = %+v, %v; want %+v, %v", c.name, got, ok, c.want, c.ok)
		}
	}
	for i, want := range [][2]int{{2, 2}, {0, 0}, {2, 3}} {
		if held, total := m.SlotsHeld(i); held != want[0] || total != want[1] {
			t.Errorf("endpoint %d: SlotsHeld = %d of %d, want %d of %d", i, held, total, want[0], want[1])
		}
	}
	if allocs := testing.AllocsPerRun(100, func() { m.SlotHolding(0, groupA) }); allocs != 0 {
		t.Errorf("SlotHolding allocates %v times", allocs)
	}
}

func TestSlotsValidation(t *testing.T) {
	for name, slots := range map[string][]EngineSlot{
		"an id twice":     {{ID: 1}, {ID: 1}},
		"an id too large": {{ID: MaxEngineSlots}},
		"a negative id":   {{ID: -1}},
		"negative tokens": {{ID: 0, Remaining: -1}},
		"too many slots":  make([]EngineSlot, MaxEngineSlots+1),
	} {
		if name == "too many slots" {
			for i := range slots {
				slots[i].ID = i % MaxEngineSlots
			}
		}
		info := endpointInfo(0)
		info.Slots = slots
		if err := info.validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestCorruptSlotRows(t *testing.T) {
	a := textHashes("You are a support agent for a company that sells things.")
	b := newBuilder(t, BuilderConfig{ShardBits: 1}, 2)
	info := endpointInfo(0)
	info.Slots = []EngineSlot{{ID: 0, Hashes: a}, {ID: 1, Hashes: a[:3]}}
	if _, err := b.SetEndpoint(info); err != nil {
		t.Fatal(err)
	}
	raw := b.Build(epoch).manifest
	rows := len(raw) - trailerSize - 2*slotRowSize
	row := func(k, off int) int { return rows + k*slotRowSize + off }
	for name, f := range map[string]func(b []byte){
		"a row for a vacant or absent endpoint": func(b []byte) { le.PutUint16(b[row(0, 0):], 7) },
		"rows out of order":                     func(b []byte) { le.PutUint16(b[row(1, 2):], 0) },
		"an unknown flag":                       func(b []byte) { b[row(0, 4)] = 2 },
		"hashes kept, but counted as none":      func(b []byte) { b[row(1, 5)] = 0 },
		"more depths than blocks":               func(b []byte) { b[row(1, 5)] = 4 },
		"a hash it does not keep":               func(b []byte) { le.PutUint64(b[row(1, 16+8*3):], 1) },
		"reserved bytes":                        func(b []byte) { b[row(0, 6)] = 1 },
		"a row count beyond the bytes":          func(b []byte) { b[33] = 3 },
	} {
		corruptEach(t, raw, name, f)
	}
}

// corruptEach checks that raw, a manifest, parses, and that with edit
// applied (and the checksum resealed) it is refused as corrupt.
func corruptEach(t *testing.T, raw []byte, name string, edit func(b []byte)) {
	t.Helper()
	if _, err := ParseManifest(raw); err != nil {
		t.Fatalf("the unaltered manifest: %v", err)
	}
	c := append([]byte(nil), raw...)
	edit(c)
	if _, err := ParseManifest(reseal(c)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("%s: ParseManifest = %v, want ErrCorrupt", name, err)
	}
}
