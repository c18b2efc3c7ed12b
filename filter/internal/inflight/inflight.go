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

// Row is one VM's counts, keyed by endpoint hash.
type Row struct {
	VM        uint64
	Heartbeat int64 // unix milliseconds
	Entries   map[uint64]Counts
}

// Table is a decoded shared value.
type Table struct {
	Rows []Row
}

// Decode parses a stored value; an empty value is an empty table.
func Decode(b []byte) (Table, error) {
	var t Table
	if len(b) == 0 {
		return t, nil
	}
	if len(b) < headSize || string(b[:4]) != magic || le.Uint16(b[4:]) != version {
		return t, ErrCorrupt
	}
	n := int(le.Uint16(b[6:]))
	b = b[headSize:]
	for i := 0; i < n; i++ {
		if len(b) < rowHead {
			return Table{}, ErrCorrupt
		}
		r := Row{VM: le.Uint64(b), Heartbeat: int64(le.Uint64(b[8:]))}
		m := int(le.Uint32(b[16:]))
		b = b[rowHead:]
		if m > MaxEntries || len(b) < m*entrySize {
			return Table{}, ErrCorrupt
		}
		r.Entries = make(map[uint64]Counts, m)
		for j := 0; j < m; j++ {
			e := b[j*entrySize:]
			r.Entries[le.Uint64(e)] = Counts{int64(le.Uint64(e[8:])), int64(le.Uint64(e[16:]))}
		}
		b = b[m*entrySize:]
		t.Rows = append(t.Rows, r)
	}
	if len(b) != 0 {
		return Table{}, ErrCorrupt
	}
	return t, nil
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
		for h, c := range r.Entries {
			if (c == Counts{}) || n == MaxEntries {
				continue
			}
			dst = le.AppendUint64(dst, h)
			dst = le.AppendUint64(dst, uint64(c.PrefillTokens))
			dst = le.AppendUint64(dst, uint64(c.Requests))
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
	var own *Row
	for i := range t.Rows {
		r := t.Rows[i]
		if r.VM != vm && r.Heartbeat < now-ttl {
			continue
		}
		kept = append(kept, r)
	}
	t.Rows = kept
	for i := range t.Rows {
		if t.Rows[i].VM == vm {
			own = &t.Rows[i]
		}
	}
	if own == nil && len(t.Rows) < 1<<16-1 {
		t.Rows = append(t.Rows, Row{VM: vm, Entries: map[uint64]Counts{}})
		own = &t.Rows[len(t.Rows)-1]
	}
	if own == nil {
		return
	}
	own.Heartbeat = now
	if d == (Counts{}) {
		return
	}
	c := own.Entries[endpoint]
	c.PrefillTokens = max(0, c.PrefillTokens+d.PrefillTokens)
	c.Requests = max(0, c.Requests+d.Requests)
	own.Entries[endpoint] = c
}

// Sum adds every live row's counts for endpoint.
func (t *Table) Sum(now, ttl int64, endpoint uint64) Counts {
	var s Counts
	for _, r := range t.Rows {
		if r.Heartbeat < now-ttl {
			continue
		}
		c := r.Entries[endpoint]
		s.PrefillTokens += c.PrefillTokens
		s.Requests += c.Requests
	}
	return s
}
