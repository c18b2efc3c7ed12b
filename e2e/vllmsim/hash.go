package vllmsim

import (
	"crypto/sha256"
	"encoding/binary"
)

// blockHash is a block hash as vLLM keeps it internally: 32 bytes of SHA-256.
type blockHash [32]byte

// uint64 is the hash as vLLM publishes it by default
// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1): the last 8 bytes, big-endian.
func (h blockHash) uint64() uint64 { return binary.BigEndian.Uint64(h[24:]) }

// hasher computes vLLM's sha256_cbor chained block hashes:
//
//	hash_i = sha256(cbor_canonical((parent_or_NONE_HASH, tuple(tokens_i), extra_keys_i)))
//
// where NONE_HASH = sha256(cbor_canonical(PYTHONHASHSEED)) (vllm/v1/core/kv_cache_utils.py
// hash_block_tokens and init_none_hash; vllm/utils/hashing.py sha256_cbor).
// The CBOR is written by hand: the input only ever holds byte strings,
// unsigned integers, text strings, arrays and null, and canonical CBOR of
// those is their shortest-form encoding.
type hasher struct {
	none blockHash
	buf  []byte
}

func newHasher(seed string) *hasher {
	var b []byte
	b = cborText(b, seed)
	return &hasher{none: sha256.Sum256(b)}
}

// block returns the hash of one full block chained after parent (nil for the
// first block). extra is the block's extra keys tuple, nil for None.
func (h *hasher) block(parent *blockHash, tokens []int, extra []string) blockHash {
	if parent == nil {
		parent = &h.none
	}
	b := h.buf[:0]
	b = cborHead(b, 4, 3)
	b = cborHead(b, 2, uint64(len(parent)))
	b = append(b, parent[:]...)
	b = cborHead(b, 4, uint64(len(tokens)))
	for _, t := range tokens {
		b = cborHead(b, 0, uint64(t))
	}
	if extra == nil {
		b = append(b, 0xf6) // null
	} else {
		b = cborHead(b, 4, uint64(len(extra)))
		for _, s := range extra {
			b = cborText(b, s)
		}
	}
	h.buf = b
	return sha256.Sum256(b)
}

// cborHead appends a CBOR head of the given major type with its argument in
// the shortest form (RFC 8949 section 4.2.1, which cbor2's canonical mode uses).
func cborHead(b []byte, major byte, n uint64) []byte {
	m := major << 5
	switch {
	case n < 24:
		return append(b, m|byte(n))
	case n <= 0xff:
		return append(b, m|24, byte(n))
	case n <= 0xffff:
		return append(b, m|25, byte(n>>8), byte(n))
	case n <= 0xffffffff:
		return append(b, m|26, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	b = append(b, m|27)
	return binary.BigEndian.AppendUint64(b, n)
}

func cborText(b []byte, s string) []byte {
	b = cborHead(b, 3, uint64(len(s)))
	return append(b, s...)
}
