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
type stepClocks struct {
	m map[uint64]stepClock // by endpoint hash
}

type stepClock struct {
	last   int64 // when a token last arrived from the engine, Unix nanoseconds
	length int64 // the last step's length, nanoseconds
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

// fill puts each known clock in the slot of its endpoint, at now, and
// forgets stale ones.
func (s *stepClocks) fill(slotOf map[uint64]int, local []policy.Local, now int64) {
	for ep, c := range s.m {
		age := now - c.last
		if c.length == 0 || age > staleSteps*c.length {
			if age > maxStep {
				delete(s.m, ep)
			}
			continue
		}
		if i, ok := slotOf[ep]; ok && i < len(local) {
			local[i].StepAge = float64(max(age, 0)) / 1e9
			local[i].StepLength = float64(c.length) / 1e9
		}
	}
}
