package main

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/filter/internal/inflight"
	"github.com/kvroute/kvroute/shared/policy"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// TestHistoryAtLoad: what the gateway had in flight at each engine's
// scrape, read back from its tick samples.
func TestHistoryAtLoad(t *testing.T) {
	const tick = 100 * time.Millisecond
	t0 := time.UnixMilli(1_790_000_000_000)
	a, b := "10.0.0.1:8000", "10.0.0.2:8000"
	// Two VMs' rows: A's requests rise and fall, B has one throughout.
	var tab inflight.Table
	var h history
	counts := []int64{0, 1, 3, 2, 0, 0, 0}
	for i, n := range counts {
		now := t0.Add(time.Duration(i) * tick)
		tab = inflight.Table{}
		tab.Update(1, now.UnixMilli(), 10_000, endpointHash(a), inflight.Counts{Requests: n})
		tab.Update(2, now.UnixMilli(), 10_000, endpointHash(b), inflight.Counts{Requests: 1})
		tab.Update(2, now.UnixMilli(), 10_000, endpointHash(a), inflight.Counts{Requests: n % 2})
		h.record(now, &tab, 10*time.Second)
	}
	build := t0.Add(6 * tick)
	bl, err := snapshot.NewBuilder(snapshot.BuilderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range []snapshot.EndpointInfo{
		// A scraped between the ticks at 200 and 300 ms: 3+1 and 2+0 in
		// flight around it, so 4 at most.
		{Addr: a, Health: snapshot.HealthHealthy, LoadAt: t0.Add(250 * time.Millisecond)},
		{Addr: b, Health: snapshot.HealthHealthy, LoadAt: t0.Add(600 * time.Millisecond)},
		// Scraped before the history begins, and not known.
		{Addr: "10.0.0.3:8000", Health: snapshot.HealthHealthy, LoadAt: t0.Add(-time.Second)},
		{Addr: "10.0.0.4:8000", Health: snapshot.HealthHealthy},
	} {
		if _, err := bl.SetEndpoint(info); err != nil {
			t.Fatal(err)
		}
	}
	bu, err := snapshot.ParseBundle(bl.Build(build).AppendBundle(nil, 0))
	if err != nil {
		t.Fatal(err)
	}
	m := bu.Manifest()
	h.rebase(m, tick)
	for slot, want := range []int64{4, 1, -1, -1} {
		if got := h.atLoadOf(m.Generation(), slot); got != want {
			t.Errorf("slot %d: %d in flight at its scrape, want %d", slot, got, want)
		}
	}
	if got := h.atLoadOf(m.Generation()+1, 0); got != -1 {
		t.Errorf("another generation's slot: %d, want -1", got)
	}
}

// TestPendingPlacements: a placement counts in its endpoint's fill until
// the snapshot can show it: two ticks after its report where reports show
// at once, two ticks after its predicted first token where only KV events
// do.
func TestPendingPlacements(t *testing.T) {
	const tick = 100 * time.Millisecond
	built := time.UnixMilli(1_790_000_000_000)
	reports, events := "10.0.0.1:8000", "10.0.0.2:8000"
	bl, err := snapshot.NewBuilder(snapshot.BuilderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range []snapshot.EndpointInfo{
		{Addr: reports, Health: snapshot.HealthHealthy, ShowsReports: true},
		{Addr: events, Health: snapshot.HealthHealthy},
	} {
		if _, err := bl.SetEndpoint(info); err != nil {
			t.Fatal(err)
		}
	}
	bu, err := snapshot.ParseBundle(bl.Build(built).AppendBundle(nil, 0))
	if err != nil {
		t.Fatal(err)
	}
	m := bu.Manifest()
	tr := newLoadTracker(1, time.Minute, time.Minute, tick)
	tr.slotOf = map[uint64]int{endpointHash(reports): 0, endpointHash(events): 1}
	tr.local = make([]policy.Local, 2)
	ms := built.UnixMilli()
	far := time.Now().Add(time.Hour).UnixMilli()
	h := make([]uint64, 32)
	for i := range h {
		h[i] = uint64(i + 1)
	}
	for _, p := range []struct {
		endpoint     string
		blocks       int
		isNew        bool
		ttft, placed int64 // ms; placed relative to the build
	}{
		{reports, 1, true, 0, -300},      // reported, and built in
		{reports, 10, false, 0, -100},    // reported after the build's cut
		{reports, 20, true, 0, -50},      // likewise, and new there
		{events, 100, true, 1500, -1000}, // still prefilling at the build
		{events, 1000, true, 500, -3000}, // prefilled and evented long before
	} {
		tr.placed.table.Add(endpointHash(p.endpoint), h, p.blocks, p.isNew, p.ttft, ms+p.placed, far)
	}
	tr.pending(m)
	if got := []int{tr.local[0].Pending, tr.local[1].Pending}; got[0] != 30 || got[1] != 100 {
		t.Errorf("pending blocks %v, want [30 100]", got)
	}
	if got := []int{tr.local[0].PendingPrefixes, tr.local[1].PendingPrefixes}; got[0] != 1 || got[1] != 1 {
		t.Errorf("pending prefixes %v, want [1 1]", got)
	}
}
