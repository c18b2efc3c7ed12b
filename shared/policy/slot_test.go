package policy

import (
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute/shared/snapshot"
)

func TestSlot(t *testing.T) {
	// The test prompt's first 1,024 blocks are 16,384 tokens: a second of
	// prefill at the test rate, which a slot holding them saves.
	_, hashes := fixture(t, []ep{cold(0)})
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
