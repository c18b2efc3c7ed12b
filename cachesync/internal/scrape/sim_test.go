package scrape

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/cachesync/internal/calibrate"
	"github.com/kvroute/kvroute/e2e/vllmsim"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// simClock returns a clock that reads an engine's simulated time, which
// lags the wall clock's mapping when the host cannot keep the time scale.
func simClock(e *vllmsim.Engine) func() time.Time {
	epoch := time.Unix(1_000_000_000, 0)
	return func() time.Time { return epoch.Add(e.SimTime()) }
}

func startSim(t testing.TB, cfg vllmsim.Config) *vllmsim.Engine {
	t.Helper()
	cfg.Logger = discard
	es, err := vllmsim.StartN(context.Background(), 1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { es[0].Close() })
	return es[0]
}

// waitForSim polls cond until it holds, or until the engine's clock has
// advanced by within simulated time: a host too slow for the time scale
// (the race detector) stretches the wall time that takes, not the verdict.
func waitForSim(t *testing.T, e *vllmsim.Engine, what string, within time.Duration, cond func() bool) {
	t.Helper()
	start, wallLimit := e.SimTime(), time.Now().Add(5*time.Minute)
	for !cond() {
		if e.SimTime()-start > within || time.Now().After(wallLimit) {
			t.Fatalf("timed out waiting for %s (%v simulated)", what, e.SimTime()-start)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// load keeps n requests of prompt random tokens (so nothing is cached)
// in flight against url until the returned stop is called, or the test
// ends: goroutines that outlive their test would report into it.
func load(t *testing.T, url string, n, prompt int) (stop func()) {
	var wg sync.WaitGroup
	done := make(chan struct{})
	var once sync.Once
	stop = func() {
		once.Do(func() { close(done) })
		wg.Wait()
	}
	t.Cleanup(stop)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := make([]int, prompt)
			for {
				select {
				case <-done:
					return
				default:
				}
				for i := range ids {
					ids[i] = rand.IntN(100000)
				}
				body, _ := json.Marshal(map[string]any{"prompt": ids, "max_tokens": 1})
				resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Errorf("completion: %s", resp.Status)
					return
				}
			}
		}()
	}
	return stop
}

// TestCalibratesAgainstSimulator scrapes a simulated vLLM engine (the
// default cost model: Qwen3-32B on two H100s, B = 8192) at 20× speed. Idle,
// the published rate stays the default; under concurrent long uncached
// prompts the estimate converges on the cost model's analytic
// R_peak = B / T(B).
func TestCalibratesAgainstSimulator(t *testing.T) {
	scale := 0.05
	if raceEnabled {
		// The load generator must keep the engine busy: slow the engine
		// down as much as the race detector slows the clients.
		scale = 0.25
	}
	e := startSim(t, vllmsim.Config{TimeScale: scale})
	// One scrape per simulated second, windows of ten.
	s, _ := startScraper(t, Config{Interval: time.Duration(scale * float64(time.Second)), Now: simClock(e),
		Calibration: calibrate.Config{Window: 10 * time.Second}})
	s.Set([]string{e.Addr()})

	// Idle for 30 simulated seconds: the default stands.
	waitFor(t, "healthy", func() bool { st, _ := s.State(e.Addr()); return st.Health == snapshot.HealthHealthy })
	time.Sleep(time.Duration(30 * scale * float64(time.Second)))
	st, _ := s.State(e.Addr())
	if st.Rate.Calibrated || st.Rate.TokensPerSecond != calibrate.DefaultRate {
		t.Fatalf("idle engine: rate %+v, want the default", st.Rate)
	}
	cfg := e.Config()
	if st.Kind != KindVLLM || !slices.Equal(st.Models, []string{cfg.Model}) || st.BlockSize != cfg.BlockSize ||
		st.NumBlocks != cfg.NumGPUBlocks || st.KVCapacity != (cfg.NumGPUBlocks-1)*cfg.BlockSize {
		t.Errorf("state %+v", st)
	}

	stop := load(t, e.URL(), 8, 6000)
	calibrated := func() bool { st, _ := s.State(e.Addr()); return st.Rate.Calibrated }
	waitForSim(t, e, "a calibrated rate", 120*time.Second, calibrated)
	time.Sleep(time.Duration(20 * scale * float64(time.Second))) // a few more windows
	stop()

	st, _ = s.State(e.Addr())
	page := metricsPage(t, e)
	checkFilter(t, page)
	if n := len(filter(page)); n > len(page)/4 {
		t.Errorf("the filter keeps %d of the page's %d bytes", n, len(page))
	}
	peak := cfg.Cost.PeakPrefill(cfg.MaxNumBatchedTokens)
	t.Logf("calibrated %.0f tokens/s, analytic R_peak %.0f: %+.1f%%",
		st.Rate.TokensPerSecond, peak, 100*(st.Rate.TokensPerSecond-peak)/peak)
	if math.Abs(st.Rate.TokensPerSecond-peak) > 0.25*peak {
		t.Errorf("calibrated rate %.0f tokens/s, want %.0f ± 25%%", st.Rate.TokensPerSecond, peak)
	}
	stats := s.Stats()
	t.Logf("%d scrapes of a %d-byte page, %.2f ms each on average (HTTP and parsing, under load)",
		stats.Scrapes, len(page), 1000*stats.ScrapeSeconds/float64(stats.Scrapes))
}

// BenchmarkParse measures one parse of the simulator's /metrics page (a
// vLLM page with every histogram routing reads) and of a two-core page.
func BenchmarkParse(b *testing.B) {
	sim := metricsPage(b, startSim(b, vllmsim.Config{TimeScale: 0}))
	for _, page := range []struct {
		name string
		text []byte
	}{{"vllmsim", sim}, {"two-cores", []byte(vllmTwoEngines)}} {
		for _, p := range []struct {
			name  string
			parse func([]byte) (Metrics, error)
		}{{"filtered", Parse}, {"unfiltered", parse}} {
			b.Run(page.name+"/"+p.name, func(b *testing.B) {
				b.SetBytes(int64(len(page.text)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := p.parse(page.text); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// metricsPage fetches an engine's /metrics page.
func metricsPage(t testing.TB, e *vllmsim.Engine) []byte {
	t.Helper()
	resp, err := http.Get(e.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
