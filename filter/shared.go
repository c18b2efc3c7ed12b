package main

import (
	"errors"

	"github.com/kvroute/kvroute/filter/proxywasm"
	"github.com/kvroute/kvroute/filter/proxywasm/types"
)

// casAttempts bounds a compare-and-swap loop; contention between a few
// worker threads settles in one or two.
const casAttempts = 16

// table is a value the worker VMs share, decoded into and encoded from.
type table interface {
	Decode([]byte) error
	Append([]byte) []byte
}

// casValue keeps one shared-data value that every worker VM of this Envoy
// updates with compare-and-swap: the in-flight load, the recent
// placements.
type casValue struct {
	key  string // shared-data key
	what string // what it holds, for logs
	buf  []byte
	// cas is the CAS token of the value last decoded, while valid: a
	// request reads a table for the policy and then updates it, and the
	// update starts from that read instead of reading again.
	cas       uint32
	valid     bool
	corrupted bool
}

// load decodes the stored value into t; false if shared data failed. A
// corrupt value is logged once and read as empty: forgetting is better
// than never counting again.
func (c *casValue) load(t table) bool {
	// Decoded at once, so not copied out of the host's buffer.
	val, cas, err := proxywasm.BorrowSharedData(c.key)
	if err != nil && !errors.Is(err, types.ErrorStatusNotFound) {
		proxywasm.LogError("kvroute: read " + c.what + ": " + err.Error())
		return false
	}
	if err := t.Decode(val); err != nil && !c.corrupted {
		c.corrupted = true
		proxywasm.LogError("kvroute: the " + c.what + " table is corrupt; starting it afresh")
	}
	// A missing key has cas 0, which would write unconditionally; any other
	// value still creates it, and loses to a VM that created it first.
	c.cas, c.valid = max(cas, 1), true
	return true
}

// update applies edit to t, as decoded from the stored value, and stores
// the result, trying again while another VM wrote first.
func (c *casValue) update(t table, edit func()) {
	for range casAttempts {
		if !c.valid && !c.load(t) {
			return
		}
		// Whatever happens next, t no longer matches a cas this VM knows.
		c.valid = false
		edit()
		c.buf = t.Append(c.buf[:0])
		err := proxywasm.SetSharedData(c.key, c.buf, c.cas)
		if err == nil {
			return
		}
		if !errors.Is(err, types.ErrorStatusCasMismatch) {
			proxywasm.LogError("kvroute: write " + c.what + ": " + err.Error())
			return
		}
	}
	proxywasm.LogWarn("kvroute: an update of the " + c.what + " was lost to contention")
}
