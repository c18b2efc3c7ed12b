package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"time"
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

// clockTicks is USER_HZ, in which /proc/PID/stat counts CPU time: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// sampleCPU reads /proc. A process that exits before the second of two
// samples takes its time with it, and its group reads low; the router and
// cachesync live for a whole arm, and a stage's client from before its
// start to after its end. Off Linux it returns nil.
func sampleCPU() *cpuSample {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	type proc struct {
		ppid int
		comm string
		cpu  float64
	}
	procs := map[int]proc{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ... utime stime: comm may hold spaces and
		// parentheses, so the fields are counted from the last ')'.
		open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
		if open < 0 || end < open {
			continue
		}
		f := bytes.Fields(b[end+1:])
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(string(f[1]))
		utime, _ := strconv.ParseFloat(string(f[11]), 64)
		stime, _ := strconv.ParseFloat(string(f[12]), 64)
		procs[pid] = proc{ppid: ppid, comm: string(b[open+1 : end]), cpu: (utime + stime) / clockTicks}
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
