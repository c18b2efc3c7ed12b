package vllmsim

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Encoding selects how KV-cache events are laid out in msgpack, following
// the shapes vLLM has shipped. vLLM encodes with msgspec, omit_defaults=True:
// in a map, a field that has a default and holds it is left out; arrays
// always carry every field (msgspec does not omit in array_like structs).
type Encoding int

// The event encodings.
const (
	// EncodingMap encodes each event as a map tagged by "type", as vLLM does
	// since vllm-project/vllm#42892 (v0.26.0 and main).
	EncodingMap Encoding = iota
	// EncodingArray encodes each event as a positional array whose element 0
	// is the tag, followed by every field of the current schema (through
	// kv_cache_spec_sliding_window): the last array-encoded vLLM.
	EncodingArray
	// EncodingArrayLegacy is the array form of earlier releases, whose
	// events end at lora_name (BlockStored) and medium (BlockRemoved).
	EncodingArrayLegacy
)

var encodingNames = map[Encoding]string{
	EncodingMap:         "map",
	EncodingArray:       "array",
	EncodingArrayLegacy: "array-legacy",
}

// String returns the encoding's flag name.
func (e Encoding) String() string {
	if s, ok := encodingNames[e]; ok {
		return s
	}
	return fmt.Sprintf("Encoding(%d)", int(e))
}

// ParseEncoding returns the encoding with the given flag name.
func ParseEncoding(s string) (Encoding, error) {
	for e, name := range encodingNames {
		if name == s {
			return e, nil
		}
	}
	return 0, fmt.Errorf("unknown event encoding %q (want map, array or array-legacy)", s)
}

// Storage media named in events: vLLM's MEDIUM_GPU and the CPU offload
// tier; and the locality vLLM 0.33's offloading connector gives its copies.
const (
	mediumGPU     = "GPU"
	mediumCPU     = "CPU"
	localityLocal = "LOCAL"
)

// kvEvent is one of blockStored, blockRemoved, allBlocksCleared.
type kvEvent interface{ tag() string }

// blockStored reports blocks that entered a tier. tokens holds the tokens of
// all blocks, concatenated; CPU-tier stores carry none, as vLLM's offloading
// connector sends them.
type blockStored struct {
	hashes    []blockHash
	parent    *blockHash // nil: the chain starts at the root
	tokens    []int
	blockSize int
	loraID    int      // 0: None
	loraName  string   // "": None
	extraKeys []extras // one per block; nil: None (field omitted)
	medium    string
	group     bool   // send group_idx=0 and kv_cache_spec_kind, as GPU-tier events do
	locality  string // "": None (map encoding only: the array layouts predate it)
}

// extras is one block's extra keys tuple; nil encodes as None.
type extras []string

type blockRemoved struct {
	hashes   []blockHash
	medium   string
	group    bool
	locality string
}

type allBlocksCleared struct{}

func (blockStored) tag() string      { return "BlockStored" }
func (blockRemoved) tag() string     { return "BlockRemoved" }
func (allBlocksCleared) tag() string { return "AllBlocksCleared" }

// eventEncoder writes event batches. It is not safe for concurrent use.
type eventEncoder struct {
	enc         Encoding
	batchAsMap  bool // encode the outer batch as a map (see Config.BatchAsMap)
	bytesHashes bool
	buf         bytes.Buffer
	e           *msgpack.Encoder
}

func newEventEncoder(enc Encoding, batchAsMap, bytesHashes bool) *eventEncoder {
	ee := &eventEncoder{enc: enc, batchAsMap: batchAsMap, bytesHashes: bytesHashes}
	ee.e = msgpack.NewEncoder(&ee.buf)
	return ee
}

// field is one struct field in declaration order. def reports that the field
// has a default and holds it, so omit_defaults leaves it out.
type field struct {
	name  string
	def   bool
	write func(*msgpack.Encoder) error
}

// encode returns the msgpack bytes of one EventBatch
// {ts, events, data_parallel_rank}. The returned slice is fresh.
func (ee *eventEncoder) encode(ts float64, events []kvEvent, dpRank int) ([]byte, error) {
	ee.buf.Reset()
	e := ee.e
	var err error
	if ee.batchAsMap {
		err = first(e.EncodeMapLen(3), e.EncodeString("ts"), e.EncodeFloat64(ts), e.EncodeString("events"))
	} else {
		err = first(e.EncodeArrayLen(3), e.EncodeFloat64(ts))
	}
	if err == nil {
		err = e.EncodeArrayLen(len(events))
	}
	for _, ev := range events {
		if err != nil {
			break
		}
		err = ee.event(ev)
	}
	if err == nil && ee.batchAsMap {
		err = e.EncodeString("data_parallel_rank")
	}
	if err == nil {
		err = e.EncodeInt(int64(dpRank))
	}
	if err != nil {
		return nil, fmt.Errorf("vllmsim: encode event batch: %w", err)
	}
	return bytes.Clone(ee.buf.Bytes()), nil
}

func (ee *eventEncoder) event(ev kvEvent) error {
	var fields []field
	switch ev := ev.(type) {
	case blockStored:
		fields = ee.storedFields(ev)
	case blockRemoved:
		fields = []field{
			{"block_hashes", false, ee.hashList(ev.hashes)},
			{"medium", false, optString(ev.medium)},
		}
		if ee.enc != EncodingArrayLegacy {
			fields = append(fields, field{"group_idx", !ev.group, optInt(0, ev.group)})
		}
		if ee.enc == EncodingMap {
			fields = append(fields, field{"locality", ev.locality == "", optString(ev.locality)})
		}
	case allBlocksCleared:
	}
	e := ee.e
	if ee.enc == EncodingMap {
		n := 0
		for _, f := range fields {
			if !f.def {
				n++
			}
		}
		if err := first(e.EncodeMapLen(n+1), e.EncodeString("type"), e.EncodeString(ev.tag())); err != nil {
			return err
		}
		for _, f := range fields {
			if f.def {
				continue
			}
			if err := first(e.EncodeString(f.name), f.write(e)); err != nil {
				return err
			}
		}
		return nil
	}
	// msgspec ignores omit_defaults for array_like structs (jcrist/msgspec#720):
	// arrays carry every field their vLLM release declares.
	if err := first(e.EncodeArrayLen(len(fields)+1), e.EncodeString(ev.tag())); err != nil {
		return err
	}
	for _, f := range fields {
		if err := f.write(e); err != nil {
			return err
		}
	}
	return nil
}

func (ee *eventEncoder) storedFields(ev blockStored) []field {
	fields := []field{
		{"block_hashes", false, ee.hashList(ev.hashes)},
		{"parent_block_hash", false, ee.optHash(ev.parent)},
		{"token_ids", false, func(e *msgpack.Encoder) error {
			if err := e.EncodeArrayLen(len(ev.tokens)); err != nil {
				return err
			}
			for _, t := range ev.tokens {
				if err := e.EncodeInt(int64(t)); err != nil {
					return err
				}
			}
			return nil
		}},
		{"block_size", false, func(e *msgpack.Encoder) error { return e.EncodeInt(int64(ev.blockSize)) }},
		{"lora_id", false, optInt(ev.loraID, ev.loraID != 0)},
		{"medium", false, optString(ev.medium)},
		{"lora_name", false, optString(ev.loraName)},
	}
	if ee.enc == EncodingArrayLegacy {
		return fields
	}
	kind := ""
	if ev.group {
		kind = "full_attention"
	}
	fields = append(fields,
		field{"extra_keys", ev.extraKeys == nil, func(e *msgpack.Encoder) error {
			if ev.extraKeys == nil {
				return e.EncodeNil()
			}
			if err := e.EncodeArrayLen(len(ev.extraKeys)); err != nil {
				return err
			}
			for _, x := range ev.extraKeys {
				if x == nil {
					if err := e.EncodeNil(); err != nil {
						return err
					}
					continue
				}
				if err := e.EncodeArrayLen(len(x)); err != nil {
					return err
				}
				for _, s := range x {
					if err := e.EncodeString(s); err != nil {
						return err
					}
				}
			}
			return nil
		}},
		field{"group_idx", !ev.group, optInt(0, ev.group)},
		field{"kv_cache_spec_kind", !ev.group, optString(kind)},
		field{"kv_cache_spec_sliding_window", true, optInt(0, false)},
	)
	if ee.enc == EncodingMap {
		fields = append(fields, field{"locality", ev.locality == "", optString(ev.locality)})
	}
	return fields
}

func (ee *eventEncoder) hashList(hs []blockHash) func(*msgpack.Encoder) error {
	return func(e *msgpack.Encoder) error {
		if err := e.EncodeArrayLen(len(hs)); err != nil {
			return err
		}
		for i := range hs {
			if err := ee.hash(e, &hs[i]); err != nil {
				return err
			}
		}
		return nil
	}
}

func (ee *eventEncoder) optHash(h *blockHash) func(*msgpack.Encoder) error {
	return func(e *msgpack.Encoder) error {
		if h == nil {
			return e.EncodeNil()
		}
		return ee.hash(e, h)
	}
}

func (ee *eventEncoder) hash(e *msgpack.Encoder, h *blockHash) error {
	if ee.bytesHashes {
		return e.EncodeBytes(h[:])
	}
	return e.EncodeUint(h.uint64())
}

func optString(s string) func(*msgpack.Encoder) error {
	return func(e *msgpack.Encoder) error {
		if s == "" {
			return e.EncodeNil()
		}
		return e.EncodeString(s)
	}
}

func optInt(n int, present bool) func(*msgpack.Encoder) error {
	return func(e *msgpack.Encoder) error {
		if !present {
			return e.EncodeNil()
		}
		return e.EncodeInt(int64(n))
	}
}

// first returns the first non-nil error; the encoder writes to a
// bytes.Buffer, so errors are not expected, only propagated.
func first(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
