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
