package bench

import (
	"testing"
	"time"
)

func TestKnee(t *testing.T) {
	w := &Workload{SLO: 2 * time.Second}
	stage := func(rate, p90, success float64) Stage {
		return Stage{Rate: rate, Requests: 100, SuccessRate: success, TTFT: dist{P90: p90}, OutputTPS: 10 * rate}
	}
	late := func(s Stage, p90 float64) Stage { s.SendDelay.P90 = p90; return s }
	closed := func(s Stage) Stage { s.Concurrency, s.Rate = int(s.Rate), 0; return s }
	paced := func(s Stage) Stage { s.Paced = true; return s }
	for _, tt := range []struct {
		name   string
		stages []Stage
		want   float64 // 0: none
	}{
		{"all within", []Stage{stage(4, 0.1, 1), stage(8, 0.5, 1), stage(16, 1.9, 1)}, 16},
		{"the last misses", []Stage{stage(4, 0.1, 1), stage(8, 0.5, 1), stage(16, 2.5, 1)}, 8},
		{"a recovery after a miss does not count", []Stage{stage(4, 0.1, 1), stage(8, 3, 1), stage(16, 0.2, 1)}, 4},
		{"failures count as a miss", []Stage{stage(4, 0.1, 1), stage(8, 0.1, 0.95)}, 4},
		{"the first misses", []Stage{stage(4, 2.1, 1), stage(8, 0.1, 1)}, 0},
		{"a stage the client sent late does not count", []Stage{stage(4, 0.1, 1), late(stage(8, 0.1, 1), 0.5)}, 4},
		{"a client on time counts", []Stage{stage(4, 0.1, 1), late(stage(8, 0.1, 1), 0.005)}, 8},
		{"a closed loop holds requests by design", []Stage{closed(late(stage(4, 0.1, 1), 3))}, 4},
		{"so do a conversation's turns", []Stage{paced(late(stage(4, 0.1, 1), 1.8)), paced(late(stage(8, 0.8, 1), 1.8))}, 8},
	} {
		t.Run(tt.name, func(t *testing.T) {
			k := knee(w, tt.stages)
			switch {
			case tt.want == 0 && k != nil:
				t.Errorf("knee %+v, want none", k)
			case tt.want != 0 && (k == nil || k.Load != tt.want || k.OutputTPS != 10*tt.want):
				t.Errorf("knee %+v, want %v req/s", k, tt.want)
			}
		})
	}
}

// TestPaced checks which workloads' stages send only as answers come: the
// closed loops and the conversations, not the Poisson ladders.
func TestPaced(t *testing.T) {
	for _, tt := range []struct {
		workload string
		want     bool
	}{{"b2b-saas", false}, {"mixed", false}, {"multi-turn", true}, {"code-gen", true}} {
		w, err := WorkloadByName(tt.workload)
		if err != nil {
			t.Fatal(err)
		}
		if got := stageOf(w, 0, &stageReport{}).Paced; got != tt.want {
			t.Errorf("%s: paced %v, want %v", tt.workload, got, tt.want)
		}
	}
}
