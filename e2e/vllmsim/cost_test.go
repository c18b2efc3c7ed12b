package vllmsim

import (
	"math"
	"testing"
)

// The default cost model reproduces the calibration point it is derived
// from: one 8192-token prefill in 0.40 s, R_peak = 20480 tokens/s
// (Qwen3-32B, TP=2 on H100, llm-d blog 2026-08-17).
func TestDefaultCostModelCalibration(t *testing.T) {
	m := DefaultCostModel
	if got := m.Step + m.prefill(8192, 0); math.Abs(got-0.40) > 0.001 {
		t.Errorf("T(8192) = %.4f s, want 0.40 s", got)
	}
	if got := m.PeakPrefill(8192); math.Abs(got-20480) > 50 {
		t.Errorf("R_peak = %.0f tokens/s, want 20480", got)
	}
	// Attention makes a chunk after a long cached prefix dearer than the
	// same chunk from scratch, and decoding dearer with context.
	if m.prefill(1024, 30000) <= m.prefill(1024, 0) || m.decode(30000) <= m.decode(100) {
		t.Error("costs do not grow with context")
	}
}

func TestCostModelValidate(t *testing.T) {
	bad := DefaultCostModel
	bad.DecodeContext = math.NaN()
	if bad.validate() == nil {
		t.Error("NaN cost accepted")
	}
	bad.DecodeContext = -1
	if bad.validate() == nil {
		t.Error("negative cost accepted")
	}
	if DefaultCostModel.validate() != nil {
		t.Error("default cost model rejected")
	}
}

func TestTTFTEstimate(t *testing.T) {
	m := DefaultCostModel
	idle := m.TTFT(Queue{}, 0, 8192, 8192)
	if want := m.Step + m.prefill(8192, 0); math.Abs(idle-want) > 1e-3*want {
		t.Errorf("idle engine, 8192 uncached tokens: %.4f s, want one step %.4f s", idle, want)
	}
	warm := m.TTFT(Queue{}, 8000, 192, 8192)
	busy := m.TTFT(Queue{PrefillTokens: 3 * 8192}, 0, 8192, 8192)
	decoding := m.TTFT(Queue{Decoding: 100, Context: 100 * 8000}, 0, 8192, 8192)
	if !(warm < idle && idle < decoding && decoding < busy) {
		t.Errorf("warm %.3f, idle %.3f, decoding %.3f, queued %.3f: want that order", warm, idle, decoding, busy)
	}
}

func TestCostModelFor(t *testing.T) {
	h, err := CostModelFor("h100")
	if err != nil || h != DefaultCostModel {
		t.Fatalf("h100: %+v, %v", h, err)
	}
	a, err := CostModelFor("a100")
	if err != nil || a.validate() != nil {
		t.Fatalf("a100: %+v, %v", a, err)
	}
	// A third of the H100 pair's prefill rate, and slower decoding.
	if got := a.PeakPrefill(8192); math.Abs(got-6500) > 200 {
		t.Errorf("A100 R_peak = %.0f tokens/s, want about 6,500", got)
	}
	if a.Step+a.decode(4000) <= h.Step+h.decode(4000) {
		t.Error("an A100 decode step is not slower than an H100's")
	}
	if _, err := CostModelFor("tpu"); err == nil {
		t.Error("an unknown accelerator was accepted")
	}
}
