package vllmsim

import "fmt"

// CostModel gives the duration of one engine step, in seconds, from what
// the step computes:
//
//	step = Step
//	     + Σ prefill chunks: n·PrefillToken + PrefillAttention·Σ_{i<n}(c+i)
//	     + Σ decoding seqs:  DecodeSeq + DecodeContext·c
//	     + CPULoadToken · tokens loaded from the CPU tier
//
// where a chunk computes n tokens after c tokens already in the cache (cached
// prefix included), so attention costs grow with context.
type CostModel struct {
	Step             float64 // fixed cost of a step: reading the weights once
	PrefillToken     float64 // linear layers per prefill token
	PrefillAttention float64 // attention per (prefill token, earlier token) pair
	DecodeSeq        float64 // linear layers per decoding sequence
	DecodeContext    float64 // reading one token's KV for one decoding sequence
	CPULoadToken     float64 // copying one token's KV from the CPU tier
}

// DefaultCostModel is derived for Qwen3-32B in BF16, TP=2 on two H100 SXM
// (64 layers, 64 query heads, 8 KV heads of 128, 32.8B parameters; H100
// SXM: 3.35 TB/s HBM3, PCIe Gen5 x16) and calibrated on the one measured
// point the llm-d "sticky until saturated" blog (2026-08-17) publishes for
// that deployment: one 8192-token prefill takes T(8192) = 0.40 s. The
// derivation is in README.md; in short:
//
//	Step          = 32.8 GB of weights per GPU / 3.35 TB/s            ≈ 10 ms
//	attention FLOPs per (query, key) pair / linear FLOPs per token
//	              = 4·64·(64·128) / (2·32.8e9)                        = 3.197e-5
//	PrefillToken·(8192 + 3.197e-5·8192·8191/2) = 0.40 s − Step        → 42.1 µs
//	PrefillAttention = 3.197e-5 · PrefillToken                        = 1.35 ns
//	DecodeSeq     = PrefillToken (a decode token costs one token of linear FLOPs)
//	DecodeContext = 2·64·8·128·2 B of KV per token / 2 GPUs / 3.35 TB/s = 39 ns
//	CPULoadToken  = 128 KiB of KV per token per GPU / ~55 GB/s PCIe    = 2.4 µs
var DefaultCostModel = CostModel{
	Step:             0.010,
	PrefillToken:     42.1e-6,
	PrefillAttention: 1.346e-9,
	DecodeSeq:        42.1e-6,
	DecodeContext:    39e-9,
	CPULoadToken:     2.4e-6,
}

// A100CostModel is the same deployment on two A100 SXM 80 GB, scaled from
// DefaultCostModel by the hardware ratios (no measured point backs it):
// dense BF16 312 against 989 TFLOP/s (x3.17) for the per-token compute,
// HBM2e 2.04 against 3.35 TB/s (x1.64) for the weight and KV reads, PCIe
// Gen4 against Gen5 (~25 against ~55 GB/s, x2.2) for CPU-tier loads. It
// prefills about 6,500 tokens/s at an 8,192-token budget, a third of the
// H100 pair's.
var A100CostModel = CostModel{
	Step:             DefaultCostModel.Step * 1.64,
	PrefillToken:     DefaultCostModel.PrefillToken * 3.17,
	PrefillAttention: DefaultCostModel.PrefillAttention * 3.17,
	DecodeSeq:        DefaultCostModel.DecodeSeq * 3.17,
	DecodeContext:    DefaultCostModel.DecodeContext * 1.64,
	CPULoadToken:     DefaultCostModel.CPULoadToken * 2.2,
}

// CostModelFor returns the cost model of an accelerator: "h100" (the
// default) or "a100".
func CostModelFor(accelerator string) (CostModel, error) {
	switch accelerator {
	case "h100", "":
		return DefaultCostModel, nil
	case "a100":
		return A100CostModel, nil
	}
	return CostModel{}, fmt.Errorf("vllmsim: unknown accelerator %q (want h100 or a100)", accelerator)
}

func (m CostModel) validate() error {
	for _, v := range []float64{m.Step, m.PrefillToken, m.PrefillAttention, m.DecodeSeq, m.DecodeContext, m.CPULoadToken} {
		if !(v >= 0) {
			return fmt.Errorf("cost model %+v: every cost must be a non-negative number", m)
		}
	}
	return nil
}

// prefill is the cost of computing n tokens after c cached ones.
func (m CostModel) prefill(n, c int) float64 {
	nf, cf := float64(n), float64(c)
	return nf*m.PrefillToken + m.PrefillAttention*(nf*cf+nf*(nf-1)/2)
}

// decode is the cost of one decoding sequence with c tokens of context.
func (m CostModel) decode(c int) float64 {
	return m.DecodeSeq + m.DecodeContext*float64(c)
}

// PeakPrefill returns the prefill throughput, in tokens per second, of one
// step that prefills b tokens from an empty cache: llm-d's R_peak = B / T(B).
func (m CostModel) PeakPrefill(b int) float64 {
	return float64(b) / (m.Step + m.prefill(b, 0))
}

// TTFT estimates, from the cost model, the time to first token of a request
// arriving now at an engine in state q, with uncached tokens to prefill
// after cached ones, under a per-step token budget: the steps it takes to
// prefill everything ahead of it and itself, first come first served, each
// also decoding one token of every decoding request.
func (m CostModel) TTFT(q Queue, cached, uncached, budget int) float64 {
	ahead := q.PrefillTokens + max(uncached, 1)
	per := max(budget-q.Decoding, 1)
	steps := (ahead + per - 1) / per
	step := m.Step + m.DecodeSeq*float64(q.Decoding) + m.DecodeContext*float64(q.Context)
	u := float64(uncached)
	return float64(steps)*step + float64(ahead)*m.PrefillToken + m.PrefillAttention*u*(float64(cached)+u/2)
}
