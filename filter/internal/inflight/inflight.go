// Package inflight keeps a gateway's own in-flight load per endpoint in one
// Envoy shared-data value that every worker VM updates with compare-and-swap.
//
// The value holds one row per worker VM: the VM's random id, a heartbeat
// and its counts per endpoint (keyed by a hash of the endpoint's address, so
// rows survive snapshot generations that renumber endpoint slots). A VM
// writes only its own row; readers sum every row whose heartbeat is recent.
// A VM that dies (Envoy replaces a failed VM) stops beating, and its counts
// stop counting once its row goes stale, instead of leaking forever.
//
// Encoding, little endian:
//
//	"KVIF" u16 version u16 rows
//	per row: u64 vm id, i64 heartbeat (unix ms), u32 entries
//	         per entry: u64 endpoint hash, i64 prefill tokens, i64 requests
//
// A Table is decoded into and reused, so the request path does not allocate
// once its slices have grown.
package inflight

import (
	"encoding/binary"
	"errors"
)

const (
	magic     = "KVIF"
	version   = 1
	headSize  = 8
	rowHead   = 20
	entrySize = 24
	// MaxEntries bounds one row; endpoints beyond it are not counted.
	MaxEntries = 4096
	maxRows    = 1<<16 - 1
)

var le = binary.LittleEndian

// ErrCorrupt reports a value that is not an in-flight table. Callers treat
// it as empty: losing the counts is better than never counting again.
var ErrCorrupt = errors.New("inflight: corrupt table")

// Counts is one endpoint's load.
type Counts struct {
	PrefillTokens int64
	Requests      int64
}

// Entry is one endpoint's load in one VM's row.
type Entry struct {
	Endpoint uint64 // hash of the endpoint's address
	Counts
}

// Row is one VM's counts.
type Row struct {
	VM        uint64
	Heartbeat int64 // unix milliseconds
	Entries   []Entry
}

// Table is a decoded shared value.
type Table struct {
	Rows []Row
}

// Decode parses a stored value into t, reusing its memory; an empty value is
// an empty table. On error t is empty.
func (t *Table) Decode(b []byte) error {
	t.Rows = t.Rows[:0]
	if len(b) == 0 {
		return nil
	}
	if len(b) < headSize || string(b[:4]) != magic || le.Uint16(b[4:]) != version {
		return ErrCorrupt
	}
	n := int(le.Uint16(b[6:]))
	b = b[headSize:]
	for range n {
		if len(b) < rowHead {
			t.Rows = t.Rows[:0]
			return ErrCorrupt
		}
		m := int(le.Uint32(b[16:]))
		if m > MaxEntries || len(b)-rowHead < m*entrySize {
			t.Rows = t.Rows[:0]
			return ErrCorrupt
		}
		r := t.next()
		r.VM, r.Heartbeat = le.Uint64(b), int64(le.Uint64(b[8:]))
		b = b[rowHead:]
		for j := range m {
			e := b[j*entrySize:]
			r.Entries = append(r.Entries, Entry{le.Uint64(e), Counts{int64(le.Uint64(e[8:])), int64(le.Uint64(e[16:]))}})
		}
		b = b[m*entrySize:]
	}
	if len(b) != 0 {
		t.Rows = t.Rows[:0]
		return ErrCorrupt
	}
	return nil
}

// next appends a row, reusing the entries slice a previous decode left.
func (t *Table) next() *Row {
	if len(t.Rows) < cap(t.Rows) {
		t.Rows = t.Rows[:len(t.Rows)+1]
	} else {
		t.Rows = append(t.Rows, Row{})
	}
	r := &t.Rows[len(t.Rows)-1]
	r.Entries = r.Entries[:0]
	return r
}

// Append encodes t onto dst. Zero counts are left out.
func (t *Table) Append(dst []byte) []byte {
	dst = append(dst, magic...)
	dst = le.AppendUint16(dst, version)
	dst = le.AppendUint16(dst, uint16(len(t.Rows)))
	for _, r := range t.Rows {
		dst = le.AppendUint64(dst, r.VM)
		dst = le.AppendUint64(dst, uint64(r.Heartbeat))
		at := len(dst)
		dst = le.AppendUint32(dst, 0)
		n := 0
		for _, e := range r.Entries {
			if (e.Counts == Counts{}) || n == MaxEntries {
				continue
			}
			dst = le.AppendUint64(dst, e.Endpoint)
			dst = le.AppendUint64(dst, uint64(e.PrefillTokens))
			dst = le.AppendUint64(dst, uint64(e.Requests))
			n++
		}
		le.PutUint32(dst[at:], uint32(n))
	}
	return dst
}

// Update applies a change to vm's row, beats its heartbeat, and drops rows
// whose heartbeat is older than now-ttl. Counts never go below zero: a
// release can arrive after a restart lost the matching add.
func (t *Table) Update(vm uint64, now, ttl int64, endpoint uint64, d Counts) {
	kept := t.Rows[:0]
	own := -1
	for _, r := range t.Rows {
		if r.VM != vm && r.Heartbeat < now-ttl {
			continue
		}
		if r.VM == vm {
			own = len(kept)
		}
		kept = append(kept, r)
	}
	t.Rows = kept
	if own < 0 {
		if len(t.Rows) == maxRows {
			return
		}
		t.next().VM = vm
		own = len(t.Rows) - 1
	}
	r := &t.Rows[own]
	r.Heartbeat = now
	if d == (Counts{}) {
		return
	}
	for i := range r.Entries {
		if e := &r.Entries[i]; e.Endpoint == endpoint {
			e.PrefillTokens = max(0, e.PrefillTokens+d.PrefillTokens)
			e.Requests = max(0, e.Requests+d.Requests)
			return
		}
	}
	r.Entries = append(r.Entries, Entry{endpoint, Counts{max(0, d.PrefillTokens), max(0, d.Requests)}})
}

// Each calls f with every entry of every row whose heartbeat is within ttl
// of now.
func (t *Table) Each(now, ttl int64, f func(Entry)) {
	for _, r := range t.Rows {
		if r.Heartbeat < now-ttl {
			continue
		}
		for _, e := range r.Entries {
			f(e)
		}
	}
}

// Sum adds every live row's counts for endpoint.
func (t *Table) Sum(now, ttl int64, endpoint uint64) Counts {
	var s Counts
	t.Each(now, ttl, func(e Entry) {
		if e.Endpoint == endpoint {
			s.PrefillTokens += e.PrefillTokens
			s.Requests += e.Requests
		}
	})
	return s
}
