// Package placed remembers the prompts a gateway recently sent to an
// endpoint to prefill, until cachesync's index can be expected to show
// them.
//
// Between a routing decision and the snapshot that shows the engine holding
// the prompt lie the prefill, the engine's KV event, cachesync's next
// build and the filter's next fetch: a second or more. A request sharing
// the prefix that arrives meanwhile would see no endpoint holding it, be
// placed as a new prefix, and split the prefix over two caches. So every
// worker VM records what it sent where in one Envoy shared-data value, and
// reads it for the policy as a lower bound of what each endpoint will hold.
//
// Each entry also says when the prompt was placed, when its first token is
// predicted, and how many blocks it brings the endpoint, so that the
// policy can count a placement the snapshot cannot show yet in how full the
// endpoint's cache is.
//
// A prompt is recorded by samples of its chained block hashes, one every
// Stride blocks: two prompts whose samples agree up to depth d share their
// first d blocks (a chained hash names its whole prefix), so a match is
// exact to within a stride and costs one comparison per sample.
//
// Encoding, little endian:
//
//	"KVPL" u16 version u16 entries
//	per entry: u64 endpoint hash, i64 expiry (unix ms), i64 placed at
//	           (unix ms), u32 predicted TTFT (ms), u32 blocks, u8 flags
//	           (bit 0: new to the endpoint), u16 samples,
//	           samples x u64 block hash
//
// A Table is decoded into and reused, so the request path does not allocate
// once its slices have grown.
package placed

import (
	"encoding/binary"
	"errors"
)

const (
	magic     = "KVPL"
	version   = 3
	headSize  = 8
	entryHead = 35
	// Stride is the distance, in blocks, between a prompt's samples.
	Stride = 16
	// MaxSamples bounds one entry: prompts are matched up to
	// Stride x MaxSamples blocks (32 KiB of text at 64-byte blocks, about
	// 8,000 tokens), a lower bound of what longer ones share. Every
	// request reads the whole table, so its size is the request path's
	// cost: at 128 samples and 64 entries, 512 KiB prompts cost 0.6 ms
	// more in Envoy.
	MaxSamples = 32
	// MaxEntries bounds the table; the oldest entry makes way. Entries
	// live a few seconds, and only prompts mostly new to their endpoint
	// are recorded.
	MaxEntries = 32
)

var le = binary.LittleEndian

// ErrCorrupt reports a value that is not a placement table. Callers treat
// it as empty: forgetting recent placements only costs the affinity of the
// requests that follow them closely.
var ErrCorrupt = errors.New("placed: corrupt table")

// Entry is one placement.
type Entry struct {
	Endpoint uint64 // hash of the endpoint's address
	Expires  int64  // unix milliseconds
	At       int64  // when it was placed, unix milliseconds
	TTFT     int64  // its predicted time to first token, milliseconds
	Blocks   int    // the prompt's blocks the endpoint did not hold
	// New says the endpoint held none of the prompt: it is a prefix new
	// there, which cachesync counts in the endpoint's Prefixes once its
	// report is in.
	New     bool
	Samples []uint64
}

// Table is a decoded placement table, oldest entry first.
type Table struct {
	entries []Entry
	spare   [][]uint64 // sample slices of dropped entries, for reuse
}

// Decode replaces t's contents with the encoded table b; an empty b is an
// empty table. On error t is left empty.
func (t *Table) Decode(b []byte) error {
	t.reset()
	if len(b) == 0 {
		return nil
	}
	if len(b) < headSize || string(b[:4]) != magic || le.Uint16(b[4:]) != version {
		return ErrCorrupt
	}
	n := int(le.Uint16(b[6:]))
	if n > MaxEntries {
		return ErrCorrupt
	}
	b = b[headSize:]
	for range n {
		if len(b) < entryHead {
			t.reset()
			return ErrCorrupt
		}
		k := int(le.Uint16(b[33:]))
		if b[32] > 1 || k > MaxSamples || len(b) < entryHead+8*k {
			t.reset()
			return ErrCorrupt
		}
		e := t.grow()
		e.Endpoint, e.Expires, e.At = le.Uint64(b), int64(le.Uint64(b[8:])), int64(le.Uint64(b[16:]))
		e.TTFT, e.Blocks, e.New = int64(le.Uint32(b[24:])), int(le.Uint32(b[28:])), b[32] == 1
		for i := range k {
			e.Samples = append(e.Samples, le.Uint64(b[entryHead+8*i:]))
		}
		b = b[entryHead+8*k:]
	}
	if len(b) != 0 {
		t.reset()
		return ErrCorrupt
	}
	return nil
}

// Append appends t's encoding to dst.
func (t *Table) Append(dst []byte) []byte {
	dst = append(dst, magic...)
	dst = le.AppendUint16(dst, version)
	dst = le.AppendUint16(dst, uint16(len(t.entries)))
	for _, e := range t.entries {
		dst = le.AppendUint64(dst, e.Endpoint)
		dst = le.AppendUint64(dst, uint64(e.Expires))
		dst = le.AppendUint64(dst, uint64(e.At))
		dst = le.AppendUint32(dst, uint32(e.TTFT))
		dst = le.AppendUint32(dst, uint32(e.Blocks))
		dst = append(dst, boolByte(e.New))
		dst = le.AppendUint16(dst, uint16(len(e.Samples)))
		for _, s := range e.Samples {
			dst = le.AppendUint64(dst, s)
		}
	}
	return dst
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// Add records that the prompt of chained block hashes went to endpoint at
// now, bringing it blocks it did not hold (all of them: isNew), with its
// first token predicted ttft milliseconds later, until expires; it drops
// the entries expired at now, and the oldest if the table is full. A prompt
// shorter than a stride is not recorded: it has nothing to match.
func (t *Table) Add(endpoint uint64, hashes []uint64, blocks int, isNew bool, ttft, now, expires int64) {
	kept := t.entries[:0]
	for _, e := range t.entries {
		if e.Expires > now {
			kept = append(kept, e)
		} else {
			t.spare = append(t.spare, e.Samples[:0])
		}
	}
	clear(t.entries[len(kept):])
	t.entries = kept
	k := min(len(hashes)/Stride, MaxSamples)
	if k == 0 {
		return
	}
	if len(t.entries) == MaxEntries {
		t.spare = append(t.spare, t.entries[0].Samples[:0])
		copy(t.entries, t.entries[1:])
		t.entries[len(t.entries)-1] = Entry{}
		t.entries = t.entries[:len(t.entries)-1]
	}
	e := t.grow()
	e.Endpoint, e.Expires, e.At = endpoint, expires, now
	e.TTFT, e.Blocks, e.New = min(max(ttft, 0), 1<<32-1), min(max(blocks, 0), 1<<31-1), isNew
	for i := range k {
		e.Samples = append(e.Samples, hashes[(i+1)*Stride-1])
	}
}

// Match calls fn for every entry live at now that shares at least a stride
// of leading blocks with the prompt of chained block hashes, with its
// endpoint and the blocks shared (a multiple of Stride).
func (t *Table) Match(hashes []uint64, now int64, fn func(endpoint uint64, blocks int)) {
	for _, e := range t.entries {
		if e.Expires <= now {
			continue
		}
		k := 0
		for k < len(e.Samples) && (k+1)*Stride <= len(hashes) && hashes[(k+1)*Stride-1] == e.Samples[k] {
			k++
		}
		if k > 0 {
			fn(e.Endpoint, k*Stride)
		}
	}
}

// Live calls fn with every entry live at now.
func (t *Table) Live(now int64, fn func(e *Entry)) {
	for i := range t.entries {
		if e := &t.entries[i]; e.Expires > now {
			fn(e)
		}
	}
}

// Len returns the entries held, expired ones included.
func (t *Table) Len() int { return len(t.entries) }

func (t *Table) reset() {
	for _, e := range t.entries {
		t.spare = append(t.spare, e.Samples[:0])
	}
	clear(t.entries)
	t.entries = t.entries[:0]
}

// grow appends an empty entry, reusing a dropped entry's samples.
func (t *Table) grow() *Entry {
	var s []uint64
	if n := len(t.spare); n > 0 {
		s, t.spare = t.spare[n-1], t.spare[:n-1]
	}
	t.entries = append(t.entries, Entry{Samples: s})
	return &t.entries[len(t.entries)-1]
}
