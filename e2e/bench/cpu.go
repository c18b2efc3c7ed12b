package bench

import (
	"os"
	"time"

	"github.com/prometheus/procfs"
)

// cpuSample is the CPU time the bench's process tree had used by a moment,
// by process group: "bench" for this process (the simulated engines run in
// it), and for each child (the router, cachesync, the client) the child's
// command name, counting its own descendants in (func-e's Envoy, the
// client's worker processes). On a shared host the arms differ in what
// they take from the engines and the client: a router that burns more CPU
// slows the other two, and that shows in TTFT though no routing choice
// differed.
type cpuSample struct {
	at   time.Time
	used map[string]float64 // seconds of CPU, user and system
}

// sampleCPU reads /proc. A process that exits before the second of two
// samples takes its time with it, and its group reads low; the router and
// cachesync live for a whole arm, and a stage's client from before its
// start to after its end. Off Linux it returns nil.
func sampleCPU() *cpuSample {
	all, err := procfs.AllProcs()
	if err != nil {
		return nil
	}
	type proc struct {
		ppid int
		comm string
		cpu  float64
	}
	procs := make(map[int]proc, len(all))
	for _, p := range all {
		st, err := p.Stat()
		if err != nil {
			continue // exited meanwhile
		}
		procs[p.PID] = proc{ppid: st.PPID, comm: st.Comm, cpu: st.CPUTime()}
	}
	self := os.Getpid()
	s := &cpuSample{at: time.Now(), used: map[string]float64{}}
	for pid, p := range procs {
		// Walk up to this process's child: that child names the group.
		group, cur := "", pid
		for depth := 0; cur != self && depth < 64; depth++ {
			q, ok := procs[cur]
			if !ok {
				break
			}
			if q.ppid == self {
				group = q.comm
				break
			}
			cur = q.ppid
		}
		switch {
		case pid == self:
			s.used["bench"] += p.cpu
		case group != "":
			s.used[group] += p.cpu
		}
	}
	return s
}

// coresSince is the cores each group used on average from o to s.
func (s *cpuSample) coresSince(o *cpuSample) map[string]float64 {
	if s == nil || o == nil {
		return nil
	}
	wall := s.at.Sub(o.at).Seconds()
	if wall <= 0 {
		return nil
	}
	out := map[string]float64{}
	for g, v := range s.used {
		if d := v - o.used[g]; d > 0 {
			out[g] = d / wall
		}
	}
	return out
}
