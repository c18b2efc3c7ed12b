package daemon

import (
	"bytes"
	"log/slog"
	"math"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/cachesync/internal/pace"
	"github.com/kvroute/kvroute/shared/predict"
)

// TestSlowEngineModel: of three engines of one deployment, the one that
// decodes eight times slower than the fitted model predicts, while its
// peers decode as predicted, publishes its ITL model scaled by the
// slowdown past the band; its peers' models are unscaled, its time to
// first token is untouched, and the log says so once.
func TestSlowEngineModel(t *testing.T) {
	var logged bytes.Buffer
	m := newModels(prometheus.NewRegistry(), slog.New(slog.NewTextHandler(&logged, nil)))
	engines := []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}
	const rate = 10_000
	for _, e := range engines {
		m.add(e)
		m.place(e, []string{"m"}, 65_536)
	}
	// The deployment's ITL fit: 10 ms a token at any batch.
	for i := range predict.MinSamples {
		m.itl(engines[i%3], float64(1+i%8), 0.010)
	}
	m.freeze()
	before := make([]predict.Model, len(engines))
	for i, e := range engines {
		before[i] = m.model(e, rate)
	}
	if before[0].ITLSamples < predict.MinSamples {
		t.Fatalf("the ITL fit has %d samples", before[0].ITLSamples)
	}
	for range pace.Samples {
		m.itl(engines[0], 4, 8*before[0].ITL(4))
		m.itl(engines[1], 4, before[1].ITL(4))
		m.itl(engines[2], 4, before[2].ITL(4))
	}
	slow := m.model(engines[0], rate)
	m.model(engines[0], rate) // logged once
	want := 8 * before[0].ITL(4) / (1 + pace.Band)
	if got := slow.ITL(4); math.Abs(got-want) > 0.03*want {
		t.Errorf("the slowed engine's ITL at 4 running: %.4f s, want %.4f s", got, want)
	}
	f := predict.Features{Uncached: 1000, Running: 4}
	if slow.TTFT(f) != before[0].TTFT(f) {
		t.Errorf("its TTFT moved: %.4f s, was %.4f s", slow.TTFT(f), before[0].TTFT(f))
	}
	for i, e := range engines[1:] {
		if got := m.model(e, rate); got.ITL(4) != before[i+1].ITL(4) {
			t.Errorf("%s, not slowed: ITL %.4f s, was %.4f s", e, got.ITL(4), before[i+1].ITL(4))
		}
	}
	if n := strings.Count(logged.String(), "decodes slower"); n != 1 || !strings.Contains(logged.String(), engines[0]) {
		t.Errorf("logged %d times:\n%s", n, logged.String())
	}
}
