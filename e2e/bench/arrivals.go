package bench

import (
	"bytes"
	"math"
	"math/rand/v2"
	"time"
)

// The bursts: every burstCycle begins with burstOn at burstPeak times the
// stage's mean rate, and the rest of the cycle runs at the rate that keeps
// the mean (0.36x for these figures). Poisson arrivals at a steady rate
// keep a router's queues near their mean; bursts like these fill them and
// let them drain, which is where a router's reading of the load shows.
const (
	burstCycle = 5 * time.Second
	burstOn    = 1500 * time.Millisecond
	burstPeak  = 2.5
)

// arrivalTrace returns n arrivals at mean rate (requests per second) as a
// trace inference-perf's trace_replay load replays: Azure's public LLM
// inference trace format (timestamp, context tokens, generated tokens),
// whose token columns the shared_prefix generator ignores. The arrivals are
// a Poisson process, steady, or bursty with an intensity that steps between
// the burst and the lull, drawn from seed, so every arm sees the same
// trace. inference-perf's own Poisson load draws from an unseeded
// generator: at 24 req/s one arm's stage took 13.3 s to send what
// another's took 15.6 s to, and output tokens/s followed the sending, not
// the router.
func arrivalTrace(rate float64, n int, seed uint64, bursty bool) []byte {
	on, cycle := burstOn.Seconds(), burstCycle.Seconds()
	peak := burstPeak * rate
	lull := (cycle*rate - on*peak) / (cycle - on)
	intensity := func(t float64) (float64, float64) { // the rate at t, and when it next changes
		if !bursty {
			return rate, math.Inf(1)
		}
		c := t - cycle*float64(int(t/cycle))
		base := t - c
		if c < on {
			return peak, base + on
		}
		return lull, base + cycle
	}
	rng := rand.New(rand.NewPCG(seed, 0x6b76726f757465))
	epoch := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var b bytes.Buffer
	b.WriteString("TIMESTAMP,ContextTokens,GeneratedTokens\n")
	t := 0.0
	for range n {
		// Spend one unit-rate exponential draw of integrated intensity.
		need := rng.ExpFloat64()
		for {
			r, end := intensity(t)
			if have := r * (end - t); have < need {
				need -= have
				t = end
				continue
			}
			t += need / r
			break
		}
		b.WriteString(epoch.Add(time.Duration(t * float64(time.Second))).Format("2006-01-02 15:04:05.000000"))
		b.WriteString(",1,1\n")
	}
	return b.Bytes()
}

// traceSeed is the trace's seed for stage i (-1: the warm-up): the same
// for every arm.
func (w *Workload) traceSeed(i int) uint64 { return w.seed() + uint64(i) }

// traceRequests is how many requests inference-perf sends in a stage of
// rate and seconds: it sends int(rate × duration) and takes their times
// from the trace.
func traceRequests(rate float64, seconds int) int { return int(rate * float64(seconds)) }
