// Package bench measures routing quality side by side: the same simulated
// engines (fresh for every arm), the same seeded workloads, driven by
// inference-perf (the client llm-d publishes with), in front of Envoy's
// own policies, kvroute's variants, the rival routers and an oracle. It
// writes a markdown report, a machine-readable summary and plots.
//
// The engines are e2e/vllmsim engines in this process; every run checks
// that their simulated clocks kept their time scale, and marks an arm whose
// engines fell behind as invalid instead of reporting it.
package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Options configure a run.
type Options struct {
	Out       string // results directory
	Workloads []*Workload
	// Arms per workload name; "*" is the default for the others.
	Arms         map[string][]*Arm
	Engines      EngineConfig
	StageSeconds int
	Client       InferencePerf
	Tools        Tools
	// MaxLag is the largest clock lag an arm may show and still count.
	MaxLag float64
	// Versions are recorded in the summary (tool name -> version).
	Versions map[string]string
	// Command is the command line that made the run.
	Command string
	Log     io.Writer
	// FilterCost, when set, measures the filter's own cost first.
	FilterCost *FilterCostOptions
}

// Summary is summary.json.
type Summary struct {
	Generated    time.Time         `json:"generated"`
	Command      string            `json:"command"`
	Machine      string            `json:"machine"`
	Versions     map[string]string `json:"versions"`
	Engines      EngineConfig      `json:"engines"`
	StageSeconds int               `json:"stage_seconds"`
	MaxLag       float64           `json:"max_lag"`
	FilterCost   *FilterCost       `json:"filter_cost,omitempty"`
	Workloads    []WorkloadResult  `json:"workloads"`
	// Reruns are later runs whose arms replaced this run's (Merge).
	Reruns []Rerun `json:"reruns,omitempty"`
}

// Rerun records a run merged into a summary.
type Rerun struct {
	Generated time.Time `json:"generated"`
	Command   string    `json:"command"`
	Arms      []string  `json:"arms"` // workload/arm, and "filter-cost" for the filter's cost
}

// Merge puts src's arms into s, replacing the arms of the same workload and
// name, and records src's run. Every arm starts on fresh engines with the
// same workload and seed, so arms of two runs compare as arms of one do;
// both runs must have used the same engines and stages. src's filter cost,
// if it measured one, replaces s's: it is measured apart from the engines.
func (s *Summary) Merge(src *Summary) error {
	if src.Engines != s.Engines || src.StageSeconds != s.StageSeconds {
		return fmt.Errorf("bench: cannot merge a run of engines %+v and %d s stages into one of %+v and %d s",
			src.Engines, src.StageSeconds, s.Engines, s.StageSeconds)
	}
	r := Rerun{Generated: src.Generated, Command: src.Command}
	for _, w := range src.Workloads {
		i := slices.IndexFunc(s.Workloads, func(d WorkloadResult) bool { return d.Name == w.Name })
		if i < 0 {
			s.Workloads = append(s.Workloads, w)
			s.Workloads[len(s.Workloads)-1].Arms = nil
			i = len(s.Workloads) - 1
		}
		dst := &s.Workloads[i]
		for _, a := range w.Arms {
			r.Arms = append(r.Arms, w.Name+"/"+a.Name)
			if j := slices.IndexFunc(dst.Arms, func(d ArmResult) bool { return d.Name == a.Name }); j >= 0 {
				dst.Arms[j] = a
			} else {
				dst.Arms = append(dst.Arms, a)
			}
		}
	}
	if src.FilterCost != nil {
		s.FilterCost = src.FilterCost
		r.Arms = append(r.Arms, "filter-cost")
	}
	s.Reruns = append(s.Reruns, r)
	return nil
}

// WorkloadResult is one workload's arms.
type WorkloadResult struct {
	Name        string  `json:"name"`
	Description string  `json:"description"`
	Scaling     string  `json:"scaling"`
	SLOSeconds  float64 `json:"slo_ttft_p90_seconds"`
	// Warmup describes the unreported first stage, "" if none.
	Warmup string `json:"warmup,omitempty"`
	// Goodput is the per-request SLO goodput counts against (seconds by
	// inference-perf's keys), Family the sweep the workload is a point of.
	Goodput map[string]float64 `json:"goodput_slo_seconds,omitempty"`
	Family  string             `json:"family,omitempty"`
	// Reference is the kvroute arm the targets are checked on, "" for
	// kvroute-precise; Engines the real engines' command line, "" for
	// simulated ones.
	Reference string      `json:"reference_arm,omitempty"`
	Engines   string      `json:"engines,omitempty"`
	Arms      []ArmResult `json:"arms"`
}

// saturated is how many times the SLO a stage's TTFT p90 may reach before
// the arm's ladder stops.
const saturated = 5

// ArmResult is one arm on one workload.
type ArmResult struct {
	Name    string   `json:"name"`
	About   string   `json:"about"`
	Command []string `json:"command"`
	// Valid is false when the engines fell behind their time scale (Lag
	// past Options.MaxLag) or the run failed (Error).
	Valid  bool    `json:"valid"`
	Lag    float64 `json:"lag"`
	Error  string  `json:"error,omitempty"`
	Stages []Stage `json:"stages"`
	// Stopped names the first stage not run because the arm had clearly
	// saturated; "" if the whole ladder ran.
	Stopped   string           `json:"stopped_before,omitempty"`
	Knee      *Knee            `json:"knee"`
	HitRate   float64          `json:"hit_rate"`
	Decisions map[string]int64 `json:"decisions,omitempty"`
	Wall      float64          `json:"wall_seconds"`
	// Engines is how its first real engine was started; nil for
	// simulated ones.
	Engines []string `json:"engines,omitempty"`
}

// Stage is one load stage's figures.
type Stage struct {
	Label       string  `json:"label"`
	Rate        float64 `json:"rate,omitempty"`
	Concurrency int     `json:"concurrency,omitempty"`
	Achieved    float64 `json:"achieved_rate"`
	// SendDelay is how late the client sent the stage's requests against
	// their arrival times (inference-perf's schedule delay): a request the
	// client holds back waits in no queue TTFT sees.
	SendDelay dist `json:"send_delay_seconds"`
	// Paced says the client sends a request only once an earlier one is
	// answered: a closed loop, or a conversation's next turn. Such a
	// stage's send delay is the workload's, not the client's falling
	// behind.
	Paced       bool    `json:"paced_by_answers,omitempty"`
	Requests    int     `json:"requests"`
	Failures    int     `json:"failures"`
	SuccessRate float64 `json:"success_rate"`
	OutputTPS   float64 `json:"output_tokens_per_second"`
	InputTPS    float64 `json:"input_tokens_per_second"`
	TTFT        dist    `json:"ttft_seconds"`
	ITL         dist    `json:"itl_seconds"`
	Latency     dist    `json:"request_latency_seconds"`
	// From the engines' own metrics over the stage.
	HitRate   float64 `json:"prefix_hit_rate"`
	PerEngine []int   `json:"requests_per_engine"`
	// PrefilledPerEngine is the prompt tokens each engine computed (not
	// served from its cache).
	PrefilledPerEngine []int `json:"prompt_tokens_prefilled_per_engine,omitempty"`
	// OutputPerEngine is the output tokens each engine generated. With the
	// requests spread evenly, the engine with the most to decode answers
	// last, and inference-perf divides a stage's tokens by the span to its
	// last answer.
	OutputPerEngine []int   `json:"output_tokens_per_engine,omitempty"`
	Prefilled       float64 `json:"prompt_tokens_prefilled"`
	Preemptions     float64 `json:"preemptions"`
	// Goodput is the requests per second meeting the workload's goodput
	// SLOs, GoodShare their share of the answered requests (inference-perf's
	// goodput report); both 0 without Workload.Goodput.
	Goodput   float64 `json:"request_goodput,omitempty"`
	GoodShare float64 `json:"goodput_share,omitempty"`
	// PredictionError is cachesync's TTFT prediction error over the
	// stage's routed requests (kvroute arms).
	PredictionError *PredictionError `json:"ttft_prediction_error,omitempty"`
	// EngineTTFT is the engines' own mean TTFT over the stage, from a
	// request's arrival at its engine (simulated engines only). Against
	// the client's mean (TTFT.Mean) it splits TTFT into the engines'
	// queueing and prefill, which routing decides, and the path: router,
	// client and the host they share.
	EngineTTFT float64 `json:"engine_ttft_mean_seconds,omitempty"`
	// CPU is the cores each process used on average over the stage:
	// "bench" is the simulated engines' process, the others the router,
	// cachesync and the client (sampleCPU).
	CPU map[string]float64 `json:"cpu_cores,omitempty"`
}

// lateSend is how late the client may send a tenth of a stage's requests
// before the stage measures the client rather than the arm: a sliver of
// the 2 s SLOs, and twenty times what it shows when it keeps up (5-7 ms
// at 72 req/s).
const lateSend = 100 * time.Millisecond

// sentLate reports whether the client sent the stage's requests late:
// held back, they queued where TTFT does not count them. Paced stages hold
// requests back by design: a multi-turn stage's next turns wait for their
// answers (1.8 s at p90 at 8 req/s).
func (s *Stage) sentLate() bool {
	return s.Concurrency == 0 && !s.Paced && s.SendDelay.P90 > lateSend.Seconds()
}

// load is the stage's offered load: its Poisson rate, or its concurrency
// on a closed-loop ladder.
func (s *Stage) load() float64 {
	if s.Concurrency > 0 {
		return float64(s.Concurrency)
	}
	return s.Rate
}

// Knee is the highest stage of the unbroken run from the bottom of the
// ladder whose TTFT p90 is within the SLO with every request answered.
type Knee struct {
	Stage     int     `json:"stage"`
	Label     string  `json:"label"`
	Load      float64 `json:"load"` // rate or concurrency
	OutputTPS float64 `json:"output_tokens_per_second"`
}

// Run runs every workload's arms, one after another, and writes the
// results under o.Out as it goes.
func Run(ctx context.Context, o Options) (*Summary, error) {
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	s := &Summary{
		Generated: time.Now().UTC(), Command: o.Command, Machine: machine(), Versions: o.Versions,
		Engines: o.Engines, StageSeconds: o.StageSeconds, MaxLag: o.MaxLag,
	}
	if o.FilterCost != nil {
		logf(o.Log, "== the filter's own cost")
		fc, err := MeasureFilterCost(ctx, *o.FilterCost)
		if err != nil {
			return s, err
		}
		s.FilterCost = fc
		if err := s.write(o.Out, WorkloadResult{}); err != nil {
			return s, err
		}
	}
	for _, w := range o.Workloads {
		wr := WorkloadResult{Name: w.Name, Description: w.Description, Scaling: w.Scaling, SLOSeconds: w.SLO.Seconds(), Goodput: w.Goodput, Family: w.Family,
			Reference: w.Reference}
		if w.warmups() > 0 {
			wr.Warmup = fmt.Sprintf("%d s at %g req/s", w.WarmupSeconds, w.WarmupRate)
		}
		arms := o.Arms[w.Name]
		if arms == nil {
			arms = o.Arms["*"]
		}
		for _, a := range arms {
			if ctx.Err() != nil {
				return s, ctx.Err()
			}
			logf(o.Log, "== %s / %s", w.Name, a.Name)
			r := runArm(ctx, o, w, a)
			if r.Error != "" {
				logf(o.Log, "   failed: %s", r.Error)
			} else {
				logf(o.Log, "   done in %.0f s, lag %.1f%%, knee %s", r.Wall, 100*r.Lag, kneeText(r.Knee))
			}
			wr.Arms = append(wr.Arms, r)
			if wr.Engines == "" && r.Engines != nil {
				wr.Engines = strings.Join(r.Engines, " ")
			}
			if err := s.write(o.Out, wr); err != nil {
				return s, err
			}
		}
		s.Workloads = append(s.Workloads, wr)
		if err := s.write(o.Out, WorkloadResult{}); err != nil {
			return s, err
		}
	}
	return s, nil
}

// Render rewrites the report and the plots in dir from its summary.json,
// after merging in the arms of each run in merge (their directories): a
// change to the report needs no new run, and arms re-run after a change
// replace their old figures.
func Render(dir string, merge ...string) error {
	s, err := readSummary(dir)
	if err != nil {
		return err
	}
	for _, m := range merge {
		src, err := readSummary(m)
		if err != nil {
			return err
		}
		if err := s.Merge(src); err != nil {
			return err
		}
	}
	return s.write(dir, WorkloadResult{})
}

func readSummary(dir string) (*Summary, error) {
	path := filepath.Join(dir, "summary.json")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s Summary
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("bench: %s: %w", path, err)
	}
	return &s, nil
}

// write saves summary.json, the report and the plots, with the workload in
// progress (if any) included.
func (s *Summary) write(dir string, current WorkloadResult) error {
	out := *s
	if current.Name != "" {
		out.Workloads = append(slices.Clone(s.Workloads), current)
	}
	b, err := json.MarshalIndent(out, "", " ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := writePlots(dir, &out); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "README.md"), []byte(markdown(&out)), 0o644)
}

func runArm(ctx context.Context, o Options, w *Workload, a *Arm) (r ArmResult) {
	r = ArmResult{Name: a.Name, About: a.About}
	start := time.Now()
	defer func() { r.Wall = time.Since(start).Seconds() }()
	dir := filepath.Join(o.Out, "runs", w.Name, a.Name)
	if err := os.RemoveAll(dir); err != nil {
		r.Error = err.Error()
		return r
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		r.Error = err.Error()
		return r
	}
	p, err := startPool(ctx, o.Engines, w.Engines, dir)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer p.close()
	r.Engines = p.command()
	tools := o.Tools
	tools.GoodputSLO = w.Goodput
	rt, err := a.start(ctx, &tools, p, dir)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer rt.stop()
	r.Command = rt.command
	if err := waitReady(ctx, rt.url+"/v1/models", 60*time.Second); err != nil {
		r.Error = err.Error()
		return r
	}

	p.resetLag()
	var hits, queries float64
	misses := 0
	for i := -w.warmups(); i < w.stages(); i++ {
		sdir := filepath.Join(dir, "warmup")
		if i >= 0 {
			sdir = filepath.Join(dir, "stage-"+strconv.Itoa(i))
		}
		var mu sync.Mutex
		var before, after []counters
		var predBefore, predAfter histogram
		var cpuBefore, cpuAfter *cpuSample
		var scrapeErr, predErr error
		onStage := func(ev stageEvent) {
			cpu := sampleCPU()
			snap, err := p.snapshot()
			var pred histogram
			var perr error
			if rt.cachesync != "" {
				pred, perr = scrapeHistogram(rt.cachesync, predictionMetric)
			}
			mu.Lock()
			defer mu.Unlock()
			predErr = cmp.Or(predErr, perr)
			switch {
			case err != nil:
				scrapeErr = err
			case ev.start:
				before, predBefore, cpuBefore = snap, pred, cpu
			default:
				after, predAfter, cpuAfter = snap, pred, cpu
			}
		}
		if _, err := o.Client.run(ctx, w, p.model(), rt.url, sdir, i, o.StageSeconds, onStage); err != nil {
			r.Error = err.Error()
			return r
		}
		if i < 0 {
			continue
		}
		rep, err := readStage(sdir)
		mu.Lock()
		if err == nil {
			err = scrapeErr
		}
		mu.Unlock()
		if err != nil {
			r.Error = err.Error()
			return r
		}
		st := stageOf(w, i, rep)
		if predErr != nil {
			logf(o.Log, "   no prediction error for %s: %v", st.Label, predErr)
		} else if rt.cachesync != "" {
			st.PredictionError = predAfter.since(predBefore).predictionError()
		}
		st.CPU = cpuAfter.coresSince(cpuBefore)
		if before != nil && after != nil {
			var sum counters
			for j := range after {
				d := after[j].minus(before[j])
				if p.real == nil {
					st.PerEngine = append(st.PerEngine, int(math.Round(d.success)))
				}
				st.PrefilledPerEngine = append(st.PrefilledPerEngine, int(math.Round(d.queries-d.hits)))
				st.OutputPerEngine = append(st.OutputPerEngine, int(math.Round(d.generation)))
				sum.hits += d.hits
				sum.queries += d.queries
				sum.prompt += d.prompt
				sum.preemptions += d.preemptions
				sum.ttftSum += d.ttftSum
				sum.ttftCount += d.ttftCount
			}
			if sum.ttftCount > 0 {
				st.EngineTTFT = sum.ttftSum / sum.ttftCount
			}
			if sum.queries > 0 {
				st.HitRate = sum.hits / sum.queries
			}
			st.Prefilled = sum.queries - sum.hits
			st.Preemptions = sum.preemptions
			hits += sum.hits
			queries += sum.queries
		}
		r.Stages = append(r.Stages, st)
		logf(o.Log, "   %s: %.0f output tok/s, TTFT p90 %.2f s", st.Label, st.OutputTPS, st.TTFT.P90)
		// Past the knee the client waits out ever longer queues: an arm
		// stops after two stages in a row beyond the SLO, or one far
		// beyond it.
		if st.TTFT.P90 > w.SLO.Seconds() || st.SuccessRate < 0.99 {
			misses++
		} else {
			misses = 0
		}
		if i+1 < w.stages() && (misses >= 2 || st.TTFT.P90 > saturated*w.SLO.Seconds()) {
			r.Stopped = w.stageLabel(i + 1)
			logf(o.Log, "   saturated: the ladder stops before %s", r.Stopped)
			break
		}
	}
	r.Lag = p.lag()
	if rt.decisions != nil {
		r.Decisions = rt.decisions()
	}
	if queries > 0 {
		r.HitRate = hits / queries
	}
	r.Knee = knee(w, r.Stages)
	r.Valid = r.Lag <= o.MaxLag
	if !r.Valid {
		r.Error = fmt.Sprintf("the engines fell %.1f%% behind their time scale (limit %.1f%%): not reported", 100*r.Lag, 100*o.MaxLag)
	}
	return r
}

func stageOf(w *Workload, i int, rep *stageReport) Stage {
	s := rep.Successes
	st := Stage{
		Label: w.stageLabel(i), Achieved: rep.Load.AchievedRate, SendDelay: rep.Load.ScheduleDelay,
		Requests: s.Count + rep.Failures.Count, Failures: rep.Failures.Count,
		OutputTPS: s.Throughput.Output, InputTPS: s.Throughput.Input,
		TTFT: s.Latency.TimeToFirstToken, ITL: s.Latency.InterTokenLatency, Latency: s.Latency.RequestLatency,
	}
	if w.Concurrency != nil {
		st.Concurrency = w.Concurrency[i]
	} else {
		st.Rate = w.Rates[i]
	}
	st.Paced = w.Concurrency != nil || w.SessionHeader != ""
	if st.Requests > 0 {
		st.SuccessRate = float64(s.Count) / float64(st.Requests)
	}
	if g := s.Goodput; g != nil {
		st.Goodput, st.GoodShare = g.Requests, g.Percentage/100
	}
	return st
}

// knee is the last stage of the ladder's unbroken run from the bottom
// within the SLO: a stage that recovers after one that missed does not
// count, since the arm did not hold the lower load. Nor does a stage the
// client sent late: what it measured is the client.
func knee(w *Workload, stages []Stage) *Knee {
	var k *Knee
	for i, s := range stages {
		if s.Requests == 0 || s.SuccessRate < 0.99 || s.TTFT.P90 > w.SLO.Seconds() || s.sentLate() {
			break
		}
		k = &Knee{Stage: i, Label: s.Label, Load: s.load(), OutputTPS: s.OutputTPS}
	}
	return k
}

func kneeText(k *Knee) string {
	if k == nil {
		return "none (no stage within the SLO)"
	}
	return fmt.Sprintf("%s, %.0f output tok/s", k.Label, k.OutputTPS)
}

// resetLag restarts the lag measurement: the time spent starting the
// router is not the engines' to keep up with.
func (p *pool) resetLag() {
	p.start = time.Now()
	for i, e := range p.engines {
		p.sim0[i] = e.SimTime()
	}
}

func machine() string {
	model := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if name, ok := strings.CutPrefix(line, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(name), ":"))
				break
			}
		}
	}
	return fmt.Sprintf("%d CPUs (%s), %s/%s, %s", runtime.NumCPU(), model, runtime.GOOS, runtime.GOARCH, runtime.Version())
}

func logf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
}

// ErrNoArms is returned for a selection that leaves nothing to run.
var ErrNoArms = errors.New("bench: no arms selected")
