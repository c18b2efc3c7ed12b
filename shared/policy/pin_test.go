package policy

import (
	"testing"

	"github.com/kvroute/kvroute/shared/snapshot"
)

// TestPinned: a group cachesync's planner pinned to an endpoint goes
// there, cold or not, unless the endpoint cannot take it now.
func TestPinned(t *testing.T) {
	holder := warm(0, promptBlocks)
	pinned := func(e ep, key uint64) ep { e.info.Pins = []uint64{key}; return e }
	unhealthy := cold(0)
	unhealthy.info.Health = snapshot.HealthUnhealthy
	// The fixture's prompt hashes depend only on how many endpoints it
	// has: its group's key is known before the snapshot is built.
	_, hashes := fixture(t, []ep{cold(0), cold(0)})
	key, _ := snapshot.GroupKey(hashes)
	tests := []struct {
		name   string
		eps    []ep
		chosen int
		reason Reason
	}{
		{"moved to an idle endpoint", []ep{holder, pinned(cold(0), key)}, 1, ReasonMoved},
		{"pinned to its holder", []ep{pinned(holder, key), cold(0)}, 0, ReasonAffinity},
		{"another group's pin", []ep{holder, pinned(cold(0), key+1)}, 0, ReasonAffinity},
		// 1.9 s of prefill ahead of it, under one more cold prefill of
		// the prompt (2 s): the move's wait is worth it.
		{"a queue shorter than a cold prefill", []ep{holder, pinned(cold(second*19/10), key)}, 1, ReasonMoved},
		{"a queue longer than a cold prefill", []ep{holder, pinned(cold(3*second), key)}, 0, ReasonAffinity},
		{"the pinned endpoint unhealthy", []ep{holder, pinned(unhealthy, key)}, 0, ReasonAffinity},
		{"the pinned endpoint saturated by its decoding", []ep{holder, pinned(ep{info: withRunning(healthy(0), 400)}, key)}, 0, ReasonAffinity},
		{"a group new to the pool goes where it is pinned", []ep{cold(0), pinned(cold(second/10), key)}, 1, ReasonLeastLoad},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, hs := fixture(t, tt.eps)
			r := Request{Model: model, Hashes: hs}
			d := picker(t, nil).Pick(v, &r)
			if d.Endpoint != tt.chosen || d.Reason != tt.reason {
				t.Errorf("chose %d (%v); want %d (%v)", d.Endpoint, d.Reason, tt.chosen, tt.reason)
			}
		})
	}
}
