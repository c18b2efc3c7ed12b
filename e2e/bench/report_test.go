package bench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ladder builds an arm's stages at the given rates and TTFT p90s (p99 is
// twice the p90), with its knee as the bench computes it.
func ladder(name string, rates, p90s []float64) ArmResult {
	a := ArmResult{Name: name, Valid: true}
	for i, r := range rates {
		a.Stages = append(a.Stages, Stage{Label: strconv.FormatFloat(r, 'f', -1, 64) + " req/s", Rate: r,
			Requests: 100, SuccessRate: 1, OutputTPS: 100 * r, TTFT: dist{P90: p90s[i], P99: 2 * p90s[i]}})
	}
	a.Knee = knee(&Workload{SLO: 2 * time.Second}, a.Stages)
	return a
}

func TestTargets(t *testing.T) {
	rates := []float64{8, 16, 24, 32, 40}
	s := &Summary{Workloads: []WorkloadResult{
		{Name: "b2b-saas", SLOSeconds: 2, Arms: []ArmResult{
			ladder("envoy-round-robin", rates[:1], []float64{12}),
			ladder(headlineArm, rates, []float64{0.3, 0.1, 0.1, 0.5, 0.7}),
			ladder("sglang-router", rates, []float64{0.2, 0.1, 0.1, 0.1, 3}),
			ladder("oracle", rates, []float64{0.1, 0.1, 0.1, 0.1, 0.2}),
		}},
		{Name: "hot-prefix", SLOSeconds: 2, Arms: []ArmResult{
			ladder(headlineArm, rates, []float64{0.1, 0.2, 0.3, 0.4, 5}),
			ladder("kvroute-sticky", rates[:3], []float64{0.3, 3, 12}),
		}},
	}}
	var b strings.Builder
	targets(&b, s)
	report := b.String()
	for _, want := range []string{
		// Round robin has no knee: its knee is below 8 req/s, so 40 is
		// more than 5x it, a bound, not infinity.
		"**met**: b2b-saas knee at least 3x round robin's with TTFT p90 no worse at every rate: more than 5.00x",
		"**met**: b2b-saas knee at least 1.2x sglang-router's: 1.25x",
		"**met**: b2b-saas knee within 10% of the oracle's: 1.00x",
		// Sticky stopped after 24 req/s: compared there, not at kvroute's
		// 40 (5 s p90) against sticky's 24.
		"**met**: hot-prefix TTFT p99 at most half of always-sticky's at 24 req/s, the highest rate both ran: 0.60 s against 24.00 s",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("targets lack %q:\n%s", want, report)
		}
	}

	var h strings.Builder
	headline(&h, &s.Workloads[0])
	if !strings.Contains(h.String(), "| envoy-round-robin | below the first stage |  | > 5.00x |") {
		t.Errorf("headline does not bound round robin's ratio:\n%s", h.String())
	}
}

// withGoodput sets an arm's goodput per stage.
func withGoodput(a ArmResult, goodput ...float64) ArmResult {
	for i, g := range goodput {
		a.Stages[i].Goodput = g
	}
	return a
}

func TestTargetsPolicy(t *testing.T) {
	rates := []float64{8, 16, 24}
	b2b := ladder(headlineArm, rates, []float64{0.1, 0.2, 3})
	for i, med := range []float64{0.08, 0.12, 0.4} { // the third stage is past the knee
		b2b.Stages[i].PredictionError = &PredictionError{Requests: 100, Median: med}
	}
	s := &Summary{Workloads: []WorkloadResult{
		{Name: "b2b-saas", SLOSeconds: 2, Arms: []ArmResult{b2b}},
		{Name: "mixed", SLOSeconds: 2, Goodput: map[string]float64{"ttft": 2, "tpot": 0.05}, Arms: []ArmResult{
			withGoodput(ladder(headlineArm, rates, []float64{0.1, 0.2, 3}), 7, 14, 12),
			withGoodput(ladder("kvroute-prefill", rates, []float64{0.1, 0.2, 3}), 7, 14.5, 10),
			withGoodput(ladder("kvroute-decode", rates, []float64{0.1, 0.2, 3}), 7, 9, 3),
			withGoodput(ladder("kvroute-slo", rates, []float64{0.1, 0.2, 3}), 7, 13.5, 11),
		}},
		{Name: "shared-30", Family: sharedFamily, SLOSeconds: 2, Arms: []ArmResult{
			ladder(headlineArm, rates, []float64{0.1, 0.2, 3}),
			ladder("sglang-router", rates, []float64{0.1, 3, 9}),
			ladder("vllm-router", rates, []float64{0.1, 0.2, 0.3}),
		}},
	}}
	var b strings.Builder
	targets(&b, s)
	report := b.String()
	for _, want := range []string{
		"**met**: b2b-saas TTFT prediction median absolute error under 15% at every stage up to the knee: 8%, 12%",
		"**missed**: mixed: auto's peak goodput above kvroute-prefill's: 14.0 req/s (at 16 req/s) against 14.5 (at 16 req/s) (within 5%: a tie)",
		"**met**: mixed: auto's peak goodput above kvroute-decode's: 14.0 req/s (at 16 req/s) against 9.0 (at 16 req/s)",
		"**met**: mixed: stating the goodput SLO costs no goodput (within 5%): 13.5 req/s (at 16 req/s) against 14.0 (at 16 req/s) without it",
		// The best rival is vllm-router, whose knee is 24.
		"**missed**: shared-30 knee at or above the best rival's: 16 req/s against vllm-router's 24 req/s",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("targets lack %q:\n%s", want, report)
		}
	}
	md := markdown(s)
	for _, want := range []string{
		"| shared-30 | 16 req/s (2400 at 24 req/s) | 8 req/s (2400 at 24 req/s) | 24 req/s (2400 at 24 req/s) |",
		"Goodput: requests/s meeting TPOT <= 50 ms and TTFT <= 2 s",
		"| kvroute-precise | 8%, 0% | 12%, 0% | 40%, 0% |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}

func TestRender(t *testing.T) {
	dir := t.TempDir()
	s := &Summary{Command: "go run ./e2e/cmd/bench -test", Workloads: []WorkloadResult{{Name: "b2b-saas", SLOSeconds: 2,
		Arms: []ArmResult{ladder(headlineArm, []float64{8, 16}, []float64{0.2, 0.4})}}}}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Render(dir); err != nil {
		t.Fatal(err)
	}
	report, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(report), "`go run ./e2e/cmd/bench -test`") || !strings.Contains(string(report), "| kvroute-precise | 16 req/s | 1600 |") {
		t.Errorf("rendered report lacks the run's command or knee:\n%s", report)
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Render(dir); err == nil || !strings.Contains(err.Error(), "summary.json") {
		t.Errorf("Render of a corrupt summary: %v, want an error naming the file", err)
	}
}

func TestMerge(t *testing.T) {
	engines := EngineConfig{Count: 4, GPUBlocks: 4096, TimeScale: 1, Accelerator: "a100"}
	old := ladder(headlineArm, []float64{8, 16}, []float64{0.2, 3})
	s := &Summary{Command: "first", Engines: engines, StageSeconds: 15, Workloads: []WorkloadResult{{Name: "b2b-saas", SLOSeconds: 2,
		Arms: []ArmResult{ladder("envoy-round-robin", []float64{8}, []float64{9}), old}}}}
	rerun := ladder(headlineArm, []float64{8, 16}, []float64{0.2, 0.3})
	s.FilterCost = &FilterCost{Rounds: 5}
	src := &Summary{Command: "second", Engines: engines, StageSeconds: 15, FilterCost: &FilterCost{Rounds: 7}, Workloads: []WorkloadResult{
		{Name: "b2b-saas", SLOSeconds: 2, Arms: []ArmResult{rerun}},
		{Name: "hot-prefix", SLOSeconds: 2, Arms: []ArmResult{ladder("kvroute-sticky", []float64{4}, []float64{1})}},
	}}
	if err := s.Merge(src); err != nil {
		t.Fatal(err)
	}
	b2b := s.Workloads[0]
	if len(b2b.Arms) != 2 || b2b.Arms[0].Name != "envoy-round-robin" || b2b.Arms[1].Knee == nil || b2b.Arms[1].Knee.Load != 16 {
		t.Errorf("b2b-saas after the merge: %+v; want round robin kept and kvroute's arm replaced (knee 16)", b2b.Arms)
	}
	if len(s.Workloads) != 2 || s.Workloads[1].Name != "hot-prefix" || len(s.Workloads[1].Arms) != 1 {
		t.Errorf("workloads after the merge: %+v; want hot-prefix added", s.Workloads)
	}
	if len(s.Reruns) != 1 || s.Reruns[0].Command != "second" || !slices.Equal(s.Reruns[0].Arms, []string{"b2b-saas/" + headlineArm, "hot-prefix/kvroute-sticky", "filter-cost"}) {
		t.Errorf("reruns %+v", s.Reruns)
	}
	if s.FilterCost == nil || s.FilterCost.Rounds != 7 {
		t.Errorf("filter cost after the merge: %+v; want the later run's (7 rounds)", s.FilterCost)
	}
	if !strings.Contains(markdown(s), "Re-run 0001-01-01 00:00 UTC by `second`") {
		t.Errorf("the report does not say which arms were re-run:\n%s", markdown(s))
	}
	without := *src
	without.FilterCost = nil
	if err := s.Merge(&without); err != nil || s.FilterCost == nil || s.FilterCost.Rounds != 7 {
		t.Errorf("a run without a filter cost merged: %v, filter cost %+v; want the earlier one kept", err, s.FilterCost)
	}
	other := *src
	other.Engines.Accelerator = "h100"
	if err := s.Merge(&other); err == nil {
		t.Error("merged a run on other engines")
	}
}

func TestOutputSpread(t *testing.T) {
	for _, tc := range []struct {
		per  []int
		want string
	}{
		{nil, ""},
		{[]int{0, 0}, "0/0"},
		{[]int{100, 100, 100, 100}, "100/100/100/100, +0%"},
		{[]int{29192, 30346, 29900, 32308}, "29192/30346/29900/32308, +6%"},
	} {
		if got := outputSpread(&Stage{OutputPerEngine: tc.per}); got != tc.want {
			t.Errorf("outputSpread(%v) = %q, want %q", tc.per, got, tc.want)
		}
	}
}

// An older summary has no output tokens per engine: its report gains no
// empty table, and a newer one shows each stage's.
func TestRenderOutputPerEngine(t *testing.T) {
	const title = "Output tokens per engine"
	for _, per := range [][]int{nil, {900, 1100}} {
		a := ladder(headlineArm, []float64{8}, []float64{0.2})
		a.Stages[0].OutputPerEngine = per
		var b strings.Builder
		workloadSection(&b, &WorkloadResult{Name: "b2b-saas", SLOSeconds: 2, Arms: []ArmResult{a}})
		got := b.String()
		if has := strings.Contains(got, title); has != (per != nil) {
			t.Errorf("with %v per engine, the report has the table: %v\n%s", per, has, got)
		}
		if per != nil && !strings.Contains(got, "| kvroute-precise | 900/1100, +10% |") {
			t.Errorf("the table lacks the stage's spread:\n%s", got)
		}
	}
}

// A summary from before the engines' TTFT was read gains no empty table; a
// newer one shows the client's and the engines' means and the cores by
// process, by name.
func TestRenderWhereTTFTWent(t *testing.T) {
	const title = "Where TTFT went"
	for _, engine := range []float64{0, 0.13} {
		a := ladder(headlineArm, []float64{8}, []float64{0.2})
		a.Stages[0].TTFT.Mean, a.Stages[0].EngineTTFT = 0.15, engine
		a.Stages[0].CPU = map[string]float64{"envoy": 0.4, "bench": 0.61}
		var b strings.Builder
		workloadSection(&b, &WorkloadResult{Name: "b2b-saas", SLOSeconds: 2, Arms: []ArmResult{a}})
		got := b.String()
		if has := strings.Contains(got, title); has != (engine > 0) {
			t.Errorf("with the engines' mean %v, the report has the table: %v\n%s", engine, has, got)
		}
		if engine > 0 && !strings.Contains(got, "| kvroute-precise | 0.150 / 0.130; bench 0.61, envoy 0.40 |") {
			t.Errorf("the table lacks the stage's figures:\n%s", got)
		}
	}
}

// TestMarkdownFilterCostAlone: a run of the filter's cost alone reports it
// without describing engines it never started.
func TestMarkdownFilterCostAlone(t *testing.T) {
	s := &Summary{Command: "cost", FilterCost: &FilterCost{Rounds: 5, PerRound: 400, Sizes: []SizeCost{{Bytes: 16 << 10,
		AddedP50: map[string]float64{gwKvroute: 120, gwFloor: 30}, AddedP99: map[string]float64{gwKvroute: 300, gwFloor: 40},
		P50: map[string]float64{gwNone: 300, gwFloor: 330, gwKvroute: 420}, P99: map[string]float64{gwNone: 600, gwFloor: 640, gwKvroute: 900},
		RPS: map[string]float64{gwNone: 8000, gwFloor: 7000, gwKvroute: 4000}}}}}
	md := markdown(s)
	if strings.Contains(md, "simulated engines") {
		t.Errorf("a filter-cost run describes engines:\n%s", md)
	}
	if !strings.Contains(md, "| 16 KiB |") || !strings.Contains(md, "filter added p50 under 100 µs at 16 KiB: 120 µs") {
		t.Errorf("the filter's cost is missing:\n%s", md)
	}
}
