package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSmokeKvrouteAboveRoundRobin is the CI smoke of make bench: on a
// b2b-saas-like workload, kvroute (real Envoy with the module, cachesync
// following the engines' events) serves more tokens per second than Envoy's
// round robin, with a higher prefix-cache hit rate. Only the ordering is
// checked, never the figures.
func TestSmokeKvrouteAboveRoundRobin(t *testing.T) {
	if testing.Short() {
		t.Skip("two benchmark arms: in the full pass only")
	}
	wasm := os.Getenv("KVROUTE_WASM")
	if wasm == "" {
		t.Fatal("KVROUTE_WASM is not set: run make test (it builds the module)")
	}
	rr, err := ArmByName("envoy-round-robin")
	if err != nil {
		t.Fatal(err)
	}
	kv, err := ArmByName("kvroute-precise")
	if err != nil {
		t.Fatal(err)
	}
	tools := Tools{EnvoyYAML: "../../envoy.yaml", Wasm: wasm} // cachesync in this process
	dir := t.TempDir()
	res, err := Smoke(t.Context(), tools, []*Arm{rr, kv}, 15*time.Second, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		t.Logf("%s: %d requests (%d failed), %.0f output tok/s, hit rate %.1f%%, TTFT p50 %v",
			r.Arm, r.Requests, r.Failed, r.OutputTPS, 100*r.HitRate, r.TTFTp50.Round(time.Millisecond))
		if r.Failed > 0 {
			t.Errorf("%s: %d of %d requests failed", r.Arm, r.Failed, r.Requests)
		}
	}
	if res[1].OutputTPS <= res[0].OutputTPS || res[1].HitRate <= res[0].HitRate {
		t.Errorf("kvroute %.0f tok/s at %.1f%% hits, round robin %.0f tok/s at %.1f%%: want kvroute above on both",
			res[1].OutputTPS, 100*res[1].HitRate, res[0].OutputTPS, 100*res[0].HitRate)
	}
	// Envoy logged every kvroute decision.
	log, err := os.ReadFile(filepath.Join(dir, kv.Name, DecisionLog))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "reason="); n < res[1].Requests {
		t.Errorf("the decision log holds %d decisions for %d requests:\n%.500s", n, res[1].Requests, log)
	}
}
