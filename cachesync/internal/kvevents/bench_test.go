package kvevents

import (
	"testing"
)

// benchBatch is a busy engine step: 16 BlockStored events of 4 blocks of 16
// tokens each and 16 single-block BlockRemoved events, with vLLM 0.26's
// fields, as maps or as arrays.
func benchBatch(b *testing.B, maps bool) ([]byte, int) {
	var events []any
	for i := range 16 {
		hashes := []any{uint64(i)<<40 | 1, uint64(i)<<40 | 2, uint64(i)<<40 | 3, uint64(i)<<40 | 4}
		tokens := make([]any, 64)
		for j := range tokens {
			tokens[j] = 1000 + 37*j + i
		}
		extra := []any{nil, nil, nil, nil}
		if maps {
			events = append(events, map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": uint64(i) << 41,
				"token_ids": tokens, "block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil, "extra_keys": extra,
				"group_idx": 0, "kv_cache_spec_kind": "full_attention"},
				map[string]any{"type": "BlockRemoved", "block_hashes": []any{uint64(i) << 42}, "medium": "GPU", "group_idx": 0})
		} else {
			events = append(events, []any{"BlockStored", hashes, uint64(i) << 41, tokens, 16, nil, "GPU", nil, extra, 0, "full_attention", nil},
				[]any{"BlockRemoved", []any{uint64(i) << 42}, "GPU", 0})
		}
	}
	return enc(b, []any{1789095808.5, events, 0}), len(events)
}

func BenchmarkDecode(b *testing.B) {
	for _, tt := range []struct {
		name string
		maps bool
	}{{"map", true}, {"array", false}} {
		b.Run(tt.name, func(b *testing.B) {
			payload, n := benchBatch(b, tt.maps)
			d := NewDecoder()
			var batch Batch
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			for b.Loop() {
				if err := d.Decode(payload, &batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
			b.ReportMetric(64*float64(b.N)/b.Elapsed().Seconds(), "stored-blocks/s")
		})
	}
}
