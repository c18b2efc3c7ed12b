package main

import (
	"time"

	"github.com/kvroute/kvroute/shared/policy"
)

// stepClocks follows each engine's steps as this VM's streaming responses
// show them. A continuous-batching engine ends every step by sending each
// streaming request its next token, so the tokens of any one stream mark
// the engine's step boundaries: when the last step ended, and (the gap
// between a stream's last two tokens) how long it took. A request that
// arrives mid-step waits for the next one, which on a cached prompt is
// half its time to first token; knowing where the step is lets the
// latency model predict that wait instead of averaging it (policy.Local).
//
// A request sent just before a step ends misses it: it reaches the
// engine's scheduler after the next step began without it, and waits that
// step out too. How long before the end it must be sent (the lead: the
// proxy's hop, the engine's HTTP handling and tokenisation) is learned
// from the gateway's own requests (learn).
type stepClocks struct {
	m map[uint64]stepClock // by endpoint hash
}

type stepClock struct {
	last   int64 // when a token last arrived from the engine, Unix nanoseconds
	length int64 // the last step's length, nanoseconds
	lead   int64 // nanoseconds; see learn
}

// Bounds on what a clock says. Gaps under minStep are a response's frames
// arriving back to back (the last token and the end of the stream), not a
// step. A clock stays trusted while the step under way has run less than
// staleSteps of the last one; past that the engine paused or the gateway's
// streams there ended, and nothing is known.
const (
	minStep    = int64(time.Millisecond)
	maxStep    = int64(10 * time.Second)
	staleSteps = 4
)

// token records a token from endpoint's engine at now, on a stream whose
// previous token came at prev (0: its first).
func (s *stepClocks) token(endpoint uint64, now, prev int64) {
	if s.m == nil {
		s.m = map[uint64]stepClock{}
	}
	c := s.m[endpoint]
	if gap := now - prev; prev != 0 && gap >= minStep && gap <= maxStep {
		c.length = gap
	}
	if gap := now - c.last; gap >= minStep || c.last == 0 {
		c.last = now
	}
	s.m[endpoint] = c
}

// leadStep is how far one request moves the learned lead towards what it
// showed: a quarter, so one odd request moves it little.
const leadStep = 4

// maxLeadTokens bounds the uncached prompt of a request the lead is learned
// from: a longer prefill lengthens the step that takes it, which would read
// as a step missed.
const maxLeadTokens = 256

// at returns what the clock of endpoint says at now: how long the step
// under way has left and the last step's length, nanoseconds; length 0
// when it is not known.
func (s *stepClocks) at(endpoint uint64, now int64) (left, length int64) {
	c, ok := s.m[endpoint]
	if !ok || !c.known(now) {
		return 0, 0
	}
	return max(c.last+c.length-now, 0), c.length
}

// known reports whether the clock says anything at now: it has timed a
// step, and the step under way has run less than staleSteps of it.
func (c *stepClock) known(now int64) bool {
	return c.length != 0 && now-c.last <= staleSteps*c.length
}

// learn learns endpoint's lead from a request sent when its clock said
// left and length, whose first token took ttft (nanoseconds). The request
// joined the step after the one under way if its first token came within
// about a step of that step's end (a step and a half: steps vary), and
// missed it otherwise. A miss says the lead is longer than left, a join
// that it is at most left; each moves the lead a step towards left when
// the lead is on the wrong side, which settles it where misses give way to
// joins. A step that had run past its length (left 0) says nothing.
func (s *stepClocks) learn(endpoint uint64, left, length, ttft int64) {
	c, ok := s.m[endpoint]
	if !ok || length == 0 || left == 0 {
		return
	}
	missed := ttft-left > length+length/2
	switch {
	case missed && left > c.lead:
		c.lead += (left - c.lead) / leadStep
	case !missed && left < c.lead:
		c.lead -= (c.lead - left) / leadStep
	}
	s.m[endpoint] = c
}

// fill puts each known clock in the slot of its endpoint, at now, and
// forgets stale ones.
func (s *stepClocks) fill(slotOf map[uint64]int, local []policy.Local, now int64) {
	for ep, c := range s.m {
		age := now - c.last
		if !c.known(now) {
			if age > maxStep {
				delete(s.m, ep)
			}
			continue
		}
		if i, ok := slotOf[ep]; ok && i < len(local) {
			local[i].StepAge = float64(max(age, 0)) / 1e9
			local[i].StepLength = float64(c.length) / 1e9
			local[i].StepLead = float64(c.lead) / 1e9
		}
	}
}
