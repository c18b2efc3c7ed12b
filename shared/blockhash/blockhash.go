// Package blockhash hashes text into chained fixed-size blocks.
//
// Block i's hash covers the hash of block i-1 and the bytes of block i, so one
// hash names the whole prefix up to the end of its block. The filter hashes
// request text with it and cachesync hashes text rebuilt from engine token
// blocks with it; both must agree bit for bit, so the definition is exact:
//
//	Seed(model, adapter) = XXH64(model || 0x00 || adapter)
//	Next(prev, block)    = XXH64(LE64(prev) || block)
//
// where XXH64 is 64-bit xxHash with seed 0 (github.com/cespare/xxhash/v2's
// Sum64), LE64 is the 8-byte little-endian encoding and || is concatenation.
// Append(dst, seed, text, cfg) appends Next applied to every full block of
// text in turn, starting from prev = seed.
package blockhash

import (
	"encoding/binary"
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// DefaultBlockSize is the block size in bytes: about 16 tokens of English
// text, the default block size of vLLM.
const DefaultBlockSize = 64

// DefaultMaxBytes is how much text a chain covers by default: 128k tokens at
// about 4 bytes per token.
const DefaultMaxBytes = 512 << 10

// DefaultMaxBlocks is the cap at DefaultBlockSize: 8192 blocks.
const DefaultMaxBlocks = DefaultMaxBytes / DefaultBlockSize

// Config sets the block size and the cap on blocks hashed per prompt.
type Config struct {
	BlockSize int // bytes per block; <= 0 means DefaultBlockSize
	MaxBlocks int // blocks hashed at most; <= 0 means enough blocks for DefaultMaxBytes
}

// Size returns the block size in effect.
func (c Config) Size() int {
	if c.BlockSize <= 0 {
		return DefaultBlockSize
	}
	return c.BlockSize
}

// Max returns the cap on blocks in effect.
func (c Config) Max() int {
	if c.MaxBlocks > 0 {
		return c.MaxBlocks
	}
	return (DefaultMaxBytes + c.Size() - 1) / c.Size()
}

// Seed returns the hash that starts the chain for a model and an optional
// LoRA adapter, so that different models never share entries.
func Seed(model, adapter string) uint64 {
	var d xxhash.Digest
	d.Reset()
	d.WriteString(model)
	d.Write([]byte{0})
	d.WriteString(adapter)
	return d.Sum64()
}

// Salted returns the chain's seed for requests carrying vLLM's cache_salt:
// seed itself without one. vLLM mixes the salt into the first block's hash,
// so a salted prompt's blocks match only prompts with the same salt; the
// chain does the same from its seed, and one tenant's blocks never match
// another's, in the engine or in the index.
func Salted(seed uint64, salt string) uint64 {
	if salt == "" {
		return seed
	}
	var d xxhash.Digest
	d.Reset()
	var b [9]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	b[8] = 's'
	d.Write(b[:])
	d.WriteString(salt)
	return d.Sum64()
}

// Next returns the hash of block chained after prev.
func Next(prev uint64, block []byte) uint64 {
	return sum(prev, block)
}

// Append appends to dst the chained hash of every full block of text, at most
// cfg.Max() of them, starting from seed. A trailing partial block is not
// hashed: engines cache only full blocks.
func Append(dst []uint64, seed uint64, text []byte, cfg Config) []uint64 {
	bs, n := cfg.Size(), len(text)/cfg.Size()
	if m := cfg.Max(); n > m {
		n = m
	}
	h := seed
	for i := 0; i < n; i++ {
		h = sum(h, text[i*bs:(i+1)*bs])
		dst = append(dst, h)
	}
	return dst
}

// XXH64's constants.
const (
	prime1 uint64 = 11400714785074694791
	prime2 uint64 = 14029467366897019727
	prime3 uint64 = 1609587929392839161
	prime4 uint64 = 9650029242287828579
	prime5 uint64 = 2870177450012600261
)

// The initial values of XXH64's first and fourth lanes for seed 0: prime1 +
// prime2 and -prime1, which wrap and so cannot be constant expressions.
var lane1, lane4 = func() (uint64, uint64) {
	p1, p2 := prime1, prime2
	return p1 + p2, -p1
}()

// sum returns XXH64(LE64(prev) || b), equal to xxhash.Sum64 of that
// concatenation, without building it: prev is the first 8-byte lane. Copying
// each block behind prev and calling xxhash.Sum64 runs at half this speed
// under wazero, where per-call setup dominates 64-byte blocks.
func sum(prev uint64, b []byte) uint64 {
	n := uint64(len(b)) + 8
	var h uint64
	if len(b) >= 24 {
		v1 := round(lane1, prev)
		v2 := round(prime2, u64(b[0:8:len(b)]))
		v3 := round(0, u64(b[8:16:len(b)]))
		v4 := round(lane4, u64(b[16:24:len(b)]))
		b = b[24:]
		for len(b) >= 32 {
			v1 = round(v1, u64(b[0:8:len(b)]))
			v2 = round(v2, u64(b[8:16:len(b)]))
			v3 = round(v3, u64(b[16:24:len(b)]))
			v4 = round(v4, u64(b[24:32:len(b)]))
			b = b[32:]
		}
		h = bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
		h = mergeRound(h, v1)
		h = mergeRound(h, v2)
		h = mergeRound(h, v3)
		h = mergeRound(h, v4)
		h += n
	} else {
		h = prime5 + n
		h ^= round(0, prev)
		h = bits.RotateLeft64(h, 27)*prime1 + prime4
	}
	for ; len(b) >= 8; b = b[8:] {
		h ^= round(0, u64(b[:8:len(b)]))
		h = bits.RotateLeft64(h, 27)*prime1 + prime4
	}
	if len(b) >= 4 {
		h ^= uint64(binary.LittleEndian.Uint32(b[:4:len(b)])) * prime1
		h = bits.RotateLeft64(h, 23)*prime2 + prime3
		b = b[4:]
	}
	for _, c := range b {
		h ^= uint64(c) * prime5
		h = bits.RotateLeft64(h, 11) * prime1
	}
	h ^= h >> 33
	h *= prime2
	h ^= h >> 29
	h *= prime3
	h ^= h >> 32
	return h
}

func u64(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }

func round(acc, input uint64) uint64 {
	acc += input * prime2
	acc = bits.RotateLeft64(acc, 31)
	return acc * prime1
}

func mergeRound(acc, val uint64) uint64 {
	acc ^= round(0, val)
	return acc*prime1 + prime4
}
