package bench

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// Workload is one inference-perf workload: what it generates and the load
// ladder it climbs. Every arm runs it with the same seed.
type Workload struct {
	Name        string
	Description string
	// Scaling says how the workload relates to the published shape it
	// follows, in one sentence for the report.
	Scaling string
	// Data is inference-perf's data section.
	Data map[string]any
	// Poisson stages, in requests per second, each StageSeconds long; or,
	// when Concurrency is set, concurrent stages of Requests each.
	Rates       []float64
	Concurrency []int
	Requests    int
	// SessionHeader makes inference-perf send its session id in this
	// header (multi-turn chat).
	SessionHeader string
	// SLO is the TTFT p90 a stage must stay within to count for the knee.
	SLO time.Duration
	// Goodput, when set, has inference-perf count the requests meeting
	// these per-request SLOs (its goodput report: keys ttft, tpot, in
	// seconds).
	Goodput map[string]float64
	// Bursty makes each stage's arrivals bursts at the stage's mean rate
	// (arrivalTrace) instead of steady Poisson ones.
	Bursty bool
	// Arms are the arms run by default on this workload; nil: every arm
	// but the policy-mode variants.
	Arms []string
	// Family groups workloads that are points of one sweep; the report
	// compares them side by side.
	Family string
	// WarmupRate, when set, runs a first Poisson stage at this rate, of
	// WarmupSeconds, that is not reported: every arm starts from cold
	// engines, and the first request of each prefix is a full prefill
	// whatever the router, which would otherwise decide the first stage's
	// TTFT p90.
	WarmupRate    float64
	WarmupSeconds int
	// Engines, when set, replaces the simulated engines with real ones.
	Engines *RealEngines
	// Reference is the kvroute arm the report's targets are checked on,
	// "" for kvroute-precise.
	Reference string
	// Extended workloads ask the policy's finer questions (the shared
	// fraction, a mixed stream) and run only when named: the default run
	// must fit in 75 minutes.
	Extended bool
	// Seed seeds the generated prompts, their answers' lengths and the
	// arrival traces; 0 is defaultSeed. Each prompt's answer length is
	// fixed by it, so it decides which groups answer longest, and two
	// routers that place the groups evenly but differently can differ by
	// a few percent of tokens/s on one seed: the engine with the longest
	// answers ends the stage.
	Seed uint64
}

// defaultSeed is the seed of every committed run.
const defaultSeed = 42

func (w *Workload) seed() uint64 {
	if w.Seed == 0 {
		return defaultSeed
	}
	return w.Seed
}

// warmups is how many unreported runs come before the ladder.
func (w *Workload) warmups() int {
	if w.WarmupRate > 0 {
		return 1
	}
	return 0
}

// stageLabel names stage i: its rate or its concurrency.
func (w *Workload) stageLabel(i int) string {
	if w.Concurrency != nil {
		return "c=" + strconv.Itoa(w.Concurrency[i])
	}
	return strconv.FormatFloat(w.Rates[i], 'g', -1, 64) + " req/s"
}

func (w *Workload) stages() int {
	if w.Concurrency != nil {
		return len(w.Concurrency)
	}
	return len(w.Rates)
}

// run is one inference-perf run of the workload: its warm-up (stage -1)
// or one stage of its ladder. The bench runs them one after another on the
// same engines, so that it can stop an arm's ladder once the arm has
// clearly saturated: the client waits for every request of a stage, and an
// arm far past its knee would spend the rest of the bench draining queues.
func (w *Workload) stage(i, stageSeconds int) map[string]any {
	switch {
	case i < 0:
		return map[string]any{"rate": w.WarmupRate, "duration": w.WarmupSeconds}
	case w.Concurrency != nil:
		return map[string]any{"num_requests": w.Requests, "concurrency_level": w.Concurrency[i]}
	}
	return map[string]any{"rate": w.Rates[i], "duration": stageSeconds}
}

// replayed reports whether stage i's arrivals are a trace the bench draws
// (arrivalTrace), the same for every arm: the warm-up and every stage of a
// rate ladder, but not a multi-turn workload's, whose turns inference-perf
// sends as their conversations allow. The warm-up is not reported, but it
// places every prefix, and where the groups land decides an arm's knee:
// every arm now meets the same first requests at the same moments. That
// does not make a router's placement the same from run to run: with one
// trace sglang-router put b2b-saas's groups five to one engine and three to
// another in one run and four to each in the next.
func (w *Workload) replayed(i int) bool {
	if w.SessionHeader != "" {
		return false
	}
	if i < 0 {
		return w.WarmupRate > 0
	}
	return w.Concurrency == nil
}

// arrivals returns stage i's trace (-1: the warm-up, steady whatever the
// ladder's bursts).
func (w *Workload) arrivals(i, stageSeconds int) []byte {
	if i < 0 {
		return arrivalTrace(w.WarmupRate, traceRequests(w.WarmupRate, w.WarmupSeconds), w.traceSeed(i), false)
	}
	return arrivalTrace(w.Rates[i], traceRequests(w.Rates[i], stageSeconds), w.traceSeed(i), w.Bursty)
}

// clientWorkers is how many processes inference-perf sends from.
const clientWorkers = 2

// inFlight is the most requests each of the client's workers may have in
// flight in stage i: on a rate stage, every request the stage sends, so
// that the open loop stays open. A worker holds a request from the moment
// it takes it off the queue, and a cap that binds turns Poisson arrivals
// into a closed loop whose requests queue in the client, unseen by TTFT:
// at 256 a worker, b2b-saas's rates past 48 req/s ran 512 requests at a
// time and sent late, and every router's TTFT stayed within the SLO
// however far the engines' batches outgrew their caches.
func (w *Workload) inFlight(i, stageSeconds int) int {
	const least = 256
	if i < 0 || w.Concurrency != nil {
		return least
	}
	return max(least, int(math.Ceil(w.Rates[i]*float64(stageSeconds))))
}

// config returns inference-perf's configuration for stage i of the workload
// (-1: the warm-up) against baseURL, with reports written under out.
// A replayed stage replays the trace at tracePath.
func (w *Workload) config(model, baseURL, tokenizer, out, tracePath string, i, stageSeconds int) map[string]any {
	load := map[string]any{"num_workers": clientWorkers, "worker_max_concurrency": w.inFlight(i, stageSeconds), "interval": 1, "type": "poisson"}
	switch {
	case w.Concurrency != nil && i >= 0:
		load["type"] = "concurrent"
	case w.replayed(i):
		load["type"] = "trace_replay"
		load["trace"] = map[string]any{"file": tracePath, "format": "AzurePublicDataset"}
	}
	load["stages"] = []any{w.stage(i, stageSeconds)}
	api := map[string]any{"type": "completion", "streaming": true}
	if w.SessionHeader != "" {
		api["session_id_header_key"] = w.SessionHeader
	}
	report := map[string]any{"request_lifecycle": map[string]any{
		"summary": true, "per_stage": true, "per_request": true,
	}}
	if w.Goodput != nil {
		report["goodput"] = map[string]any{"constraints": w.Goodput}
	}
	return map[string]any{
		"api":  api,
		"data": w.data(),
		"load": load,
		"server": map[string]any{
			"type": "vllm", "model_name": model, "base_url": baseURL, "ignore_eos": true,
		},
		"tokenizer": map[string]any{"pretrained_model_name_or_path": tokenizer},
		"report":    report,
		"storage":   map[string]any{"local_storage": map[string]any{"path": out}},
	}
}

// data is the workload's data section with its seed.
func (w *Workload) data() map[string]any {
	gen, ok := w.Data["shared_prefix"].(map[string]any)
	if !ok || w.seed() == defaultSeed {
		return w.Data
	}
	seeded := map[string]any{}
	for k, v := range gen {
		seeded[k] = v
	}
	seeded["seed"] = int(w.seed())
	out := map[string]any{}
	for k, v := range w.Data {
		out[k] = v
	}
	out["shared_prefix"] = seeded
	return out
}

// sharedPrefix is inference-perf's shared_prefix generator.
func sharedPrefix(groups, perGroup, system int, question, output any, multiTurn bool) map[string]any {
	return map[string]any{"type": "shared_prefix", "shared_prefix": map[string]any{
		"num_groups": groups, "num_prompts_per_group": perGroup,
		"system_prompt_len": system, "question_len": question, "output_len": output,
		"seed": defaultSeed, "enable_multi_turn_chat": multiTurn,
	}}
}

// lognormal is an inference-perf lognormal length distribution.
func lognormal(lo, hi, mean, std int) map[string]any {
	return map[string]any{"type": "lognormal", "min": lo, "max": hi, "mean": mean, "std_dev": std}
}

// spread is an inference-perf length distribution.
func spread(lo, hi int) map[string]any {
	return map[string]any{"min": lo, "max": hi, "mean": (lo + hi) / 2, "std_dev": (hi - lo) / 4}
}

// Workloads are the bench's workloads, for 4 engines of 4,096 16-token KV
// blocks (65,536 tokens each): llm-d's published shapes scaled so that the
// shared prefixes take the same share of the pool's KV cache.
var Workloads = []*Workload{
	{
		Name:        "b2b-saas",
		Description: "prefill-bound: 16 tenants x 5 users, 6,000-token system prompts, 1,200-token questions, 100-200 output tokens, Poisson",
		Scaling: "llm-d's b2b-saas is 150 groups x 5 on 8 pods of 307k KV tokens (prefixes 37% of the pool's KV); " +
			"16 groups on 4 pods of 65.5k keep 37%, with the same prompt and question lengths",
		Data: sharedPrefix(16, 5, 6000, 1200, spread(100, 200), false),
		// From light load past every arm's knee: with the client's loop
		// open, kvroute held 72 req/s within the SLO and missed at 80, as
		// sglang-router did when it placed its groups evenly (40 when not).
		Rates: []float64{8, 24, 40, 48, 56, 64, 72, 80, 96},
		SLO:   2 * time.Second,
		// 60 draws of 80 prompts: every group has come up with odds of 98%.
		WarmupRate: 2, WarmupSeconds: 30,
	},
	{
		Name:        "multi-turn",
		Description: "chat: 32 conversations (8 system prompts of 2,000 tokens x 4 users), 300-token turns, 60-120 output tokens; each turn resends the conversation",
		Scaling: "inference-perf's multi-turn mode with its session header; a conversation's next turn waits for its last answer, so a stage of 15 s " +
			"gives each conversation about rate/2 turns; from 12 req/s the growing conversations outgrow the pool's KV cache and every arm breaks alike",
		Data:          sharedPrefix(8, 4, 2000, 300, spread(60, 120), true),
		Rates:         []float64{4, 8},
		SessionHeader: "x-session-id",
		SLO:           2 * time.Second,
		Arms:          []string{"envoy-round-robin", "kvroute-precise", "sglang-router"},
	},
	{
		Name:        "code-gen",
		Description: "code generation: 8 repositories x 10 developers, 10,000-token repository contexts, 400-token asks, 200-400 output tokens, concurrency ladder",
		Scaling:     "llm-d's code-gen shape (long shared repository contexts, closed-loop clients) on 4 pods: the contexts take 31% of the pool's KV",
		Data:        sharedPrefix(8, 10, 10000, 400, spread(200, 400), false),
		Concurrency: []int{8, 16, 32},
		Requests:    96,
		SLO:         2 * time.Second,
		Arms:        []string{"envoy-round-robin", "kvroute-precise", "sglang-router"},
	},
	{
		Name:        "hot-prefix",
		Description: "one 6,000-token system prompt takes all the traffic (100 users, 600-token questions, 100 output tokens), Poisson",
		Scaling:     "the hotspot sticky-until-saturated exists for: one prefix more than one engine can serve",
		Data:        sharedPrefix(1, 100, 6000, 600, 100, false),
		Rates:       []float64{8, 16, 32},
		SLO:         2 * time.Second,
		Arms:        []string{"envoy-round-robin", "kvroute-precise", "kvroute-sticky", "sglang-router"},
	},
	{
		Name:        "decode-heavy",
		Description: "decode-bound: 32 groups x 5, 200-token system prompts, 100-token questions, 800-1,200 output tokens, Poisson",
		Scaling:     "short prompts and long outputs, where affinity matters little",
		Data:        sharedPrefix(32, 5, 200, 100, spread(800, 1200), false),
		Rates:       []float64{4, 8, 16},
		SLO:         2 * time.Second,
		Arms:        []string{"envoy-least-request", "kvroute-precise", "sglang-router"},
	},
	sharedFraction(30, []float64{1, 2, 3, 4, 6}),
	sharedFraction(60, []float64{2, 4, 6, 8, 12}),
	sharedFraction(90, []float64{8, 16, 24, 32, 48}),
	{
		Name: "mixed",
		Description: "mixed and bursty: 16 groups x 5, 2,000-token system prompts, heavy-tailed questions (lognormal, 100-8,000 tokens, mean 1,500) " +
			"and outputs (20-1,500, mean 300), arrivals in bursts of 2.5x the rate for 1.5 s of every 5 s",
		Scaling: "prefill-heavy and decode-heavy requests in one stream, so the pool's bottleneck moves; inference-perf's shared_prefix draws " +
			"one length distribution, so the mix is heavy-tailed rather than bimodal; it replays the bursts as a trace (trace_replay)",
		Data: sharedPrefix(16, 5, 2000, lognormal(100, 8000, 1500, 1500), lognormal(20, 1500, 300, 300), false),
		// Up to 64: at 40 req/s both fixed modes and auto still served
		// nearly every request within both SLOs, so a ladder ending there could
		// not tell them apart.
		Rates:      []float64{8, 16, 24, 32, 40, 48, 56, 64},
		Bursty:     true,
		SLO:        2 * time.Second,
		Goodput:    map[string]float64{"ttft": 2, "tpot": 0.05},
		Arms:       []string{"envoy-least-request", "kvroute-precise", "kvroute-prefill", "kvroute-decode", "kvroute-slo", "sglang-router"},
		WarmupRate: 2, WarmupSeconds: 30,
		Extended: true,
	},
	{
		Name: realWorkload,
		Description: "a real engine: two llama.cpp servers (Gemma 3 270M Q4_K_M, one CPU thread and two slots of 2,048 tokens each), " +
			"4 groups x 8 prompts, 400-token system prompts, 40-token questions, 16 output tokens, a concurrency ladder (1, 2, 4) of 32 requests a stage",
		Scaling: "the by-hand run of issue 10 (4 groups of ~500-token system prompts x 8 questions, concurrency 2): two groups per server " +
			"fill its two slots, so placement decides the hit rate. inference-perf sizes prompts in cl100k tokens; Gemma's tokenizer " +
			"counts about 1.3 of its tokens for each (the engines' own counts are in the hit rates)",
		Data:        sharedPrefix(4, 8, 400, 40, 16, false),
		Concurrency: []int{1, 2, 4},
		Requests:    32,
		SLO:         10 * time.Second,
		Arms:        []string{"envoy-round-robin", "envoy-least-request", "kvroute-approx", "sglang-router"},
		Engines:     &RealEngines{Count: 2, Slots: 2, Context: 2048, Threads: 1},
		Reference:   "kvroute-approx",
		// Each prefix's first request is a cold prefill whatever the
		// router, and cachesync calibrates llama.cpp's rate from its
		// first long prompts.
		WarmupRate: 0.5, WarmupSeconds: 20,
	},
}

// realWorkload runs on real engines: llama.cpp's server with Gemma 3 270M
// on one CPU thread each (make llamacpp builds it).
const realWorkload = "llama-cpp"

// sharedFamily is the sweep of the prompt's shared fraction.
const sharedFamily = "shared-fraction"

// sharedFraction is b2b-saas's shape with pct percent of its 7,200-token
// prompt shared: where a fixed affinity threshold would fall off a cliff.
func sharedFraction(pct int, rates []float64) *Workload {
	system := 7200 * pct / 100
	return &Workload{
		Name:   "shared-" + strconv.Itoa(pct),
		Family: sharedFamily,
		Description: "b2b-saas with " + strconv.Itoa(pct) + "% of the prompt shared: 16 groups x 5, " + strconv.Itoa(system) +
			"-token system prompts, " + strconv.Itoa(7200-system) + "-token questions, 100-200 output tokens, Poisson",
		Scaling:    "a point of the shared-fraction sweep (30%, 60%, 90%; b2b-saas is 83%); the ladder is scaled to the prefill each point needs",
		Data:       sharedPrefix(16, 5, system, 7200-system, spread(100, 200), false),
		Rates:      rates,
		SLO:        2 * time.Second,
		Arms:       []string{"kvroute-precise", "sglang-router", "vllm-router"},
		WarmupRate: 2, WarmupSeconds: 30,
		Extended: true,
	}
}

// WorkloadByName returns the named workload.
func WorkloadByName(name string) (*Workload, error) {
	for _, w := range Workloads {
		if w.Name == name {
			return w, nil
		}
	}
	return nil, fmt.Errorf("bench: unknown workload %q", name)
}
