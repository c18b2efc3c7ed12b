package policy

import (
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute/shared/snapshot"
)

func TestSlot(t *testing.T) {
	// The test prompt's first 1,024 blocks are 16,384 tokens: a second of
	// prefill at the test rate, which a slot holding them saves. (A
	// fixture's prompt depends on its number of endpoints.)
	_, hashes := fixture(t, []ep{cold(0), cold(0)})
	other := make([]uint64, 64)
	rng := rand.New(rand.NewPCG(3, 3))
	for i := range other {
		other[i] = rng.Uint64()
	}
	long := 1 << 30
	cases := []struct {
		name  string
		slots []snapshot.EngineSlot
		want  int
	}{
		{"the idle slot holding the prefix", []snapshot.EngineSlot{{ID: 0, Hashes: other}, {ID: 1, Hashes: hashes[:1024]}}, 1},
		{"its busy slot, with a few tokens left", []snapshot.EngineSlot{{ID: 0, Busy: true, Remaining: 10, Hashes: hashes[:1024]}, {ID: 1, Hashes: other}}, 0},
		{"not its busy slot, with a long answer left", []snapshot.EngineSlot{{ID: 0, Busy: true, Remaining: long, Hashes: hashes[:1024]}, {ID: 1, Hashes: other}}, -1},
		{"an idle copy before a busy one", []snapshot.EngineSlot{{ID: 0, Busy: true, Remaining: 10, Hashes: hashes[:1024]}, {ID: 1, Hashes: hashes[:1024]}}, 1},
		{"no slot holds it", []snapshot.EngineSlot{{ID: 0, Hashes: other}}, -1},
		{"an engine without slots", nil, -1},
	}
	for _, c := range cases {
		e := warm(0, 1024)
		e.prefixes = 0 // where a prompt no slot holds goes is placeNew's (a tie here)
		e.info.Slots = c.slots
		v, _ := fixture(t, []ep{e, cold(0)})
		p := picker(t, nil)
		r := &Request{Hashes: hashes, Model: model}
		d := p.Pick(v, r)
		if d.Endpoint != 0 {
			t.Fatalf("%s: picked %d, want the warm endpoint", c.name, d.Endpoint)
		}
		if got := p.Slot(v, &d, r); got != c.want {
			t.Errorf("%s: Slot = %d, want %d (ITL %v)", c.name, got, c.want, d.Chosen.ITL)
		}
	}
}

// TestSlotsFull: a cold prompt on an engine whose every slot holds a
// prompt evicts a whole one, however little of the slots' tokens the
// prompts fill; with a slot free it evicts nothing. So a request leaves
// its queued holder for such an engine only when a slot is free.
func TestSlotsFull(t *testing.T) {
	_, hashes := fixture(t, []ep{cold(0), cold(0)})
	prompts := func(n int) []snapshot.EngineSlot {
		var s []snapshot.EngineSlot
		for i := range 2 {
			s = append(s, snapshot.EngineSlot{ID: i})
			if i < n {
				s[i].Hashes = []uint64{uint64(i) + 1, uint64(i) + 2}
			}
		}
		return s
	}
	for _, c := range []struct {
		name string
		held int
		want int
	}{
		{"both slots hold prompts: the holder's queue is cheaper", 2, 0},
		{"a slot free: the copy is", 1, 1},
	} {
		// Three seconds of prefill queued: more than the copy's cost with
		// a slot free (its blocks, which another endpoint holds, evict
		// surely), less than with a whole slot's prompt evicted too.
		holder := warm(48000, 1024)
		spare := cold(0)
		spare.info = withCapacity(spare.info, 100000)
		spare.other = 64
		spare.info.Slots = prompts(c.held)
		v, _ := fixture(t, []ep{holder, spare})
		p := picker(t, nil)
		d := p.Pick(v, &Request{Hashes: hashes, Model: model})
		if d.Endpoint != c.want {
			t.Errorf("%s: picked %d (%+v, runner-up %+v), want %d", c.name, d.Endpoint, d.Chosen, d.RunnerUp, c.want)
		}
	}
}

// TestSlotsAreTheTruth: the index holds what reports sent to an endpoint;
// an engine of a prompt per slot holds only what its slots do, so a
// prompt evicted from every slot counts as cold there.
func TestSlotsAreTheTruth(t *testing.T) {
	_, hashes := fixture(t, []ep{cold(0)})
	for _, c := range []struct {
		name   string
		slots  []snapshot.EngineSlot
		blocks int
	}{
		{"a slot holds it", []snapshot.EngineSlot{{ID: 0, Hashes: hashes[:1024]}, {ID: 1}}, 1024},
		{"evicted from every slot", []snapshot.EngineSlot{{ID: 0, Hashes: []uint64{1, 2}}, {ID: 1}}, 0},
		{"no slots listed", nil, 1024},
	} {
		e := warm(0, 1024)
		e.info.Slots = c.slots
		v, _ := fixture(t, []ep{e})
		d := picker(t, nil).Pick(v, &Request{Hashes: hashes, Model: model})
		if d.Blocks != c.blocks {
			t.Errorf("%s: %d blocks held, want %d (%s)", c.name, d.Blocks, c.blocks, d.Reason)
		}
	}
}
