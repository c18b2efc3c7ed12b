package planner

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/cachesync/internal/demand"
)

// simPool is a workload as the planner sees it through a demand.Tracker:
// groups of prompts placed evenly over four endpoints at random, each
// prompt's answer a fixed length, requests in Poisson streams over the
// groups (evenly, or by each group's weight), each routed to its group's
// endpoint (its pin's, once moved: the policy follows pins).
type simPool struct {
	rng     *rand.Rand
	answers [][]int   // by group, by prompt
	weight  []float64 // by group: its share of the requests
	home    []int     // by group: endpoint index
	eps     []string
	// cycle, if set, is the groups' requests in the order they recur
	// (inference-perf sends its prompts in one fixed cycle); sent is how
	// many have been.
	cycle []int
	sent  int
}

// newSimPool is b2b-saas: sixteen groups of five prompts, answers of
// 100-200 tokens, equal traffic.
func newSimPool(seed uint64) *simPool {
	return newSimPoolOf(seed, 16, 5, 100, 200, nil)
}

// newSimPoolOf is a pool of groups of prompts prompts each, answers of
// minAnswer-maxAnswer tokens and traffic by weight (nil: equal).
func newSimPoolOf(seed uint64, groups, prompts, minAnswer, maxAnswer int, weight []float64) *simPool {
	s := &simPool{rng: rand.New(rand.NewPCG(seed, 7)), eps: []string{"a", "b", "c", "d"}, weight: weight}
	if s.weight == nil {
		for range groups {
			s.weight = append(s.weight, 1/float64(groups))
		}
	}
	perm := s.rng.Perm(groups)
	for g := range groups {
		answers := make([]int, prompts)
		for i := range answers {
			answers[i] = minAnswer + s.rng.IntN(maxAnswer-minAnswer+1)
		}
		s.answers = append(s.answers, answers)
		s.home = append(s.home, perm[g]*len(s.eps)/groups)
	}
	return s
}

// busiest returns the true demand of the busiest endpoint over the mean's,
// from the groups' true traffic and answers.
func (s *simPool) busiest() float64 {
	load := make([]float64, len(s.eps))
	total := 0.0
	for g, answers := range s.answers {
		mean := 0.0
		for _, a := range answers {
			mean += float64(a) / float64(len(answers))
		}
		load[s.home[g]] += s.weight[g] * mean
		total += s.weight[g] * mean
	}
	return slices.Max(load) / (total / float64(len(load)))
}

// pick draws a request's group by the groups' weights, or takes the
// cycle's next.
func (s *simPool) pick() int {
	if s.cycle != nil {
		s.sent++
		return s.cycle[(s.sent-1)%len(s.cycle)]
	}
	x := s.rng.Float64()
	for g, w := range s.weight {
		if x -= w; x < 0 {
			return g
		}
	}
	return len(s.weight) - 1
}

// run sends requests at rate for d from start (none at rate 0), plans
// every second, follows the moves, and returns each plan's change to the
// true busiest endpoint's share (none for a plan that moved nothing).
func (s *simPool) run(p *Planner, tr *demand.Tracker, start time.Time, d time.Duration, rate float64) []float64 {
	var changes []float64
	now, nextPlan, end := start, start, start.Add(d)
	pools := map[string][]Endpoint{"m": idle(s.eps...)}
	for {
		next := end
		if rate > 0 {
			next = now.Add(time.Duration(s.rng.ExpFloat64() / rate * float64(time.Second)))
		}
		for !nextPlan.After(next) && nextPlan.Before(end) {
			before := s.busiest()
			moved := false
			for _, m := range p.Plan(nextPlan, tr.Groups(nextPlan), pools) {
				if !m.Dropped {
					s.home[int(m.Key)-1] = slices.Index(s.eps, m.To)
					moved = true
				}
			}
			if moved {
				changes = append(changes, s.busiest()-before)
			}
			nextPlan = nextPlan.Add(time.Second)
		}
		if !next.Before(end) {
			return changes
		}
		now = next
		g := s.pick()
		tr.Add(s.eps[s.home[g]], uint64(g+1), s.answers[g][s.rng.IntN(len(s.answers[g]))], now)
	}
}

// TestSimulatedPool runs the planner on the demand a hundred simulated
// b2b-saas pools report over bench-quick's ladder (a 30 s warm-up at
// 2 req/s, then 15 s stages from 8 to 64 req/s 10 s apart): no plan may
// leave the truly busiest endpoint busier, and most pools that start more
// than 5% unbalanced must end at least 2 points better. Before the settle
// time and the shrinking of rarely seen groups' rates, 7 of the hundred
// were left 10-25% busier by a move planned in the warm-up.
func TestSimulatedPool(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var moves, unbalanced, evened int
	for seed := range uint64(100) {
		s := newSimPool(seed)
		tr, p := demand.New(demand.Config{}), New(Config{})
		start, now := s.busiest(), t0
		stage := func(rate float64, d time.Duration) {
			for _, c := range s.run(p, tr, now, d, rate) {
				moves++
				if c > 0.01 {
					t.Errorf("seed %d, %v in: a plan left the busiest endpoint %.1f%% of the mean busier",
						seed, now.Sub(t0), 100*c)
				}
			}
			now = now.Add(d)
		}
		stage(2, 30*time.Second)
		for _, rate := range []float64{8, 24, 40, 48, 56, 64} {
			stage(rate, 15*time.Second)
			stage(0, 10*time.Second)
		}
		if start > 1.05 {
			unbalanced++
			if s.busiest() < start-0.02 {
				evened++
			}
		}
	}
	t.Logf("%d moves; %d pools more than 5%% unbalanced, %d evened", moves, unbalanced, evened)
	if evened < unbalanced*3/4 {
		t.Errorf("%d of %d pools more than 5%% unbalanced evened out", evened, unbalanced)
	}
}

// TestSimulatedUnequalGroups runs the planner on a hundred simulated
// code-gen pools: eight groups of ten prompts, two to an endpoint, answers
// of 200-400 tokens, and traffic that really differs between groups, by
// less than its Poisson noise shows within a few minutes (code-gen's
// stages send the same 96 prompts, its groups 10 to 14 of them, in one
// fixed cycle), over its ladder's rates (96 requests a stage at
// concurrency 8, 16 and 32). No plan may leave the truly busiest endpoint
// busier. With the shrunk rates taken as sure as the pool's mean (their
// variance weight² times the Poisson one), 6 of 22 plans did with the
// cycle, 1 of 7 with Poisson arrivals; on the bench a move made code-gen's
// busiest engine busier (README, the move planner).
func TestSimulatedUnequalGroups(t *testing.T) {
	counts := []int{10, 11, 12, 12, 12, 12, 13, 14}
	total := 0
	for _, c := range counts {
		total += c
	}
	for _, cyclic := range []bool{true, false} {
		t0 := time.Unix(1000, 0)
		moves := 0
		for seed := range uint64(100) {
			rng := rand.New(rand.NewPCG(seed, 11))
			weight := make([]float64, len(counts))
			perm := rng.Perm(len(counts))
			for i, j := range perm {
				weight[i] = float64(counts[j]) / float64(total)
			}
			s := newSimPoolOf(seed, len(counts), 10, 200, 400, weight)
			if cyclic {
				for g, j := range perm {
					for range counts[j] {
						s.cycle = append(s.cycle, g)
					}
				}
				rng.Shuffle(len(s.cycle), func(i, j int) { s.cycle[i], s.cycle[j] = s.cycle[j], s.cycle[i] })
			}
			tr, p := demand.New(demand.Config{}), New(Config{})
			now := t0
			for _, st := range []struct {
				rate float64
				d    time.Duration
			}{{1.08, 89 * time.Second}, {0, 4 * time.Second}, {1.85, 52 * time.Second}, {0, 4 * time.Second}, {2.6, 37 * time.Second}} {
				for _, c := range s.run(p, tr, now, st.d, st.rate) {
					moves++
					if c > 0.01 {
						t.Errorf("cycle %v, seed %d, %v in: a plan left the busiest endpoint %.1f%% of the mean busier",
							cyclic, seed, now.Sub(t0), 100*c)
					}
				}
				now = now.Add(st.d)
			}
		}
		t.Logf("cycle %v: %d plans", cyclic, moves)
	}
}
