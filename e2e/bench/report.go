package bench

import (
	"cmp"
	"fmt"
	"image/color"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// headlineArm is the arm every ratio is taken against.
const headlineArm = "kvroute-precise"

func (w *WorkloadResult) arm(name string) *ArmResult {
	for i := range w.Arms {
		if w.Arms[i].Name == name && w.Arms[i].Valid {
			return &w.Arms[i]
		}
	}
	return nil
}

// markdown renders the report.
func markdown(s *Summary) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("# kvroute bench")
	p("")
	p("Generated %s by `%s` on %s.", s.Generated.Format("2006-01-02 15:04 UTC"), s.Command, s.Machine)
	for _, r := range s.Reruns {
		p("Re-run %s by `%s` (every arm starts on fresh engines with the same workload and seed, so it replaces its earlier figures): %s.",
			r.Generated.Format("2006-01-02 15:04 UTC"), r.Command, strings.Join(r.Arms, ", "))
	}
	if len(s.Workloads) > 0 { // a run of the filter's cost alone has no engines
		p("%d simulated engines (e2e/vllmsim: Qwen3-32B on two %s by its cost model) of %d KV blocks of 16 tokens, fresh for every arm,",
			s.Engines.Count, strings.ToUpper(cmp.Or(s.Engines.Accelerator, DefaultAccelerator))+"s", s.Engines.GPUBlocks)
		p("at time scale %g (wall seconds per simulated second; every time below is both); stages of %d s.", s.Engines.TimeScale, s.StageSeconds)
		p("An arm whose engines fell more than %.0f%% behind their clock is marked invalid and not reported.", 100*s.MaxLag)
	}
	var names []string
	for k := range s.Versions {
		names = append(names, k)
	}
	sort.Strings(names)
	var vs []string
	for _, k := range names {
		vs = append(vs, k+" "+s.Versions[k])
	}
	p("Versions: %s.", strings.Join(vs, ", "))
	p("")
	for _, w := range s.Workloads {
		if w.Name == "b2b-saas" {
			headline(&b, &w)
		}
	}
	targets(&b, s)
	if s.FilterCost != nil {
		filterCostSection(&b, s.FilterCost)
	}
	sweepSection(&b, s, sharedFamily)
	for i := range s.Workloads {
		workloadSection(&b, &s.Workloads[i])
	}
	return b.String()
}

func filterCostSection(b *strings.Builder, fc *FilterCost) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format+"\n", args...) }
	p("## The filter's own cost")
	p("")
	p("Real Envoy (2 workers) without a filter, with the floor module (e2e/bench/floor: pause the headers, read the body, set the header)")
	p("and with kvroute (the shipped envoy.yaml, local mode), in front of the same trivial upstreams. Latency: one request at a time on a")
	p("keep-alive connection, %d interleaved rounds of %d requests per gateway and size; added latency is the median over rounds of each", fc.Rounds, fc.PerRound)
	p("round's paired difference with no filter. Requests/s: %d clients in a closed loop.", fc.Concurrency)
	p("")
	p("| body | no filter p50 / p99 | floor added p50 / p99 | kvroute added p50 / p99 | requests/s: none / floor / kvroute |")
	p("|---|---|---|---|---|")
	for _, sc := range fc.Sizes {
		p("| %d KiB | %.0f / %.0f µs | %.0f / %.0f µs | %.0f / %.0f µs | %.0f / %.0f / %.0f |", sc.Bytes>>10,
			sc.P50[gwNone], sc.P99[gwNone], sc.AddedP50[gwFloor], sc.AddedP99[gwFloor], sc.AddedP50[gwKvroute], sc.AddedP99[gwKvroute],
			sc.RPS[gwNone], sc.RPS[gwFloor], sc.RPS[gwKvroute])
	}
	p("")
	if fc.HeapBytes > 0 {
		p("A kvroute worker VM's Go heap after the run: %.1f MiB.", float64(fc.HeapBytes)/(1<<20))
		p("")
	}
}

func headline(b *strings.Builder, w *WorkloadResult) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format+"\n", args...) }
	p("## Headline: b2b-saas")
	p("")
	p("The knee is the highest load up to which every stage's TTFT p90 stays within %.1f s with every request answered; throughput is output tokens/s there.", w.SLOSeconds)
	p("")
	p("| arm | knee | output tok/s at the knee | %s knee ratio | %s throughput ratio | prefix-cache hit |", headlineArm, headlineArm)
	p("|---|---|---|---|---|---|")
	ref := w.arm(headlineArm)
	for _, a := range w.Arms {
		if !a.Valid {
			p("| %s | invalid: %s | | | | |", a.Name, a.Error)
			continue
		}
		kr, tr := "", ""
		if ref != nil && a.Name != headlineArm {
			if r, bound := kneeRatio(ref, &a); r > 0 {
				kr = fmt.Sprintf("%.2fx", r)
				if bound {
					kr = "> " + kr
				}
			}
			if r := tputRatio(ref, &a); r > 0 {
				tr = fmt.Sprintf("%.2fx", r)
			}
		}
		p("| %s | %s | %s | %s | %s | %.1f%% |", a.Name, loadText(a.Knee), tpsText(a.Knee), kr, tr, 100*a.HitRate)
	}
	p("")
}

func loadText(k *Knee) string {
	if k == nil {
		return "below the first stage"
	}
	return k.Label
}

func tpsText(k *Knee) string {
	if k == nil {
		return ""
	}
	return strconv.Itoa(int(k.OutputTPS))
}

// targets checks the targets the bench is judged by and says, for each,
// whether it was met and with what figures.
func targets(b *strings.Builder, s *Summary) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format+"\n", args...) }
	var lines []string
	check := func(ok bool, format string, args ...any) {
		mark := "missed"
		if ok {
			mark = "met"
		}
		lines = append(lines, "- **"+mark+"**: "+fmt.Sprintf(format, args...))
	}
	if fc := s.FilterCost; fc != nil {
		for _, sc := range fc.Sizes {
			switch sc.Bytes {
			case 16 << 10:
				check(sc.AddedP50[gwKvroute] < 100, "filter added p50 under 100 µs at 16 KiB: %.0f µs", sc.AddedP50[gwKvroute])
			case 512 << 10:
				check(sc.AddedP50[gwKvroute] < 1000, "filter added p50 under 1 ms at 512 KiB: %.0f µs", sc.AddedP50[gwKvroute])
			}
		}
	}
	for i := range s.Workloads {
		w := &s.Workloads[i]
		ref := w.arm(cmp.Or(w.Reference, headlineArm))
		if ref == nil {
			continue
		}
		if w.Family == sharedFamily {
			best, bestName := 0.0, ""
			for _, rival := range []string{"sglang-router", "smg", "vllm-router", "vllm-router-kv"} {
				if a := w.arm(rival); a != nil && a.Knee != nil && a.Knee.Load > best {
					best, bestName = a.Knee.Load, rival
				}
			}
			if bestName != "" {
				check(ref.Knee != nil && ref.Knee.Load >= best, "%s knee at or above the best rival's: %s against %s's %s",
					w.Name, loadText(ref.Knee), bestName, loadText(w.arm(bestName).Knee))
			}
		}
		switch w.Name {
		case "mixed":
			// Peaks closer than goodputNoise are a tie, not a win: one arm's
			// stage moves by more between runs (kvroute precise's tokens/s
			// at 48 req/s on b2b-saas: 3,875 and 4,174).
			g, at := peakGoodput(ref)
			for _, other := range []string{"kvroute-prefill", "kvroute-decode", "envoy-least-request"} {
				if a := w.arm(other); a != nil {
					og, oat := peakGoodput(a)
					tie := ""
					if g <= og*(1+goodputNoise) && og <= g*(1+goodputNoise) {
						tie = fmt.Sprintf(" (within %.0f%%: a tie)", 100*goodputNoise)
					}
					check(g > og*(1+goodputNoise), "mixed: auto's peak goodput above %s's: %.1f req/s (at %s) against %.1f (at %s)%s", other, g, at, og, oat, tie)
				}
			}
			if a := w.arm("kvroute-slo"); a != nil {
				sg, sat := peakGoodput(a)
				check(sg >= g*(1-goodputNoise), "mixed: stating the goodput SLO costs no goodput (within %.0f%%): %.1f req/s (at %s) against %.1f (at %s) without it",
					100*goodputNoise, sg, sat, g, at)
			}
		case "b2b-saas":
			if rr := w.arm("envoy-round-robin"); rr != nil {
				ratio, bound := kneeRatio(ref, rr)
				check(ratio >= 3 && noWorseTTFT(ref, rr), "b2b-saas knee at least 3x round robin's with TTFT p90 no worse at every rate: %s (knees %s and %s)",
					ratioText(ratio, bound), loadText(ref.Knee), loadText(rr.Knee))
			}
			for _, rival := range []string{"sglang-router", "smg", "vllm-router", "vllm-router-kv"} {
				if a := w.arm(rival); a != nil {
					ratio, bound := kneeRatio(ref, a)
					if rival == "sglang-router" { // the policy issue's bar for the best rival
						check(ratio >= 1.2, "b2b-saas knee at least 1.2x sglang-router's: %s, throughput at the knee %s", ratioText(ratio, bound), ratioText(tputRatio(ref, a), false))
						continue
					}
					check(ratio > 1, "b2b-saas knee ahead of %s's: %s, throughput at the knee %s", rival, ratioText(ratio, bound), ratioText(tputRatio(ref, a), false))
				}
			}
			if o := w.arm("oracle"); o != nil {
				ratio, bound := kneeRatio(ref, o)
				check(ratio >= 0.9, "b2b-saas knee within 10%% of the oracle's: %s (knees %s and %s)", ratioText(ratio, bound), loadText(ref.Knee), loadText(o.Knee))
			}
			if top := len(ref.Stages) - 1; top >= 0 && len(ref.Stages[top].PerEngine) > 0 {
				pe := ref.Stages[top].PerEngine
				lo, hi := pe[0], pe[0]
				for _, n := range pe {
					lo, hi = min(lo, n), max(hi, n)
				}
				check(float64(hi) <= 1.2*float64(lo), "b2b-saas requests per engine within 20%% of each other at the top stage: %v", pe)
			}
			if ref.Knee != nil {
				// Steady load: the stages the arm held within the SLO.
				ok, seen := true, 0
				var meds []string
				for _, st := range ref.Stages[:ref.Knee.Stage+1] {
					if pe := st.PredictionError; pe != nil {
						seen++
						ok = ok && pe.Median < 0.15
						meds = append(meds, fmt.Sprintf("%.0f%%", 100*pe.Median))
					}
				}
				if seen > 0 {
					check(ok, "b2b-saas TTFT prediction median absolute error under 15%% at every stage up to the knee: %s", strings.Join(meds, ", "))
				}
			}
		case "hot-prefix":
			// At the highest rate both arms ran: an arm that stopped early
			// has no figure above it.
			if st := w.arm("kvroute-sticky"); st != nil {
				if top := min(len(ref.Stages), len(st.Stages)) - 1; top >= 0 {
					a, b := ref.Stages[top].TTFT.P99, st.Stages[top].TTFT.P99
					check(a <= b/2, "hot-prefix TTFT p99 at most half of always-sticky's at %s, the highest rate both ran: %.2f s against %.2f s",
						ref.Stages[top].Label, a, b)
				}
			}
		case realWorkload:
			if sg := w.arm("sglang-router"); sg != nil {
				worst, at := 1e9, ""
				for i := range min(len(ref.Stages), len(sg.Stages)) {
					if r := ref.Stages[i].OutputTPS / max(sg.Stages[i].OutputTPS, 1e-9); r < worst {
						worst, at = r, ref.Stages[i].Label
					}
				}
				check(worst >= 1, "%s (llama.cpp): %s's output tok/s at or above sglang-router's at every stage: worst ratio %.2f (%s)", w.Name, ref.Name, worst, at)
			}
			check(ref.HitRate > 0.8, "%s (llama.cpp): %s's prefix-cache hit rate above 80%%: %.1f%%", w.Name, ref.Name, 100*ref.HitRate)
		case "decode-heavy":
			if lr := w.arm("envoy-least-request"); lr != nil {
				ok := true
				var worst float64 = 1e9
				for i := range min(len(ref.Stages), len(lr.Stages)) {
					r := ref.Stages[i].OutputTPS / max(lr.Stages[i].OutputTPS, 1e-9)
					worst = min(worst, r)
					if r < 0.95 || ref.Stages[i].TTFT.P90 > 1.1*lr.Stages[i].TTFT.P90+0.05 {
						ok = false
					}
				}
				check(ok, "decode-heavy no worse than Envoy LEAST_REQUEST (output tok/s within 5%%, TTFT p90 within 10%% + 50 ms, at every rate): worst throughput ratio %.2f", worst)
			}
		}
	}
	if len(lines) == 0 {
		return
	}
	p("## Targets")
	p("")
	for _, l := range lines {
		p("%s", l)
	}
	p("")
}

// kneeRatio is a's knee over b's. An arm with no stage within the SLO has
// its knee somewhere below the ladder's first stage, so against it the
// ratio is a bound: more than r.
func kneeRatio(a, b *ArmResult) (r float64, bound bool) {
	switch {
	case a.Knee == nil:
		return 0, false
	case b.Knee != nil:
		return a.Knee.Load / b.Knee.Load, false
	case len(b.Stages) > 0 && b.Stages[0].load() > 0:
		return a.Knee.Load / b.Stages[0].load(), true
	}
	return 0, false
}

func tputRatio(a, b *ArmResult) float64 {
	if a.Knee == nil || b.Knee == nil || b.Knee.OutputTPS == 0 {
		return 0
	}
	return a.Knee.OutputTPS / b.Knee.OutputTPS
}

func ratioText(r float64, bound bool) string {
	switch {
	case r == 0:
		return "none (no knee to compare)"
	case bound:
		return fmt.Sprintf("more than %.2fx (the other arm missed the SLO at the first stage)", r)
	}
	return fmt.Sprintf("%.2fx", r)
}

// noWorseTTFT: a's TTFT p90 is no higher than b's at any common stage,
// allowing 10% and 50 ms of noise.
func noWorseTTFT(a, b *ArmResult) bool {
	for i := range min(len(a.Stages), len(b.Stages)) {
		if a.Stages[i].TTFT.P90 > 1.1*b.Stages[i].TTFT.P90+0.05 {
			return false
		}
	}
	return true
}

func workloadSection(b *strings.Builder, w *WorkloadResult) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format+"\n", args...) }
	p("## %s", w.Name)
	p("")
	p("%s. Scaling: %s. SLO: TTFT p90 within %.1f s.", w.Description, w.Scaling, w.SLOSeconds)
	if w.Engines != "" {
		p("Engines: `%s`, fresh for every arm.", w.Engines)
	}
	if w.Warmup != "" {
		p("Every arm first warms its cold engines up for %s (each prefix's first request is a full prefill whatever the router); that stage is not reported.", w.Warmup)
	}
	p("Each stage is its own inference-perf run on the same engines; an arm's ladder stops after two stages in a row beyond the SLO, or one beyond %dx it (the client waits for every request, and queues past the knee only grow): its later cells read \"stopped\".", saturated)
	p("")
	p("![throughput](%s) ![TTFT p90](%s) ![hit rate](%s)", w.Name+"-throughput.png", w.Name+"-ttft-p90.png", w.Name+"-hit-rate.png")
	p("")
	var labels []string
	for _, a := range w.Arms {
		if a.Valid && len(a.Stages) > len(labels) {
			labels = labels[:0]
			for _, s := range a.Stages {
				labels = append(labels, s.Label)
			}
		}
	}
	table := func(title string, cell func(s *Stage) string) {
		p("%s", title)
		p("")
		p("| arm | %s |", strings.Join(labels, " | "))
		p("|---|%s", strings.Repeat("---|", len(labels)))
		for _, a := range w.Arms {
			if !a.Valid {
				p("| %s | invalid: %s |%s", a.Name, a.Error, strings.Repeat(" |", max(len(labels)-1, 0)))
				continue
			}
			cells := make([]string, len(labels))
			for i := range cells {
				switch {
				case i < len(a.Stages):
					cells[i] = cell(&a.Stages[i])
				case a.Stopped != "":
					cells[i] = "stopped"
				}
			}
			p("| %s | %s |", a.Name, strings.Join(cells, " | "))
		}
		p("")
	}
	table("Output tokens per second:", func(s *Stage) string { return strconv.Itoa(int(s.OutputTPS)) })
	table("TTFT p50 / p90 / p99 (s):", func(s *Stage) string {
		return fmt.Sprintf("%.2f / %.2f / %.2f", s.TTFT.Median, s.TTFT.P90, s.TTFT.P99)
	})
	table("Inter-token latency p50 / p90 (ms), request latency p90 (s):", func(s *Stage) string {
		return fmt.Sprintf("%.0f / %.0f, %.1f", 1000*s.ITL.Median, 1000*s.ITL.P90, s.Latency.P90)
	})
	table("Input tokens per second, success rate:", func(s *Stage) string {
		return fmt.Sprintf("%d, %.1f%%", int(s.InputTPS), 100*s.SuccessRate)
	})
	table(fmt.Sprintf("The client: requests/s it sent, and how late it sent them (p90, ms; a stage sent more than %.0f ms late measures the client, and ends the knee):", 1000*lateSend.Seconds()), func(s *Stage) string {
		if s.SendDelay == (dist{}) {
			return fmt.Sprintf("%.1f", s.Achieved) // a run from before the bench read the delay
		}
		late := ""
		if s.sentLate() {
			late = " (late)"
		}
		return fmt.Sprintf("%.1f, %.0f%s", s.Achieved, 1000*s.SendDelay.P90, late)
	})
	if w.Goodput != nil {
		table(fmt.Sprintf("Goodput: requests/s meeting %s (inference-perf's goodput report), and their share of the answered:", sloText(w.Goodput)), func(s *Stage) string {
			return fmt.Sprintf("%.1f, %.0f%%", s.Goodput, 100*s.GoodShare)
		})
	}
	if hasPrediction(w) {
		table("kvroute's TTFT prediction: median absolute error, share within 15% (cachesync's error histogram over the stage):", func(s *Stage) string {
			if s.PredictionError == nil {
				return ""
			}
			return fmt.Sprintf("%.0f%%, %.0f%%", 100*s.PredictionError.Median, 100*s.PredictionError.Within15)
		})
	}
	if hasEngineTTFT(w) {
		table("Where TTFT went: the client's mean / the engines' own mean, from arrival at the engine (s); and the cores each process used (`bench` runs the engines). On a shared host, CPU the router takes from the engines and the client shows in the client's TTFT though no route differs:", engineTTFTText)
	}
	perEngine, what := func(s *Stage) []int { return s.PerEngine }, "requests per engine"
	if w.Engines != "" {
		// llama.cpp counts tokens, not requests.
		perEngine, what = func(s *Stage) []int { return s.PrefilledPerEngine }, "prompt tokens prefilled per engine"
	}
	table("Prefix-cache hit rate (engines' metrics), "+what+":", func(s *Stage) string {
		var pe []string
		for _, n := range perEngine(s) {
			pe = append(pe, strconv.Itoa(n))
		}
		return fmt.Sprintf("%.1f%%, %s", 100*s.HitRate, strings.Join(pe, "/"))
	})
	if hasOutputPerEngine(w) {
		table("Output tokens per engine (engines' metrics), and the most over their mean: a stage's tokens/s are divided by its span to the last answer, and the engine with the most to decode tends to give it:", outputSpread)
	}
	p("| arm | knee | hit rate (all stages) | lag | wall | decisions | command |")
	p("|---|---|---|---|---|---|---|")
	for _, a := range w.Arms {
		var ds []string
		var keys []string
		for k := range a.Decisions {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if a.Decisions[k] > 0 {
				ds = append(ds, k+" "+strconv.FormatInt(a.Decisions[k], 10))
			}
		}
		p("| %s | %s | %.1f%% | %.1f%% | %.0f s | %s | `%s` |", a.Name, loadText(a.Knee), 100*a.HitRate, 100*a.Lag, a.Wall,
			strings.Join(ds, ", "), strings.Join(a.Command, " "))
	}
	p("")
}

func hasEngineTTFT(w *WorkloadResult) bool {
	for _, a := range w.Arms {
		for _, s := range a.Stages {
			if s.EngineTTFT > 0 {
				return true
			}
		}
	}
	return false
}

// engineTTFTText is "0.15 / 0.13; bench 0.61, envoy 0.40": the stage's
// TTFT means, then its cores by process, by name.
func engineTTFTText(s *Stage) string {
	if s.EngineTTFT == 0 {
		return ""
	}
	var cores []string
	for name, c := range s.CPU {
		cores = append(cores, fmt.Sprintf("%s %.2f", name, c))
	}
	sort.Strings(cores)
	out := fmt.Sprintf("%.3f / %.3f", s.TTFT.Mean, s.EngineTTFT)
	if len(cores) > 0 {
		out += "; " + strings.Join(cores, ", ")
	}
	return out
}

func hasPrediction(w *WorkloadResult) bool {
	for _, a := range w.Arms {
		for _, s := range a.Stages {
			if s.PredictionError != nil {
				return true
			}
		}
	}
	return false
}

// sloText names a goodput SLO: "TTFT <= 2 s and TPOT <= 50 ms".
func sloText(slo map[string]float64) string {
	var keys []string
	for k := range slo {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		v := slo[k]
		if v < 1 {
			parts = append(parts, fmt.Sprintf("%s <= %.0f ms", strings.ToUpper(k), 1000*v))
		} else {
			parts = append(parts, fmt.Sprintf("%s <= %g s", strings.ToUpper(k), v))
		}
	}
	return strings.Join(parts, " and ")
}

// goodputNoise is the margin by which one arm's peak goodput must lead
// another's to count as beating it.
const goodputNoise = 0.05

// peakGoodput is the arm's highest goodput over its ladder, and where.
func peakGoodput(a *ArmResult) (float64, string) {
	best, at := 0.0, ""
	for _, s := range a.Stages {
		if s.Goodput > best {
			best, at = s.Goodput, s.Label
		}
	}
	return best, at
}

// sweepSection compares kvroute with the rivals at every point of a sweep
// (workloads of one Family): the knee and the throughput at the highest
// stage both ran.
func sweepSection(b *strings.Builder, s *Summary, family string) {
	var points []*WorkloadResult
	for i := range s.Workloads {
		if s.Workloads[i].Family == family {
			points = append(points, &s.Workloads[i])
		}
	}
	if len(points) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(b, format+"\n", args...) }
	p("## The %s sweep", family)
	p("")
	p("Each point is its own workload below; knees (TTFT p90 within the SLO) and, in brackets, output tokens/s at the highest stage kvroute and that arm both ran.")
	p("")
	var arms []string
	for _, w := range points {
		for _, a := range w.Arms {
			if !slices.Contains(arms, a.Name) {
				arms = append(arms, a.Name)
			}
		}
	}
	p("| point | %s |", strings.Join(arms, " | "))
	p("|---|%s", strings.Repeat("---|", len(arms)))
	for _, w := range points {
		ref := w.arm(headlineArm)
		cells := make([]string, len(arms))
		for i, name := range arms {
			a := w.arm(name)
			if a == nil {
				continue
			}
			cells[i] = loadText(a.Knee)
			if ref != nil {
				if top := min(len(ref.Stages), len(a.Stages)) - 1; top >= 0 {
					cells[i] += fmt.Sprintf(" (%d at %s)", int(a.Stages[top].OutputTPS), a.Stages[top].Label)
				}
			}
		}
		p("| %s | %s |", w.Name, strings.Join(cells, " | "))
	}
	p("")
}

// writePlots draws, per workload, throughput and TTFT p90 against load (a
// line per arm) and the hit rate per arm.
func writePlots(dir string, s *Summary) error {
	for _, w := range s.Workloads {
		xLabel := "offered load (requests/s)"
		if len(w.Arms) > 0 && len(w.Arms[0].Stages) > 0 && w.Arms[0].Stages[0].Concurrency > 0 {
			xLabel = "concurrency"
		}
		for _, m := range []struct {
			file, title string
			y           func(st *Stage) float64
		}{
			{"-throughput.png", "output tokens/s", func(st *Stage) float64 { return st.OutputTPS }},
			{"-ttft-p90.png", "TTFT p90 (s)", func(st *Stage) float64 { return st.TTFT.P90 }},
		} {
			pl := plot.New()
			pl.Title.Text = w.Name + ": " + m.title
			pl.X.Label.Text = xLabel
			pl.Y.Label.Text = m.title
			pl.Legend.Top = true
			pl.Legend.Left = true
			for i, a := range w.Arms {
				if !a.Valid || len(a.Stages) == 0 {
					continue
				}
				pts := make(plotter.XYs, len(a.Stages))
				for j := range a.Stages {
					st := &a.Stages[j]
					pts[j].X = st.Rate
					if st.Concurrency > 0 {
						pts[j].X = float64(st.Concurrency)
					}
					pts[j].Y = m.y(st)
				}
				l, err := plotter.NewLine(pts)
				if err != nil {
					return err
				}
				l.Color = plotutil.Color(i)
				l.Dashes = plotutil.Dashes(i / 7)
				l.Width = vg.Points(1.5)
				if a.Name == headlineArm {
					l.Width = vg.Points(3)
				}
				pl.Add(l)
				pl.Legend.Add(a.Name, l)
			}
			if err := pl.Save(8*vg.Inch, 5*vg.Inch, filepath.Join(dir, w.Name+m.file)); err != nil {
				return err
			}
		}
		pl := plot.New()
		pl.Title.Text = w.Name + ": prefix-cache hit rate over all stages (engines' metrics)"
		pl.Y.Label.Text = "hit rate (%)"
		var vals plotter.Values
		var names []string
		for _, a := range w.Arms {
			if a.Valid {
				vals = append(vals, 100*a.HitRate)
				names = append(names, a.Name)
			}
		}
		if len(vals) > 0 {
			bars, err := plotter.NewBarChart(vals, vg.Points(20))
			if err != nil {
				return err
			}
			bars.Color = color.RGBA{R: 60, G: 110, B: 180, A: 255}
			pl.Add(bars)
			pl.NominalX(names...)
			pl.X.Tick.Label.Rotation = 0.6
			pl.X.Tick.Label.XAlign = -0.9
		}
		if err := pl.Save(8*vg.Inch, 5*vg.Inch, filepath.Join(dir, w.Name+"-hit-rate.png")); err != nil {
			return err
		}
	}
	return nil
}

// hasOutputPerEngine reports whether any stage of w counts each engine's
// output tokens (runs from before the bench counted them have none).
func hasOutputPerEngine(w *WorkloadResult) bool {
	for _, a := range w.Arms {
		for _, s := range a.Stages {
			if len(s.OutputPerEngine) > 0 {
				return true
			}
		}
	}
	return false
}

// outputSpread renders a stage's output tokens per engine and how far the
// most is above their mean.
func outputSpread(s *Stage) string {
	if len(s.OutputPerEngine) == 0 {
		return ""
	}
	var parts []string
	sum, most := 0, 0
	for _, n := range s.OutputPerEngine {
		parts = append(parts, strconv.Itoa(n))
		sum += n
		most = max(most, n)
	}
	if sum == 0 {
		return strings.Join(parts, "/")
	}
	mean := float64(sum) / float64(len(s.OutputPerEngine))
	return fmt.Sprintf("%s, +%.0f%%", strings.Join(parts, "/"), 100*(float64(most)/mean-1))
}
