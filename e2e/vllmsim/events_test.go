package vllmsim

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
)

// wire builds expected bytes from parts written out by hand: a part that
// starts with "x" is hex (spaces allowed), anything else is literal text
// (the bytes of a msgpack string after its header).
func wire(t *testing.T, parts ...string) []byte {
	t.Helper()
	var b []byte
	for _, p := range parts {
		if rest, ok := strings.CutPrefix(p, "x"); ok {
			h, err := hex.DecodeString(strings.ReplaceAll(rest, " ", ""))
			if err != nil {
				t.Fatalf("bad hex %q: %v", p, err)
			}
			b = append(b, h...)
			continue
		}
		b = append(b, p...)
	}
	return b
}

// The fixtures follow vLLM's msgspec layout (protocols.md 1.4, 1.5):
// EventBatch [ts, events, data_parallel_rank]; BlockStored fields
// block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
// lora_name, then extra_keys, group_idx, kv_cache_spec_kind,
// kv_cache_spec_sliding_window with default None, left out of maps when
// they hold it; arrays carry them all (msgspec ignores omit_defaults for
// array_like structs, jcrist/msgspec#720). msgpack ints use the shortest
// form, ts is a float64.
func TestEventEncodingFixtures(t *testing.T) {
	var h1, h2 blockHash
	copy(h1[24:], []byte{0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08}) // int form 0x0102030405060708
	h2[31] = 0x2a                                                         // int form 42
	for i := range 24 {
		h1[i] = 0xee
	}
	gpuStored := blockStored{hashes: []blockHash{h1}, tokens: []int{1, 2, 300}, blockSize: 16,
		medium: mediumGPU, extraKeys: []extras{nil}, group: true}
	chained := blockStored{hashes: []blockHash{h2}, parent: &h1, tokens: []int{7}, blockSize: 1,
		loraID: 1, loraName: "sql", medium: mediumGPU, extraKeys: []extras{{"sql"}}, group: true}
	cpuStored := blockStored{hashes: []blockHash{h2}, tokens: []int{}, blockSize: 16, medium: mediumCPU}
	removed := blockRemoved{hashes: []blockHash{h1, h2}, medium: mediumGPU, group: true}

	const (
		ts1_5   = "xcb 3ff8000000000000" // 1.5 as float64
		hash1   = "xcf 0102030405060708" // uint64
		hash2   = "x2a"                  // positive fixint
		tokens  = "x93 01 02 cd012c"     // [1, 2, 300]
		rank0   = "x00"
		fullAtt = "full_attention"
	)
	tests := []struct {
		name       string
		enc        Encoding
		batchAsMap bool
		bytes      bool
		events     []kvEvent
		want       []byte
	}{
		{"map BlockStored", EncodingMap, false, false, []kvEvent{gpuStored}, wire(t,
			"x93", ts1_5, "x91",
			"x8b", // map of 11: type + 10 fields (sliding window left out)
			"xa4", "type", "xab", "BlockStored",
			"xac", "block_hashes", "x91", hash1,
			"xb1", "parent_block_hash", "xc0",
			"xa9", "token_ids", tokens,
			"xaa", "block_size", "x10",
			"xa7", "lora_id", "xc0",
			"xa6", "medium", "xa3", "GPU",
			"xa9", "lora_name", "xc0",
			"xaa", "extra_keys", "x91 c0",
			"xa9", "group_idx", "x00",
			"xb2", "kv_cache_spec_kind", "xae", fullAtt,
			rank0)},
		{"array BlockStored", EncodingArray, false, false, []kvEvent{gpuStored}, wire(t,
			"x93", ts1_5, "x91",
			"x9c", "xab", "BlockStored", // tag + 11 fields
			"x91", hash1, "xc0", tokens, "x10", "xc0", "xa3", "GPU", "xc0", "x91 c0", "x00", "xae", fullAtt, "xc0",
			rank0)},
		{"legacy array BlockStored", EncodingArrayLegacy, false, false, []kvEvent{gpuStored}, wire(t,
			"x93", ts1_5, "x91",
			"x98", "xab", "BlockStored", // tag + 7 fields
			"x91", hash1, "xc0", tokens, "x10", "xc0", "xa3", "GPU", "xc0",
			rank0)},
		{"map chained LoRA block", EncodingMap, false, false, []kvEvent{chained}, wire(t,
			"x93", ts1_5, "x91", "x8b",
			"xa4", "type", "xab", "BlockStored",
			"xac", "block_hashes", "x91", hash2,
			"xb1", "parent_block_hash", hash1,
			"xa9", "token_ids", "x91 07",
			"xaa", "block_size", "x01",
			"xa7", "lora_id", "x01",
			"xa6", "medium", "xa3", "GPU",
			"xa9", "lora_name", "xa3", "sql",
			"xaa", "extra_keys", "x91 91 a3", "sql", // [("sql",)]
			"xa9", "group_idx", "x00",
			"xb2", "kv_cache_spec_kind", "xae", fullAtt,
			rank0)},
		{"map CPU store and removal", EncodingMap, false, false, []kvEvent{cpuStored, removed}, wire(t,
			"x93", ts1_5, "x92",
			"x88", // type + the 7 fields without defaults
			"xa4", "type", "xab", "BlockStored",
			"xac", "block_hashes", "x91", hash2,
			"xb1", "parent_block_hash", "xc0",
			"xa9", "token_ids", "x90",
			"xaa", "block_size", "x10",
			"xa7", "lora_id", "xc0",
			"xa6", "medium", "xa3", "CPU",
			"xa9", "lora_name", "xc0",
			"x84",
			"xa4", "type", "xac", "BlockRemoved",
			"xac", "block_hashes", "x92", hash1, hash2,
			"xa6", "medium", "xa3", "GPU",
			"xa9", "group_idx", "x00",
			rank0)},
		{"array CPU store, removal, clear", EncodingArray, false, false, []kvEvent{cpuStored, removed, allBlocksCleared{}}, wire(t,
			"x93", ts1_5, "x93",
			"x9c", "xab", "BlockStored", "x91", hash2, "xc0", "x90", "x10", "xc0", "xa3", "CPU", "xc0", "xc0 c0 c0 c0",
			"x94", "xac", "BlockRemoved", "x92", hash1, hash2, "xa3", "GPU", "x00",
			"x91", "xb0", "AllBlocksCleared",
			rank0)},
		{"legacy array removal", EncodingArrayLegacy, false, false, []kvEvent{removed}, wire(t,
			"x93", ts1_5, "x91",
			"x93", "xac", "BlockRemoved", "x92", hash1, hash2, "xa3", "GPU",
			rank0)},
		{"map clear", EncodingMap, false, false, []kvEvent{allBlocksCleared{}}, wire(t,
			"x93", ts1_5, "x91", "x81", "xa4", "type", "xb0", "AllBlocksCleared", rank0)},
		{"byte hashes", EncodingArrayLegacy, false, true, []kvEvent{blockRemoved{hashes: []blockHash{h1}, medium: mediumGPU}}, wire(t,
			"x93", ts1_5, "x91",
			"x93", "xac", "BlockRemoved", "x91",
			"xc4 20", "x"+hex.EncodeToString(h1[:]), // bin8 of 32 bytes
			"xa3", "GPU",
			rank0)},
		{"map batch", EncodingMap, true, false, []kvEvent{allBlocksCleared{}}, wire(t,
			"x83",
			"xa2", "ts", ts1_5,
			"xa6", "events", "x91", "x81", "xa4", "type", "xb0", "AllBlocksCleared",
			"xb2", "data_parallel_rank", rank0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := newEventEncoder(tt.enc, tt.batchAsMap, tt.bytes).encode(1.5, tt.events, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tt.want) {
				t.Fatalf("bytes differ\n got %x\nwant %x", got, tt.want)
			}
		})
	}
}

func TestParseEncoding(t *testing.T) {
	for _, e := range []Encoding{EncodingMap, EncodingArray, EncodingArrayLegacy} {
		got, err := ParseEncoding(e.String())
		if err != nil || got != e {
			t.Errorf("ParseEncoding(%q) = %v, %v", e.String(), got, err)
		}
	}
	if _, err := ParseEncoding("json"); err == nil {
		t.Error("ParseEncoding accepted json")
	}
}
