package main

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/shared/policy"
)

func TestStepClocks(t *testing.T) {
	ms := func(n float64) int64 { return int64(n * float64(time.Millisecond)) }
	const a, b = 1, 2
	slotOf := map[uint64]int{a: 0, b: 1}
	tests := []struct {
		name    string
		tokens  [][3]int64 // endpoint, now, the stream's previous token
		at      int64
		age, ln float64 // want, seconds; ln 0: not known
	}{
		{"one stream, mid-step", [][3]int64{{a, ms(100), 0}, {a, ms(140), ms(100)}}, ms(150), 0.010, 0.040},
		{"a stream's first token gives no length", [][3]int64{{a, ms(100), 0}}, ms(110), 0, 0},
		{"the end of a stream is not a step", [][3]int64{{a, ms(100), 0}, {a, ms(140), ms(100)}, {a, ms(140.2), ms(140)}}, ms(150), 0.010, 0.040},
		{"streams of one step share its end", [][3]int64{{a, ms(100), 0}, {a, ms(140), ms(100)}, {a, ms(140.5), ms(101)}}, ms(150), 0.010, 0.0395},
		{"stale after four steps", [][3]int64{{a, ms(100), 0}, {a, ms(140), ms(100)}}, ms(141 + 160), 0, 0},
		{"a long pause is not a step", [][3]int64{{a, ms(100), 0}, {a, ms(100) + int64(11*time.Second), ms(100)}}, ms(100) + int64(11*time.Second) + ms(5), 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s stepClocks
			for _, tok := range tt.tokens {
				s.token(uint64(tok[0]), tok[1], tok[2])
			}
			local := make([]policy.Local, 2)
			s.fill(slotOf, local, tt.at)
			got := local[0]
			if d := got.StepAge - tt.age; got.StepLength != tt.ln || d > 1e-9 || d < -1e-9 {
				t.Errorf("step age %.4f length %.4f, want %.4f %.4f", got.StepAge, got.StepLength, tt.age, tt.ln)
			}
			if local[1] != (policy.Local{}) {
				t.Errorf("another endpoint got a clock: %+v", local[1])
			}
		})
	}
}

// TestStepLead: a request whose first token comes a step after the one it
// could have joined shows the lead is longer than what that step had left
// when it was sent; one that joined, that it is at most that. The lead
// settles between the two, and the clock hands it to the policy.
func TestStepLead(t *testing.T) {
	ms := func(n float64) int64 { return int64(n * float64(time.Millisecond)) }
	const ep = 1
	var s stepClocks
	s.token(ep, ms(1000), 0)
	s.token(ep, ms(1020), ms(1000)) // 20 ms steps
	// A request sent 3 ms or less before a step's end misses it.
	const lead = 3
	for i := range 400 {
		left := 0.5 + float64(i%12)*0.5 // 0.5 to 6 ms
		ttft := left + 20 + 1           // the step that takes it, a little longer
		if left <= lead {
			ttft += 20
		}
		s.learn(ep, ms(left), ms(20), ms(ttft))
	}
	s.learn(ep, 0, ms(20), ms(45)) // a step run past its length says nothing
	local := make([]policy.Local, 1)
	s.fill(map[uint64]int{ep: 0}, local, ms(1025))
	// Each miss moves it a quarter of the way up to its bound, so it
	// comes as close to the last miss as it likes, from below.
	if got := local[0].StepLead * 1e3; got < lead-0.1 || got > lead+0.5 {
		t.Errorf("learned lead %.2f ms, want about the last miss (%d ms), and no more than the first join (%.1f ms)", got, lead, lead+0.5)
	}
	if left, length := s.at(ep, ms(1025)); left != ms(15) || length != ms(20) {
		t.Errorf("at: %v left of %v, want 15 ms of 20 ms", time.Duration(left), time.Duration(length))
	}
	if _, length := s.at(ep, ms(1020+81)); length != 0 {
		t.Error("a stale clock was read")
	}
}

// BenchmarkStepToken is what every streamed token costs the worker, on top
// of reading the clock.
func BenchmarkStepToken(b *testing.B) {
	var s stepClocks
	now := int64(time.Second)
	for i := 0; b.Loop(); i++ {
		now += int64(time.Millisecond)
		s.token(uint64(i%8), now, now-20*int64(time.Millisecond))
	}
}
