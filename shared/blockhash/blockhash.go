// Package blockhash hashes text into chained fixed-size blocks.
//
// Block i's hash covers the hash of block i-1 and the bytes of block i, so one
// hash names the whole prefix up to the end of its block. The filter hashes
// request text with it and cachesync hashes text rebuilt from engine token
// blocks with it; both must agree bit for bit.
package blockhash

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// DefaultBlockSize is the block size in bytes: about 16 tokens of English
// text, the default block size of vLLM.
const DefaultBlockSize = 64

// DefaultMaxBlocks caps a chain at 8192 blocks of 64 bytes (512 KiB), about
// 128k tokens at 4 bytes per token.
const DefaultMaxBlocks = 8192

// Config sets the block size and the cap on blocks hashed per prompt.
type Config struct {
	BlockSize int // bytes per block; <= 0 means DefaultBlockSize
	MaxBlocks int // blocks hashed at most; <= 0 means DefaultMaxBlocks
}

func (c Config) blockSize() int {
	if c.BlockSize <= 0 {
		return DefaultBlockSize
	}
	return c.BlockSize
}

func (c Config) maxBlocks() int {
	if c.MaxBlocks <= 0 {
		return DefaultMaxBlocks
	}
	return c.MaxBlocks
}

// Seed returns the hash that starts the chain for a model and an optional
// LoRA adapter, so that different models never share entries.
func Seed(model, adapter string) uint64 {
	d := xxhash.New()
	d.WriteString(model)
	d.Write([]byte{0})
	d.WriteString(adapter)
	return d.Sum64()
}

// Next returns the hash of block chained after prev.
func Next(prev uint64, block []byte) uint64 {
	var p [8]byte
	binary.LittleEndian.PutUint64(p[:], prev)
	d := xxhash.New()
	d.Write(p[:])
	d.Write(block)
	return d.Sum64()
}

// Append appends to dst the chained hash of every full block of text, at most
// cfg's cap, starting from seed. A trailing partial block is not hashed:
// engines cache only full blocks.
func Append(dst []uint64, seed uint64, text []byte, cfg Config) []uint64 {
	bs, max := cfg.blockSize(), cfg.maxBlocks()
	h := seed
	for n := 0; n < max && len(text) >= bs; n++ {
		h = Next(h, text[:bs])
		dst = append(dst, h)
		text = text[bs:]
	}
	return dst
}
