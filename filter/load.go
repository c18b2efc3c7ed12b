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
	vm  uint64
	ttl time.Duration // rows older than this belong to dead VMs
	buf []byte

	// Per snapshot generation: each slot's endpoint hash.
	gen       uint64
	slotHash  []uint64
	local     []policy.Local
	corrupted bool
}

func endpointHash(addr string) uint64 { return xxhash.Sum64String(addr) }

// change applies d to endpoint's count in this VM's row (d zero just beats
// the heartbeat).
func (t *loadTracker) change(endpoint uint64, d inflight.Counts) {
	now := time.Now().UnixMilli()
	for range casAttempts {
		val, cas, err := proxywasm.GetSharedData(inflightKey)
		if err != nil && !errors.Is(err, types.ErrorStatusNotFound) {
			proxywasm.LogError("kvroute: read in-flight load: " + err.Error())
			return
		}
		tab, err := inflight.Decode(val)
		if err != nil && !t.corrupted {
			t.corrupted = true
			proxywasm.LogError("kvroute: in-flight load table is corrupt; starting it afresh")
		}
		tab.Update(t.vm, now, t.ttl.Milliseconds(), endpoint, d)
		t.buf = tab.Append(t.buf[:0])
		err = proxywasm.SetSharedData(inflightKey, t.buf, cas)
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

// locals returns the gateway's load per slot of the view's endpoint table.
func (t *loadTracker) locals(v *snapshot.View) []policy.Local {
	m := v.Manifest()
	n := m.NumEndpoints()
	if t.gen != m.Generation() || len(t.slotHash) != n {
		t.gen = m.Generation()
		t.slotHash = t.slotHash[:0]
		for i := range n {
			t.slotHash = append(t.slotHash, endpointHash(m.Endpoint(i).Addr()))
		}
	}
	if cap(t.local) < n {
		t.local = make([]policy.Local, n)
	}
	t.local = t.local[:n]
	clear(t.local)
	val, _, err := proxywasm.GetSharedData(inflightKey)
	if err != nil {
		return t.local
	}
	tab, err := inflight.Decode(val)
	if err != nil {
		return t.local
	}
	now, ttl := time.Now().UnixMilli(), t.ttl.Milliseconds()
	for i, h := range t.slotHash {
		c := tab.Sum(now, ttl, h)
		t.local[i] = policy.Local{PrefillTokens: c.PrefillTokens, Requests: c.Requests}
	}
	return t.local
}
