package vllmsim

import (
	"encoding/hex"
	"testing"
)

// The expected values were computed with vLLM's sha256_cbor, i.e.
// hashlib.sha256(cbor2.dumps(x, canonical=True)), with cbor2 6.2.1.
func TestHasherMatchesSha256CBOR(t *testing.T) {
	h := newHasher("0")
	if got := hex.EncodeToString(h.none[:]); got != "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e" {
		t.Fatalf("NONE_HASH = %s", got)
	}
	tokens := make([]int, 16)
	for i := range tokens {
		tokens[i] = i + 1
	}
	h1 := h.block(nil, tokens, nil)
	if got := hex.EncodeToString(h1[:]); got != "202da172482d928bbc42ab25b0151e2b895f13f41002e27b2ceabcfae6d332ea" {
		t.Fatalf("first block = %s", got)
	}
	if h1.uint64() != 3236607068019569386 {
		t.Fatalf("int form = %d", h1.uint64())
	}
	// Every CBOR integer width, a parent, and extra keys (LoRA name, salt).
	odd := []int{100000, 255, 256, 65535, 65536, 23, 24, 0, 100000, 255, 256, 65535, 65536, 23, 24, 0}
	h2 := h.block(&h1, odd, extras{"sql", "salt"})
	wantCBOR := "835820202da172482d928bbc42ab25b0151e2b895f13f41002e27b2ceabcfae6d332ea901a000186a018ff19010019ffff1a00010000171818001a000186a018ff19010019ffff1a0001000017181800826373716c6473616c74"
	if got := hex.EncodeToString(h.buf); got != wantCBOR {
		t.Fatalf("CBOR input\n got %s\nwant %s", got, wantCBOR)
	}
	if got := hex.EncodeToString(h2[:]); got != "3a8593879b72e6fa6625f524152cb5b43d9ffeae56ee802dc09315f4f86b803c" {
		t.Fatalf("chained block = %s", got)
	}
}

func BenchmarkHashBlock(b *testing.B) {
	h := newHasher("0")
	tokens := make([]int, 16)
	for i := range tokens {
		tokens[i] = 50000 + i
	}
	var parent blockHash
	b.SetBytes(16)
	for b.Loop() {
		parent = h.block(&parent, tokens, nil)
	}
}
