package placed

import (
	"errors"
	"reflect"
	"slices"
	"testing"
)

// prompt returns n chained hashes: prompts made with the same id share
// their first shared blocks, then part.
func prompt(id uint64, shared, n int) []uint64 {
	h := make([]uint64, n)
	for i := range h {
		h[i] = uint64(i+1) * 0x9e3779b97f4a7c15
		if i >= shared {
			h[i] ^= id << 32
		}
	}
	return h
}

type hit struct {
	endpoint uint64
	blocks   int
}

func matches(t *Table, hashes []uint64, now int64) []hit {
	var got []hit
	t.Match(hashes, now, func(e uint64, b int) { got = append(got, hit{e, b}) })
	return got
}

func TestMatch(t *testing.T) {
	var tab Table
	tab.Add(0xa, prompt(1, 300, 400), 100, false, 0, 0, 1000)
	tab.Add(0xd, prompt(4, 0, 2000), 100, false, 0, 0, 1000) // longer than the samples reach
	tab.Add(0xb, prompt(2, 100, 120), 100, false, 0, 0, 1000)
	tab.Add(0xc, prompt(3, 0, 10), 100, false, 0, 0, 1000) // shorter than a stride: not recorded
	tests := []struct {
		name   string
		hashes []uint64
		now    int64
		want   []hit
	}{
		{"the same prompt: all its full strides", prompt(1, 300, 400), 10, []hit{{0xa, 400}, {0xb, 96}}},
		{"a prompt sharing 300 blocks: to within a stride", prompt(9, 300, 400), 10, []hit{{0xa, 288}, {0xb, 96}}},
		{"sharing less than a stride", prompt(9, 15, 400), 10, nil},
		{"a prompt shorter than the entry", prompt(1, 300, 40), 10, []hit{{0xa, 32}, {0xb, 32}}},
		{"a long prompt: as far as the samples reach", prompt(4, 0, 2000), 10, []hit{{0xd, Stride * MaxSamples}}},
		{"expired", prompt(1, 300, 400), 1000, nil},
	}
	for _, tt := range tests {
		if got := matches(&tab, tt.hashes, tt.now); !slices.Equal(got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestRoundTripAndBounds(t *testing.T) {
	var tab Table
	for i := range MaxEntries + 5 {
		tab.Add(uint64(i), prompt(uint64(i), 0, Stride*(MaxSamples+10)), 100, i%2 == 1, 0, int64(i), 1_000_000)
	}
	if tab.Len() != MaxEntries {
		t.Fatalf("%d entries, want the newest %d", tab.Len(), MaxEntries)
	}
	var got Table
	if err := got.Decode(tab.Append(nil)); err != nil {
		t.Fatal(err)
	}
	h := matches(&got, prompt(MaxEntries+4, 0, Stride*(MaxSamples+10)), 0)
	if len(h) != 1 || h[0] != (hit{MaxEntries + 4, Stride * MaxSamples}) {
		t.Errorf("matched %v: want the newest entry, to its last sample", h)
	}
	if h := matches(&got, prompt(0, 0, 100), 0); len(h) != 0 {
		t.Errorf("the oldest entry survived: %v", h)
	}
	got.Live(0, func(e *Entry) {
		if want := e.Endpoint%2 == 1; e.New != want {
			t.Errorf("entry %d: New %v after the round trip, want %v", e.Endpoint, e.New, want)
		}
	})
	// Adding drops what expired.
	got.Add(1, prompt(1, 0, 100), 100, false, 0, 2_000_000, 3_000_000)
	if got.Len() != 1 {
		t.Errorf("%d entries after the rest expired", got.Len())
	}
}

func TestDecodeCorrupt(t *testing.T) {
	var tab Table
	tab.Add(1, prompt(1, 0, 100), 100, false, 0, 0, 10)
	good := tab.Append(nil)
	for _, b := range [][]byte{
		[]byte("KVPL"),
		append([]byte("XXXX"), good[4:]...),
		good[:len(good)-1],
		append(slices.Clone(good), 0),
		func() []byte { b := slices.Clone(good); b[headSize+32] = 2; return b }(), // an unknown flag
	} {
		var got Table
		if err := got.Decode(b); !errors.Is(err, ErrCorrupt) || got.Len() != 0 {
			t.Errorf("Decode(%q) = %v with %d entries", b, err, got.Len())
		}
	}
	var empty Table
	if err := empty.Decode(nil); err != nil || empty.Len() != 0 {
		t.Errorf("empty value: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	var tab Table
	tab.Add(1, prompt(1, 0, 100), 100, false, 0, 0, 10)
	f.Add(tab.Append(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		var got Table
		if got.Decode(b) == nil {
			var again Table
			if err := again.Decode(got.Append(nil)); err != nil || again.Len() != got.Len() {
				t.Fatalf("re-encoding failed: %v", err)
			}
		}
	})
}

func TestNoAllocsOnceGrown(t *testing.T) {
	var tab Table
	h := prompt(1, 0, 700)
	buf := make([]byte, 0, 1<<16)
	for range MaxEntries * 2 {
		tab.Add(1, h, 100, false, 0, 0, 10)
	}
	buf = tab.Append(buf[:0])
	n := testing.AllocsPerRun(100, func() {
		_ = tab.Decode(buf)
		tab.Add(2, h, 100, false, 0, 0, 10)
		tab.Match(h, 0, func(uint64, int) {})
	})
	if n != 0 {
		t.Errorf("%v allocations per decode, add and match", n)
	}
}

// TestLive: the live entries, with when each was placed, its predicted
// time to first token and the blocks it brings its endpoint, through the
// encoding; expired ones are left out.
func TestLive(t *testing.T) {
	var tab Table
	tab.Add(0xa, prompt(1, 0, 400), 400, false, 700, 100, 5000)
	tab.Add(0xb, prompt(2, 0, 300), 250, false, 500, 200, 5000)
	tab.Add(0xa, prompt(3, 0, 200), 200, false, 300, 300, 350)
	var got Table
	if err := got.Decode(tab.Append(nil)); err != nil {
		t.Fatal(err)
	}
	var live []Entry
	got.Live(400, func(e *Entry) {
		live = append(live, Entry{Endpoint: e.Endpoint, At: e.At, TTFT: e.TTFT, Blocks: e.Blocks})
	})
	want := []Entry{{Endpoint: 0xa, At: 100, TTFT: 700, Blocks: 400}, {Endpoint: 0xb, At: 200, TTFT: 500, Blocks: 250}}
	if !reflect.DeepEqual(live, want) {
		t.Errorf("live at 400: %+v, want %+v", live, want)
	}
}
