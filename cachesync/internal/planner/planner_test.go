package planner

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/cachesync/internal/demand"
)

// at builds a group homed at one endpoint, of one request a second asking
// for rate tokens, both well measured.
func at(key uint64, endpoint string, rate float64) demand.Group {
	return demand.Group{Key: key, Rate: rate, Shares: []demand.Share{{Endpoint: endpoint, Rate: rate}},
		Sample: demand.Sample{Requests: 20, Arrivals: 1, ArrivalsVar: 1e-4, Answer: rate, AnswerVar: 0.01}}
}

// sorted sorts groups as demand.Tracker.Groups does, and gives each the
// halves its whole sample would split into: each of half its requests, both
// reading the same.
func sorted(gs ...demand.Group) []demand.Group {
	for i := range gs {
		s := gs[i].Sample
		half := demand.Sample{Requests: s.Requests / 2, Arrivals: s.Arrivals / 2, ArrivalsVar: s.ArrivalsVar / 2,
			Answer: s.Answer, AnswerVar: 2 * s.AnswerVar}
		gs[i].Halves = [2]demand.Sample{half, half}
	}
	slices.SortFunc(gs, func(a, b demand.Group) int {
		if a.Rate > b.Rate {
			return -1
		}
		if a.Rate < b.Rate {
			return 1
		}
		return 0
	})
	return gs
}

var pool = map[string][]Endpoint{"m|65536": idle("a", "b", "c", "d")}

// idle returns endpoints of addrs with room for any move.
func idle(addrs ...string) []Endpoint {
	eps := make([]Endpoint, len(addrs))
	for i, a := range addrs {
		eps[i] = Endpoint{Addr: a}
	}
	return eps
}

// b2b is b2b-saas's case: four groups a engine, the four longest
// answering on a (620 tokens/s against a mean of 587.5).
func b2b() []demand.Group {
	return sorted(
		at(1, "a", 164), at(2, "a", 160), at(3, "a", 150), at(4, "a", 146),
		at(5, "b", 130), at(6, "b", 135), at(7, "b", 140), at(8, "b", 145),
		at(9, "c", 145), at(10, "c", 145), at(11, "c", 145), at(12, "c", 145),
		at(13, "d", 145), at(14, "d", 145), at(15, "d", 145), at(16, "d", 145),
	)
}

// noisy is sixteen groups four to an engine, every one asking 145 tokens
// of its answers at 1 request a second; scaled by chance, their measured
// arrivals swing by the Poisson noise of a 30 s sample (±18%), and a's four
// came in 15% above the rest. Groups 1 and 5 read their true rate.
func noisy(chance float64) []demand.Group { return noisyOver(chance, 30) }

// noisyOver is noisy with the arrivals measured over seconds: the same
// swings, scaled to that sample's noise.
func noisyOver(chance, seconds float64) []demand.Group {
	swing := []float64{1.15, 1.2, 1.1, 1.15, 1, 0.82, 0.95, 1.03, 0.85, 1.05, 0.9, 1, 0.8, 1.1, 0.95, 0.98}
	chance *= math.Sqrt(30 / seconds)
	gs := make([]demand.Group, 16)
	for i := range gs {
		key := uint64(i + 1)
		gs[i] = at(key, string(rune('a'+i/4)), 145)
		if key != 1 && key != 5 {
			gs[i].Arrivals = 1 + chance*(swing[i]-1)
		}
		gs[i].ArrivalsVar = 1 / seconds
		gs[i].Rate = gs[i].Arrivals * 145
		gs[i].Shares[0].Rate = gs[i].Rate
	}
	return sorted(gs...)
}

// b2bThrough is b2b-saas's answers with the arrivals of swing's groups.
func b2bThrough(swing []demand.Group) []demand.Group {
	gs := b2b()
	for i := range gs {
		for _, n := range swing {
			if n.Key == gs[i].Key {
				gs[i].Arrivals, gs[i].ArrivalsVar = n.Arrivals, n.ArrivalsVar
			}
		}
		gs[i].Rate = gs[i].Arrivals * gs[i].Answer
		gs[i].Shares[0].Rate = gs[i].Rate
	}
	return sorted(gs...)
}

// sameMove compares moves, their rates to a tenth of a token a second.
func sameMove(a, b Move) bool {
	return a.Pool == b.Pool && a.Key == b.Key && a.From == b.From && a.To == b.To && a.Dropped == b.Dropped &&
		math.Abs(a.Rate-b.Rate) < 0.1
}

func TestPlan(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tests := []struct {
		name   string
		groups []demand.Group
		want   []Move
	}{
		{"balanced: nothing", sorted(at(1, "a", 600), at(2, "b", 600), at(3, "c", 600), at(4, "d", 600)), nil},
		{"four groups a engine, the longest answers together: a swap", b2b(), []Move{
			{Pool: "m|65536", Key: 1, From: "a", To: "b", Rate: 164}, {Pool: "m|65536", Key: 5, From: "b", To: "a", Rate: 130}}},
		{"two engines 4% above the mean, two below: under the threshold", sorted(
			at(1, "a", 154), at(2, "a", 152), at(3, "a", 150), at(4, "a", 147),
			at(5, "b", 153), at(6, "b", 151), at(7, "b", 149), at(8, "b", 147),
			at(9, "c", 143), at(10, "c", 140), at(11, "c", 139), at(12, "c", 136),
			at(13, "d", 144), at(14, "d", 141), at(15, "d", 140), at(16, "d", 137),
		), nil},
		{"a small group off the busiest: one move", sorted(at(1, "a", 300), at(2, "a", 50), at(3, "b", 200), at(4, "c", 275), at(5, "d", 275)), []Move{
			{Pool: "m|65536", Key: 2, From: "a", To: "b", Rate: 50}}},
		{"one group bigger than the gap: no move makes it better", sorted(at(1, "a", 700), at(2, "b", 500), at(3, "c", 500), at(4, "d", 500)), nil},
		{"a hot group spread over two endpoints is not moved", sorted(
			demand.Group{Key: 1, Rate: 800, Shares: []demand.Share{{Endpoint: "a", Rate: 400}, {Endpoint: "b", Rate: 400}},
				Sample: demand.Sample{Requests: 50, Arrivals: 1, Answer: 800}},
			at(2, "a", 300), at(3, "b", 100), at(4, "c", 350), at(5, "d", 350)), []Move{
			{Pool: "m|65536", Key: 2, From: "a", To: "c", Rate: 300}}},
		{"groups seen too few times are not moved", func() []demand.Group {
			gs := b2b()
			for i := range gs {
				gs[i].Requests = 2
			}
			return sorted(gs...)
		}(), nil},
		{"answers not yet measured well enough: no move", func() []demand.Group {
			gs := b2b()
			for i := range gs {
				gs[i].AnswerVar = 15 * 15 // a few requests each
			}
			return sorted(gs...)
		}(), nil},
		{"equal groups whose arrivals ran hot and cold by chance: no move", noisy(1), nil},
		{"b2b-saas's answers read through 30 s of those chance arrivals: too unsure to move", b2bThrough(noisy(1)), nil},
		{"b2b-saas's answers read through 5 minutes of chance arrivals: the same swap", b2bThrough(noisyOver(1, 300)),
			[]Move{{Pool: "m|65536", Key: 1, From: "a", To: "b", Rate: 163.61}, {Pool: "m|65536", Key: 5, From: "b", To: "a", Rate: 129.69}}},
		{"groups that really draw more traffic keep most of it: one swapped off", func() []demand.Group {
			gs := noisy(0)
			for i := range gs {
				gs[i].ArrivalsVar = 1.0 / 1000 // a long sample
				if gs[i].Key <= 2 {
					gs[i].Arrivals, gs[i].Rate, gs[i].Shares[0].Rate = 1.3, 1.3*145, 1.3*145
				}
			}
			return sorted(gs...)
		}(), []Move{{Pool: "m|65536", Key: 1, From: "a", To: "b", Rate: 184.9}, {Pool: "m|65536", Key: 5, From: "b", To: "a", Rate: 145.5}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := New(Config{})
			if got := p.Plan(t0, tt.groups, pool); got != nil {
				t.Fatalf("moved %+v before the pool settled", got)
			}
			got := p.Plan(t0.Add(61*time.Second), tt.groups, pool)
			if !slices.EqualFunc(got, tt.want, sameMove) {
				t.Fatalf("moves %+v, want %+v", got, tt.want)
			}
			for _, m := range got {
				if !slices.Contains(p.Pins(m.To), m.Key) {
					t.Errorf("group %d moved to %s but not pinned there: %v", m.Key, m.To, p.Pins(m.To))
				}
			}
		})
	}
}

// TestPinsLast: a move's pins hold while its groups follow them, the pool
// waits a cooldown before the next move, and pins go when their group or
// endpoint does, or when the group's requests do not follow.
func TestPinsLast(t *testing.T) {
	t0 := time.Unix(1000, 0)
	p := New(Config{})
	p.Plan(t0, b2b(), pool)
	now := t0.Add(61 * time.Second)
	if got := p.Plan(now, b2b(), pool); len(got) != 2 {
		t.Fatalf("moves %+v, want a swap", got)
	}
	// The demand figures still show the groups where they were: the pins
	// count, so the pool is balanced as planned and nothing more moves,
	// cooldown or not.
	for _, d := range []time.Duration{time.Second, 40 * time.Second} {
		if got := p.Plan(now.Add(d), b2b(), pool); got != nil {
			t.Fatalf("after %v: moved %+v again", d, got)
		}
	}
	if !slices.Equal(p.Pins("b"), []uint64{1}) || !slices.Equal(p.Pins("a"), []uint64{5}) {
		t.Fatalf("pins a %v, b %v", p.Pins("a"), p.Pins("b"))
	}
	// Past two cooldowns, a group whose requests still go elsewhere is let
	// go, and not moved again; one that followed its pin keeps it.
	followed := b2b()
	for i := range followed {
		if followed[i].Key == 5 {
			followed[i].Shares = []demand.Share{{Endpoint: "a", Rate: followed[i].Rate}}
		}
	}
	got := p.Plan(now.Add(61*time.Second), followed, pool)
	if want := (Move{Pool: "m|65536", Key: 1, From: "b", Rate: 164, Dropped: true}); len(got) == 0 || !sameMove(got[0], want) {
		t.Errorf("Plan = %+v, want first the unfollowed pin reported dropped: %+v", got, want)
	}
	if slices.Contains(p.Pins("b"), 1) || !slices.Contains(p.Pins("a"), 5) {
		t.Fatalf("pins a %v, b %v; want group 5's at a, not group 1's at b", p.Pins("a"), p.Pins("b"))
	}
	// The endpoint leaves the pool: its pins go.
	p.Plan(now.Add(62*time.Second), followed, map[string][]Endpoint{"m|65536": idle("b", "c", "d")})
	if len(p.Pins("a")) != 0 {
		t.Fatalf("pins of a gone endpoint: %v", p.Pins("a"))
	}
	// A group no longer seen: its pin goes.
	p = New(Config{})
	p.Plan(t0, b2b(), pool)
	p.Plan(now, b2b(), pool)
	p.Plan(now.Add(time.Second), b2b()[1:], pool) // group 1, the most demanding, is gone
	if len(p.Pins("b")) != 0 {
		t.Fatalf("pin of a vanished group: %v", p.Pins("b"))
	}
}

func TestMaxPins(t *testing.T) {
	t0 := time.Unix(1000, 0)
	p := New(Config{MaxPins: 1})
	p.pins[99] = pin{"b", t0}
	gs := append(b2b(), at(99, "b", 1))
	p.Plan(t0, gs, pool)
	if got := p.Plan(t0.Add(61*time.Second), gs, pool); len(got) != 0 {
		t.Fatalf("moved %+v to an endpoint at its pin bound", got)
	}
}

// TestMovedGroupsRest: a group moved is left where it is for restFor. The
// smallest group of a pool is every swap's best partner; without the rest
// it would be swapped on at every cooldown.
func TestMovedGroupsRest(t *testing.T) {
	t0 := time.Unix(1000, 0)
	p := New(Config{MinGain: 0.005})
	p.Plan(t0, b2b(), pool)
	now := t0.Add(61 * time.Second)
	if got := p.Plan(now, b2b(), pool); len(got) != 2 || got[0].Key != 1 || got[1].Key != 5 {
		t.Fatalf("moves %+v, want groups 1 and 5 swapped", got)
	}
	// The groups followed their pins, and group 9's answers run longer
	// than they first did: c is now the busiest, and the best partner for
	// one of its groups is group 5, the smallest, just moved to a.
	after := func() []demand.Group {
		gs := b2b()
		for i := range gs {
			switch gs[i].Key {
			case 1:
				gs[i] = at(1, "b", 164)
			case 5:
				gs[i] = at(5, "a", 130)
			case 9:
				gs[i] = at(9, "c", 190)
			}
		}
		return sorted(gs...)
	}
	got := p.Plan(now.Add(time.Minute), after(), pool)
	if len(got) != 2 || got[0].From != "c" {
		t.Fatalf("moves %+v, want one of c's groups swapped", got)
	}
	for _, m := range got {
		if m.Key == 1 || m.Key == 5 {
			t.Fatalf("moves %+v: a group moved a minute ago moved again", got)
		}
	}
	// Past the rest, group 5 may move again.
	p = New(Config{MinGain: 0.005})
	p.Plan(t0, b2b(), pool)
	p.Plan(now, b2b(), pool)
	got = p.Plan(now.Add(restFor+time.Second), after(), pool)
	if len(got) != 2 || got[1].Key != 5 {
		t.Fatalf("after the rest: moves %+v, want group 5 swapped for one of c's", got)
	}
}

// TestHeldOut: a move chosen on one half of the groups' requests is made
// only if the other half bears it out.
func TestHeldOut(t *testing.T) {
	t0 := time.Unix(1000, 0)
	even := sorted(noisy(0)...) // every group 145 tokens
	tests := []struct {
		name  string
		shown [2]bool // which halves show b2b-saas's long answers on a
		moves int
	}{
		{"both halves: a swap", [2]bool{true, true}, 2},
		{"the first half only: none", [2]bool{true, false}, 0},
		{"the second half only: none", [2]bool{false, true}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gs := b2b()
			for i := range gs {
				for h, shown := range tt.shown {
					if shown {
						continue
					}
					for _, e := range even {
						if e.Key == gs[i].Key {
							gs[i].Halves[h] = e.Halves[h]
						}
					}
				}
			}
			p := New(Config{})
			p.Plan(t0, gs, pool)
			if got := p.Plan(t0.Add(61*time.Second), gs, pool); len(got) != tt.moves {
				t.Fatalf("moves %+v, want %d", got, tt.moves)
			}
		})
	}
}

// TestDroppedPinHoldsPool: once a pin is dropped because its group's
// requests did not follow, the pool makes no move for restFor, however
// unbalanced it reads: what kept the group from its target (a saturated
// batch, a queue) keeps the next group from its target too.
func TestDroppedPinHoldsPool(t *testing.T) {
	t0 := time.Unix(1000, 0)
	p := New(Config{MinGain: 0.005})
	p.Plan(t0, b2b(), pool)
	now := t0.Add(61 * time.Second)
	if got := p.Plan(now, b2b(), pool); len(got) != 2 {
		t.Fatalf("moves %+v, want a swap", got)
	}
	// Neither group followed; a's other groups still make it the busiest.
	now = now.Add(61 * time.Second)
	got := p.Plan(now, b2b(), pool)
	if len(got) != 2 || !got[0].Dropped || !got[1].Dropped {
		t.Fatalf("Plan = %+v, want both pins dropped and nothing moved", got)
	}
	for _, d := range []time.Duration{time.Minute, restFor - time.Second} {
		if got := p.Plan(now.Add(d), b2b(), pool); len(got) != 0 {
			t.Fatalf("%v after a dropped pin: moved %+v", d, got)
		}
	}
	if got := p.Plan(now.Add(restFor+time.Second), b2b(), pool); len(got) == 0 {
		t.Fatal("past restFor after the drop: no move in a pool still unbalanced")
	}
}

// TestMovesWaitForRoom: an endpoint takes a moved group only while its
// engine queues nothing and has most of its KV cache free; the move waits
// for that room, and is made once it comes.
func TestMovesWaitForRoom(t *testing.T) {
	t0 := time.Unix(1000, 0)
	full := func(eps []Endpoint, usage float64, waiting int, addrs ...string) []Endpoint {
		out := slices.Clone(eps)
		for i := range out {
			if slices.Contains(addrs, out[i].Addr) {
				out[i].KVCacheUsage, out[i].Waiting = usage, waiting
			}
		}
		return out
	}
	all := idle("a", "b", "c", "d")
	// b2b-saas's case moves only by the swap of a and b; with a fifth,
	// small group at a, moving it alone to b, c or d all gain, b the most.
	fifth := func() []demand.Group { return sorted(append(b2b(), at(17, "a", 60))...) }
	tests := []struct {
		name   string
		groups func() []demand.Group
		eps    []Endpoint
		// want is what the moves may touch: from and to, sorted, or none.
		want []string
	}{
		{"room everywhere: a swap with b", b2b, all, []string{"a", "b"}},
		{"b 80% full: still the swap", b2b, full(all, 0.8, 0, "b"), []string{"a", "b"}},
		{"b 85% full: the swap waits", b2b, full(all, 0.85, 0, "b"), nil},
		{"a request waits at b: the swap waits", b2b, full(all, 0.1, 1, "b"), nil},
		{"a 90% full: no swap, which brings it a group back", b2b, full(all, 0.9, 0, "a"), nil},
		{"a fifth group: it goes to b", fifth, all, []string{"a", "b"}},
		{"b 85% full: the fifth goes where there is room", fifth, full(all, 0.85, 0, "b"), []string{"a", "c|d"}},
		{"a 90% full: a may still shed it", fifth, full(all, 0.9, 0, "a"), []string{"a", "b"}},
		{"no room at b, c or d: no move", fifth, full(all, 0.9, 0, "b", "c", "d"), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := New(Config{})
			pools := map[string][]Endpoint{"m|65536": tt.eps}
			p.Plan(t0, tt.groups(), pools)
			got := p.Plan(t0.Add(61*time.Second), tt.groups(), pools)
			if tt.want == nil {
				if len(got) != 0 {
					t.Fatalf("moves %+v onto endpoints without room", got)
				}
				return
			}
			if len(got) == 0 {
				t.Fatalf("no move, want one between %v", tt.want)
			}
			for _, m := range got {
				ends := []string{m.From, m.To}
				slices.Sort(ends)
				if ends[0] != tt.want[0] || !slices.Contains(strings.Split(tt.want[1], "|"), ends[1]) {
					t.Errorf("move %+v, want one between %v", m, tt.want)
				}
			}
		})
	}
	// A cache filling (a stage's first seconds) is not room, however much
	// is free: the swap waits until b's usage levels.
	t.Run("b filling", func(t *testing.T) {
		p := New(Config{})
		plan := func(s int, usage float64) []Move {
			return p.Plan(t0.Add(time.Duration(s)*time.Second), b2b(), map[string][]Endpoint{"m|65536": full(all, usage, 0, "b")})
		}
		for s := range 60 {
			plan(s, 0.1)
		}
		for s := 60; s < 63; s++ {
			if got := plan(s, 0.1+0.2*float64(s-59)); len(got) != 0 {
				t.Fatalf("at %d s: moves %+v onto a cache filling", s, got)
			}
		}
		var got []Move
		for s := 63; s < 90 && len(got) == 0; s++ {
			got = plan(s, 0.7)
		}
		if len(got) != 2 {
			t.Fatalf("moves %+v, want the swap once b's usage levelled at 70%%", got)
		}
	})
	// The room comes back: the waiting move is made then.
	p := New(Config{})
	busy := map[string][]Endpoint{"m|65536": full(all, 0.9, 0, "b", "c", "d")}
	p.Plan(t0, b2b(), busy)
	for s := 61; s < 120; s += 10 {
		if got := p.Plan(t0.Add(time.Duration(s)*time.Second), b2b(), busy); len(got) != 0 {
			t.Fatalf("at %d s: moves %+v onto endpoints without room", s, got)
		}
	}
	if got := p.Plan(t0.Add(121*time.Second), b2b(), pool); len(got) != 2 {
		t.Fatalf("once room came: moves %+v, want the swap", got)
	}
}
