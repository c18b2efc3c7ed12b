package policy

import (
	"testing"
	"time"
)

// TestDecodeSaturationLasts: while the planner moves groups, a holder
// whose batch runs more than 1.3 times slower than another's keeps its
// prefix's requests until that has lasted about a chat answer's decoding,
// so a passing stall (a moved group's cold prefill) releases nothing,
// while a lasting load does; with no group moving it releases at once.
func TestDecodeSaturationLasts(t *testing.T) {
	// 22.8 ms a token against 15 (1.52): past the bar; 30 running
	// against 20 (1.19) is between the bars; equal batches are calm.
	holder := func(running int) ep {
		return ep{info: withRunning(healthy(0), running), blocks: promptBlocks * 4 / 5, gpu: promptBlocks * 4 / 5}
	}
	type step struct {
		at            time.Duration // after the run's start
		holder, other int           // requests running there
		want          Reason
		wantSaturated int
	}
	const soon, later = time.Second, time.Minute // within and well past the quickest batch's turnover (about 4 s here)
	tests := []struct {
		name   string
		moving bool // another group is pinned: the planner is moving groups
		steps  []step
	}{
		{"a stall that passes releases nothing", true, []step{
			{0, 40, 15, ReasonAffinity, 0},
			{soon, 40, 15, ReasonAffinity, 0},
			{2 * soon, 15, 15, ReasonAffinity, 0},
			{4 * soon, 40, 15, ReasonAffinity, 0}, // a new stall: its clock starts again
			{6 * soon, 40, 15, ReasonAffinity, 0},
		}},
		{"a load that lasts releases", true, []step{
			{0, 40, 15, ReasonAffinity, 0},
			{2 * soon, 40, 15, ReasonAffinity, 0},
			{5 * soon, 40, 15, ReasonSaturatedRelease, 1},
			{6 * soon, 40, 15, ReasonSaturatedRelease, 1},
		}},
		{"a load not seen in between has not lasted", true, []step{
			{0, 40, 15, ReasonAffinity, 0},
			{later, 40, 15, ReasonAffinity, 0},
			{later + soon, 40, 15, ReasonAffinity, 0},
			{2 * later, 40, 15, ReasonAffinity, 0},
		}},
		{"a dip between the bars keeps the clock", true, []step{
			{0, 40, 15, ReasonAffinity, 0},
			{2 * soon, 30, 20, ReasonAffinity, 0},
			{5 * soon, 40, 15, ReasonSaturatedRelease, 1},
		}},
		{"with no group moving a load releases at once", false, []step{
			{0, 40, 15, ReasonSaturatedRelease, 1},
			{soon, 15, 15, ReasonAffinity, 0},
			{2 * soon, 40, 15, ReasonSaturatedRelease, 1},
		}},
	}
	// Another group's pin: the planner is moving groups, and this
	// request's is not one of them.
	const movingGroup = 0x5eed
	start := time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := picker(t, nil)
			for i, s := range tt.steps {
				other := ep{info: withRunning(healthy(0), s.other)}
				if tt.moving {
					other.info.Pins = []uint64{movingGroup}
				}
				v, hs := fixture(t, []ep{holder(s.holder), other})
				d := p.Pick(v, &Request{Model: model, Hashes: hs, Now: start.Add(s.at)})
				if d.Reason != s.want || d.DecodeSaturated != s.wantSaturated {
					t.Errorf("step %d (%v): %v with %d saturated; want %v with %d", i, s.at, d.Reason, d.DecodeSaturated,
						s.want, s.wantSaturated)
				}
			}
		})
	}
}

// TestOverloadNewOccupant: a slot taken by another endpoint starts its
// clock afresh.
func TestOverloadNewOccupant(t *testing.T) {
	start, turnover := time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC).UnixNano(), int64(time.Second)
	var o overload
	o.lasting(1, 1.5, start, turnover)
	if !o.lasting(1, 1.5, start+turnover, turnover) {
		t.Fatal("a load past the bar for its turnover is not saturated")
	}
	if o.lasting(2, 1.5, start+2*turnover, turnover) {
		t.Error("a new endpoint in the slot inherited its predecessor's saturation")
	}
}
