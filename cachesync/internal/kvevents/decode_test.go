package kvevents

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// wantBatch is a fixture's expected decoding, as testdata/gen.py writes it.
type wantBatch struct {
	TS     float64     `json:"ts"`
	DPRank int         `json:"dp_rank"`
	Events []wantEvent `json:"events"`
}

type wantEvent struct {
	Kind      string      `json:"kind"`
	Hashes    []string    `json:"hashes,omitempty"`
	Parent    string      `json:"parent,omitempty"`
	Tokens    []uint32    `json:"tokens,omitempty"`
	BlockSize int         `json:"block_size"`
	LoRAID    int64       `json:"lora_id"`
	LoRAName  string      `json:"lora_name"`
	Medium    string      `json:"medium"`
	Extra     []wantExtra `json:"extra,omitempty"`
	Group     int         `json:"group"`
	SpecKind  string      `json:"spec_kind"`
	Locality  string      `json:"locality"`
	Ownership string      `json:"ownership"`
}

type wantExtra struct {
	Keys  []string `json:"keys"`
	Other int      `json:"other"`
}

// normalize turns a decoded batch into the fixture form.
func normalize(b *Batch) wantBatch {
	w := wantBatch{TS: b.TS, DPRank: b.DPRank}
	for _, e := range b.Events {
		we := wantEvent{Kind: e.Kind.String(), BlockSize: e.BlockSize, LoRAID: e.LoRAID, LoRAName: e.LoRAName,
			Medium: e.Medium, Group: e.Group, SpecKind: e.SpecKind, Locality: e.Locality, Ownership: e.Ownership}
		for _, h := range e.Hashes {
			we.Hashes = append(we.Hashes, strconv.FormatUint(h, 10))
		}
		if e.HasParent {
			we.Parent = strconv.FormatUint(e.Parent, 10)
		}
		if len(e.Tokens) > 0 {
			we.Tokens = append([]uint32(nil), e.Tokens...)
		}
		for _, x := range e.Extra {
			we.Extra = append(we.Extra, wantExtra{Keys: append([]string{}, x.Keys...), Other: x.Other})
		}
		w.Events = append(w.Events, we)
	}
	return w
}

func fixtures(t testing.TB) (map[string][]byte, map[string]wantBatch) {
	t.Helper()
	b, err := os.ReadFile("testdata/want.json")
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]wantBatch
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	payloads := map[string][]byte{}
	for name := range want {
		if payloads[name], err = os.ReadFile(filepath.Join("testdata", name+".msgpack")); err != nil {
			t.Fatal(err)
		}
	}
	return payloads, want
}

// TestDecodeFixtures decodes batches msgspec encoded with the structs of
// each vLLM and SGLang release shape, and gets what the Python side put in.
func TestDecodeFixtures(t *testing.T) {
	payloads, want := fixtures(t)
	if len(want) < 11 {
		t.Fatalf("%d fixtures", len(want))
	}
	d := NewDecoder()
	for name, w := range want {
		t.Run(name, func(t *testing.T) {
			var b Batch
			if err := d.Decode(payloads[name], &b); err != nil {
				t.Fatal(err)
			}
			gj, _ := json.MarshalIndent(normalize(&b), "", " ")
			wj, _ := json.MarshalIndent(w, "", " ")
			if string(gj) != string(wj) {
				t.Fatalf("decoded\n%s\nwant\n%s", gj, wj)
			}
		})
	}
}

// TestDecodeSameEverywhere checks that the encodings of one set of events
// decode to the same events, whatever the release's shape, where the
// release carried the field at all.
func TestDecodeSameEverywhere(t *testing.T) {
	payloads, _ := fixtures(t)
	d := NewDecoder()
	decode := func(name string) wantBatch {
		var b Batch
		if err := d.Decode(payloads[name], &b); err != nil {
			t.Fatal(err)
		}
		w := normalize(&b)
		w.DPRank = 0
		return w
	}
	base := decode("vllm-map")
	for _, name := range []string{"vllm-array", "vllm-batch-map"} {
		if got := decode(name); !reflect.DeepEqual(got, base) {
			t.Errorf("%s decodes differently from vllm-map", name)
		}
	}
	if !reflect.DeepEqual(decode("vllm-array-bytes"), decode("vllm-map-bytes")) {
		t.Error("byte hashes decode differently in arrays and maps")
	}
	if !reflect.DeepEqual(decode("vllm-array-fork"), decode("vllm-map-fork")) {
		t.Error("the fork's fields decode differently in arrays and maps")
	}
}

func enc(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeMalformed(t *testing.T) {
	stored := func(fields ...any) []byte {
		return enc(t, []any{1.5, []any{append([]any{"BlockStored"}, fields...)}, 0})
	}
	deep := []any{}
	for range 40 {
		deep = []any{deep}
	}
	tests := []struct {
		name    string
		payload []byte
	}{
		{"empty", nil},
		{"not a container", enc(t, 7)},
		{"short batch", enc(t, []any{1.5})},
		{"events not a list", enc(t, []any{1.5, "x", 0})},
		{"map without events", enc(t, map[string]any{"ts": 1.5})},
		{"event not a container", enc(t, []any{1.5, []any{7}, 0})},
		{"empty event", enc(t, []any{1.5, []any{[]any{}}, 0})},
		{"tag not a string", enc(t, []any{1.5, []any{[]any{7}}, 0})},
		{"stored too short", stored([]any{1}, nil, []any{1})},
		{"removed too short", enc(t, []any{1.5, []any{[]any{"BlockRemoved"}}, 0})},
		{"map event without type", enc(t, []any{1.5, []any{map[string]any{"block_hashes": []any{1}}}, 0})},
		{"map stored without tokens", enc(t, []any{1.5, []any{map[string]any{"type": "BlockStored", "block_hashes": []any{1}}}, 0})},
		{"hash as float", stored([]any{1.5}, nil, []any{1}, 16)},
		{"hash null", stored([]any{nil}, nil, []any{1}, 16)},
		{"hashes null", stored(nil, nil, []any{1}, 16)},
		{"negative token", stored([]any{1}, nil, []any{-1}, 16)},
		{"token over 32 bits", stored([]any{1}, nil, []any{uint64(1) << 32}, 16)},
		{"token as string", stored([]any{1}, nil, []any{"a"}, 16)},
		{"token pair too short", stored([]any{1}, nil, []any{[]any{1}}, 16)},
		{"block size as string", stored([]any{1}, nil, []any{1}, "16")},
		{"group out of range", enc(t, []any{1.5, []any{[]any{"BlockRemoved", []any{1}, nil, int64(1) << 40}}, 0})},
		{"extra keys not a list", stored([]any{1}, nil, []any{1}, 16, nil, nil, nil, "x")},
		{"deep nesting", stored([]any{1}, nil, []any{1}, 16, nil, nil, nil, nil, nil, nil, deep)},
		{"trailing bytes", append(enc(t, []any{1.5, []any{}, 0}), 0xc0)},
		{"huge array length", []byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff}},
		{"huge string length", []byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x91, 0xdb, 0xff, 0xff, 0xff, 0xff}},
	}
	d := NewDecoder()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := Batch{Events: make([]Event, 3)}
			err := d.Decode(tt.payload, &b)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v, want ErrMalformed", err)
			}
			if len(b.Events) != 0 {
				t.Fatalf("%d events after an error", len(b.Events))
			}
		})
	}
}

// TestDecodeTolerates checks what must not be an error: unknown event
// types, fields and keys, and optional fields left out.
func TestDecodeTolerates(t *testing.T) {
	tests := []struct {
		name    string
		payload []byte
		events  int
		unknown uint64
	}{
		{"unknown event type", enc(t, []any{1.5, []any{[]any{"Heartbeat", 1, 2}, []any{"AllBlocksCleared"}}, 0}), 1, 1},
		{"unknown map event type", enc(t, []any{1.5, []any{map[string]any{"type": "Heartbeat", "x": []any{1}}}, 0}), 0, 1},
		{"unknown map keys", enc(t, map[string]any{"ts": 1, "events": []any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{1}, "remaining_copy_counts": []any{1}}}, "extra": map[string]any{"a": 1}}), 1, 0},
		{"trailing array fields", enc(t, []any{1.5, []any{[]any{"BlockRemoved", []any{1}, "GPU", 0, "LOCAL", "owner", []any{1, 2}}}, 0, "later"}), 1, 0},
		{"null batch fields", enc(t, []any{nil, []any{}, nil}), 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDecoder()
			var b Batch
			if err := d.Decode(tt.payload, &b); err != nil {
				t.Fatal(err)
			}
			if len(b.Events) != tt.events || d.Unknown != tt.unknown {
				t.Fatalf("%d events, %d unknown; want %d, %d", len(b.Events), d.Unknown, tt.events, tt.unknown)
			}
		})
	}
}

// TestDecodeTruncated decodes every prefix of every fixture: each must fail
// cleanly.
func TestDecodeTruncated(t *testing.T) {
	payloads, _ := fixtures(t)
	d := NewDecoder()
	for name, p := range payloads {
		for n := range len(p) {
			var b Batch
			if err := d.Decode(p[:n], &b); !errors.Is(err, ErrMalformed) {
				t.Fatalf("%s cut to %d bytes: %v", name, n, err)
			}
		}
	}
}

func TestDecodeAllocs(t *testing.T) {
	payloads, _ := fixtures(t)
	d := NewDecoder()
	var b Batch
	for _, name := range []string{"vllm-map", "vllm-array-bytes", "vllm-array-fork"} {
		p := payloads[name]
		if err := d.Decode(p, &b); err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(100, func() { d.Decode(p, &b) }); n != 0 {
			t.Errorf("%s: %v allocations per batch", name, n)
		}
	}
}

func FuzzDecode(f *testing.F) {
	payloads, _ := fixtures(f)
	for _, p := range payloads {
		f.Add(p)
	}
	d := NewDecoder()
	// The decoder is reused, as a subscriber's is: what it keeps between
	// payloads must stay bounded whatever they declare (a run of hostile
	// payloads once grew msgpack's scratch buffer past a gigabyte).
	runs := 0
	f.Fuzz(func(t *testing.T, p []byte) {
		var b Batch
		err := d.Decode(p, &b)
		if runs++; runs%256 == 0 {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > 512<<20 {
				t.Fatalf("heap at %d MiB after %d payloads: the decoder keeps what payloads declare", ms.HeapAlloc>>20, runs)
			}
		}
		if err != nil {
			return
		}
		for _, e := range b.Events {
			if e.Kind < BlockStored || e.Kind > AllBlocksCleared {
				t.Fatalf("event kind %d", e.Kind)
			}
		}
	})
}

// TestSkipRefusesDeclaredLengths: a value the decoder passes over (here a
// batch's fourth element) that declares more bytes than the payload holds
// is refused by its header, never read into a buffer, and the decoder
// keeps nothing of it: repeated, the heap stays where it was.
func TestSkipRefusesDeclaredLengths(t *testing.T) {
	d := NewDecoder()
	for _, tail := range [][]byte{
		{0xdb, 0x7f, 0xff, 0xff, 0xff, 'x'},    // str32 of 2 GiB
		{0xc6, 0x7f, 0xff, 0xff, 0xff, 'x'},    // bin32
		{0xc9, 0x7f, 0xff, 0xff, 0xff, 1, 'x'}, // ext32
	} {
		// [ts, events: [], dp rank: nil, tail]
		payload := append([]byte{0x94, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90, 0xc0}, tail...)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for range 200 {
			var b Batch
			if err := d.Decode(payload, &b); err == nil || !strings.Contains(err.Error(), "exceeds") {
				t.Fatalf("%x: %v, want the declared length refused", tail, err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 16<<20 {
			t.Errorf("%x: the heap grew %d MiB over 200 payloads", tail, grown>>20)
		}
	}
}
