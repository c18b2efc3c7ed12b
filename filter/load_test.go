package main

import (
	"testing"

	"github.com/kvroute/kvroute/filter/internal/placed"
	"github.com/kvroute/kvroute/shared/policy"
)

// TestMatchPlacedMarksPrefillsInFlight: a placement counts its blocks as
// held, and a move's as still being computed until its first token comes.
func TestMatchPlacedMarksPrefillsInFlight(t *testing.T) {
	lt := loadTracker{slotOf: map[uint64]int{11: 0, 22: 1, 33: 2}, local: make([]policy.Local, 3)}
	lt.matchPlaced(&placed.Entry{Endpoint: 11, Move: true}, 32)
	lt.matchPlaced(&placed.Entry{Endpoint: 22, Move: true, Answered: true}, 48)
	lt.matchPlaced(&placed.Entry{Endpoint: 33}, 64)             // not a move: not tracked
	lt.matchPlaced(&placed.Entry{Endpoint: 44, Move: true}, 16) // not in the snapshot
	want := []policy.Local{{Blocks: 32, Prefilling: true}, {Blocks: 48}, {Blocks: 64}}
	for i, w := range want {
		if lt.local[i] != w {
			t.Errorf("slot %d: %+v, want %+v", i, lt.local[i], w)
		}
	}
}
