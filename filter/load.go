package main

import (
	"errors"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/kvroute/kvroute/filter/internal/inflight"
	"github.com/kvroute/kvroute/filter/proxywasm"
	"github.com/kvroute/kvroute/filter/proxywasm/types"
	"github.com/kvroute/kvroute/shared/policy"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// inflightKey holds this Envoy's in-flight load per endpoint, one row per
// worker VM (see package inflight).
const inflightKey = "kvroute/inflight"

// casAttempts bounds a compare-and-swap loop; contention between a few
// worker threads settles in one or two.
const casAttempts = 16

// loadTracker adds and releases this VM's share of the gateway's in-flight
// load, and reads everyone's for the policy.
type loadTracker struct {
	vm    uint64
	ttl   time.Duration // rows older than this belong to dead VMs
	buf   []byte
	table inflight.Table // decoded and reused
	// cas is the CAS token of the value table was decoded from, while valid:
	// a routed request reads the table for the policy and then adds itself,
	// and the add starts from that read instead of reading again.
	cas   uint32
	valid bool

	// Per snapshot generation: the slot of each endpoint hash.
	gen       uint64
	slotOf    map[uint64]int
	local     []policy.Local
	corrupted bool
	placed    placements
}

func endpointHash(addr string) uint64 { return xxhash.Sum64String(addr) }

// change applies d to endpoint's count in this VM's row (d zero just beats
// the heartbeat).
func (t *loadTracker) change(endpoint uint64, d inflight.Counts) {
	now := time.Now().UnixMilli()
	for range casAttempts {
		if !t.valid && !t.read() {
			return
		}
		// Whatever happens next, the decoded table no longer matches a cas
		// this VM knows.
		t.valid = false
		t.table.Update(t.vm, now, t.ttl.Milliseconds(), endpoint, d)
		t.buf = t.table.Append(t.buf[:0])
		err := proxywasm.SetSharedData(inflightKey, t.buf, t.cas)
		if err == nil {
			return
		}
		if !errors.Is(err, types.ErrorStatusCasMismatch) {
			proxywasm.LogError("kvroute: write in-flight load: " + err.Error())
			return
		}
	}
	proxywasm.LogWarn("kvroute: in-flight load update lost to contention")
}

// read decodes the stored table into t.table and remembers its cas.
func (t *loadTracker) read() bool {
	val, cas, err := proxywasm.GetSharedData(inflightKey)
	if err != nil && !errors.Is(err, types.ErrorStatusNotFound) {
		proxywasm.LogError("kvroute: read in-flight load: " + err.Error())
		return false
	}
	if err := t.table.Decode(val); err != nil && !t.corrupted {
		t.corrupted = true
		proxywasm.LogError("kvroute: in-flight load table is corrupt; starting it afresh")
	}
	// A missing key has cas 0, which would write unconditionally; any other
	// value still creates it, and loses to a VM that created it first.
	t.cas, t.valid = max(cas, 1), true
	return true
}

// locals returns the gateway's load per slot of the view's endpoint table,
// with the leading blocks of hashes that its recent placements are having
// each endpoint prefill.
func (t *loadTracker) locals(v *snapshot.View, hashes []uint64) []policy.Local {
	m := v.Manifest()
	n := m.NumEndpoints()
	if t.slotOf == nil || t.gen != m.Generation() {
		t.gen = m.Generation()
		t.slotOf = make(map[uint64]int, n)
		for i := range n {
			if e := m.Endpoint(i); !e.Vacant() {
				t.slotOf[endpointHash(e.Addr())] = i
			}
		}
	}
	if cap(t.local) < n {
		t.local = make([]policy.Local, n)
	}
	t.local = t.local[:n]
	clear(t.local)
	t.placed.match(hashes, t.addPlaced)
	if !t.read() {
		return t.local
	}
	t.table.Each(time.Now().UnixMilli(), t.ttl.Milliseconds(), t.add)
	return t.local
}

func (t *loadTracker) addPlaced(endpoint uint64, blocks int) {
	if i, ok := t.slotOf[endpoint]; ok {
		t.local[i].Blocks = max(t.local[i].Blocks, blocks)
	}
}

func (t *loadTracker) add(e inflight.Entry) {
	if i, ok := t.slotOf[e.Endpoint]; ok {
		t.local[i].PrefillTokens += e.PrefillTokens
		t.local[i].Requests += e.Requests
	}
}
