package main

import (
	"testing"

	"github.com/kvroute/kvroute/shared/policy"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// TestRouteHashesOnOnlyWhileHeld: a long prompt's head is hashed first
// (what reports and recent placements use), and the rest only while some
// endpoint holds every block hashed so far; the match and the price cover
// the whole prompt either way.
func TestRouteHashesOnOnlyWhileHeld(t *testing.T) {
	cfg := chatMLConfig(t, "10.0.0.1:8000", "10.0.0.2:8000")
	body := benchBody(400 << 10)
	_, all := chain(t, cfg, body)
	ahead := cfg.hashAhead()
	if len(all) <= 2*ahead {
		t.Fatalf("a %d-block prompt is too short for this test (ahead %d)", len(all), ahead)
	}
	locals := func(*snapshot.View, []uint64, uint64) []policy.Local { return nil }
	tests := []struct {
		name         string
		held         int // leading blocks endpoint 0 holds
		hashed, want int // blocks hashed, and matched at endpoint 0
	}{
		{"head held", 100, ahead, 100},
		{"all the hashed head held", ahead, 2 * ahead, ahead},
		{"whole prompt held", len(all), len(all), len(all)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := newRouter(cfg, 1)
			if err != nil {
				t.Fatal(err)
			}
			view := testView(t, cfg.endpoints, all[:tt.held])
			d := r.route(body, view, locals, routeOptions{modelAgnostic: true})
			if d.outcome != routed || d.endpoint != cfg.endpoints[0] {
				t.Fatalf("routed %v to %s, want the holder", d.outcome, d.endpoint)
			}
			if len(r.hashes) != tt.hashed || r.blocks != len(all) || d.policy.Blocks != tt.want {
				t.Errorf("hashed %d of %d blocks, matched %d; want %d hashed, %d matched", len(r.hashes), r.blocks, d.policy.Blocks, tt.hashed, tt.want)
			}
			for i, h := range r.hashes {
				if h != all[i] {
					t.Fatalf("hash %d differs from the whole prompt's chain", i)
				}
			}
			// Priced as the whole prompt, however much of it was hashed.
			if c := d.policy.Chosen; c.CachedTokens+c.UncachedTokens < d.promptTokens-1 {
				t.Errorf("priced %d + %d tokens of a %d-token prompt", c.CachedTokens, c.UncachedTokens, d.promptTokens)
			}
		})
	}
}

// TestAddrFollowsTheSnapshot: the address a slot routes to is the one the
// current snapshot has there, however often an earlier snapshot's was
// returned, and returning it again allocates nothing.
func TestAddrFollowsTheSnapshot(t *testing.T) {
	cfg := chatMLConfig(t, "10.0.0.1:8000", "10.0.0.2:8000")
	r, err := newRouter(cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	before := testView(t, cfg.endpoints, nil).Manifest()
	after := testView(t, []string{"10.0.0.9:8000", "10.0.0.2:8000"}, nil).Manifest()
	for _, step := range []struct {
		m    *snapshot.Manifest
		slot int
		want string
	}{
		{before, 1, "10.0.0.2:8000"},
		{before, 0, "10.0.0.1:8000"},
		{after, 0, "10.0.0.9:8000"},
		{after, 1, "10.0.0.2:8000"},
		{before, 0, "10.0.0.1:8000"},
	} {
		if got := r.addr(step.m, step.slot); got != step.want {
			t.Errorf("slot %d: %s, want %s", step.slot, got, step.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { r.addr(before, 0) }); n != 0 {
		t.Errorf("returning the same address allocated %v times", n)
	}
}
