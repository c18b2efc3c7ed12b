package main

import (
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/kvroute/kvroute/filter/internal/inflight"
	"github.com/kvroute/kvroute/filter/internal/placed"
	"github.com/kvroute/kvroute/shared/policy"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// inflightKey holds this Envoy's in-flight load per endpoint, one row per
// worker VM (see package inflight).
const inflightKey = "kvroute/inflight"

// loadTracker adds and releases this VM's share of the gateway's in-flight
// load, and reads everyone's for the policy.
type loadTracker struct {
	vm     uint64
	ttl    time.Duration  // rows older than this belong to dead VMs
	tick   time.Duration  // the sync interval
	table  inflight.Table // decoded and reused
	stored casValue

	// Per snapshot generation: the slot of each endpoint hash.
	gen      uint64
	slotOf   map[uint64]int
	local    []policy.Local
	placed   placements
	sessions sessions
	hist     history
	steps    stepClocks
}

func newLoadTracker(vm uint64, ttl, sessionTTL, tick time.Duration) loadTracker {
	return loadTracker{vm: vm, ttl: ttl, tick: tick, stored: casValue{key: inflightKey, what: "in-flight load"},
		placed:   placements{stored: casValue{key: placedKey, what: "recent placements"}},
		sessions: sessions{ttl: sessionTTL}}
}

func endpointHash(addr string) uint64 { return xxhash.Sum64String(addr) }

// change applies d to endpoint's count in this VM's row (d zero just beats
// the heartbeat).
func (t *loadTracker) change(endpoint uint64, d inflight.Counts) {
	now := time.Now().UnixMilli()
	t.stored.update(&t.table, func() { t.table.Update(t.vm, now, t.ttl.Milliseconds(), endpoint, d) })
}

// sample records what the gateway has in flight at this tick, as the
// heartbeat just read it, and works out for each endpoint of m (nil: no
// snapshot) what it had when cachesync read the engine's load.
func (t *loadTracker) sample(now time.Time, m *snapshot.Manifest, tick time.Duration) {
	t.hist.record(now, &t.table, t.ttl)
	if m != nil {
		t.hist.rebase(m, tick)
	}
}

// locals returns the gateway's load per slot of the view's endpoint table,
// with the leading blocks of hashes that its recent placements are having
// each endpoint prefill, and the whole prompt for the endpoint the request's
// session (0 for none) is pinned to.
func (t *loadTracker) locals(v *snapshot.View, hashes []uint64, session uint64) []policy.Local {
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
	t.steps.fill(t.slotOf, t.local, time.Now().UnixNano())
	if t.placed.read() {
		t.placed.match(hashes, t.addPlaced)
		t.pending(m)
	}
	if session != 0 {
		if ep, ok := t.sessions.lookup(session); ok {
			t.addPlaced(ep, len(hashes))
		}
	}
	for i := range t.local {
		if n := t.hist.atLoadOf(t.gen, i); n >= 0 {
			t.local[i].AtLoad, t.local[i].AtLoadKnown = n, true
		}
	}
	if !t.stored.load(&t.table) {
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

// pending counts, per slot of m, the blocks of the prompts this gateway
// placed that m cannot show yet but the engine's cache will hold. A
// placement's report reaches cachesync within two ticks (the fetcher's
// next, then cachesync's next build): an endpoint whose index shows what
// reports name shows it from then on; one indexed from its KV events alone
// shows it two ticks after its prefill is predicted to end.
func (t *loadTracker) pending(m *snapshot.Manifest) {
	built := m.Created().UnixMilli()
	lag := 2 * t.tick.Milliseconds()
	t.placed.table.Live(time.Now().UnixMilli(), func(e *placed.Entry) {
		i, ok := t.slotOf[e.Endpoint]
		if !ok {
			return
		}
		shown := e.At + lag
		if !m.Endpoint(i).ShowsReports() {
			shown += e.TTFT
		}
		if shown > built {
			t.local[i].Pending += e.Blocks
			if e.New {
				t.local[i].PendingPrefixes++
			}
		}
	})
}

func (t *loadTracker) add(e inflight.Entry) {
	if i, ok := t.slotOf[e.Endpoint]; ok {
		t.local[i].PrefillTokens += e.PrefillTokens
		t.local[i].Requests += e.Requests
	}
}
