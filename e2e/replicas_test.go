package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/e2e/vllmsim"
)

// TestCachesyncReplicas: two cachesync replicas, each following every
// engine's events and forwarding the gateways' reports to the other,
// behind the filter's cachesync cluster as a primary and a standby (Envoy
// priorities, with outlier detection ejecting a replica at its first
// failure). The primary is killed (SIGKILL) under load and restarted, then
// the standby is killed: no request fails, the filter's snapshots come from
// the standby within one failed fetch, and affinity holds its share of the
// decisions throughout.
func TestCachesyncReplicas(t *testing.T) {
	skipUnderRace(t)
	es := startEngines(t, 3, vllmsim.Config{NumGPUBlocks: 1024, TimeScale: 0.02})
	addrA, addrB := freeAddr(t), freeAddr(t)
	a := newCachesyncProcess(t, es, addrA, "-peers", addrB)
	b := newCachesyncProcess(t, es, addrB, "-peers", addrA)
	a.start(t)
	b.start(t)
	cfg := cachesyncConfig(t, engineAddrs(es), addrA, nil)
	must(t, cfg.SetPriorityEndpoints("cachesync", []string{addrA}, []string{addrB}))
	must(t, cfg.SetClusterField("cachesync", "outlier_detection", map[string]any{
		"consecutive_gateway_failure": 1, "enforcing_consecutive_gateway_failure": 100,
		"consecutive_5xx": 1, "interval": "0.5s", "base_ejection_time": "5s", "max_ejection_percent": 100,
	}))
	g := startGateway(t, cfg, 2)

	tenant := func(i int) string {
		return "Tenant " + strconv.Itoa(i%6) + " rules. " + strings.Repeat("Cite the contract clause. ", 50)
	}
	for i := range 6 {
		post(t, g.client, g.url, simChat(tenant(i), "warm", 1))
	}
	waitFor(t, 10*time.Second, "routing by snapshot", func() bool {
		return strings.Contains(probe(t, g, tenant(0), "q"), "reason=affinity")
	})

	load := newPhasedLoad(t, g.client, g.url, 4, tenant, 20*time.Millisecond)
	stats := func() map[string]int64 {
		s, err := g.envoy.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	time.Sleep(3 * time.Second)
	before := stats()
	load.set(1)
	a.kill() // the primary dies mid-load
	time.Sleep(4 * time.Second)
	during := stats()
	load.set(2)
	a.start(t) // and comes back, empty, on its address
	time.Sleep(8 * time.Second)
	// The standby learned the gateway's reports: through the primary's
	// forwarding, and directly while the primary was down.
	var standbyBatches float64
	if f := metrics(t, "http://"+addrB+"/metrics")["kvroute_cachesync_report_batches_total"]; f != nil {
		standbyBatches = f.Metric[0].Counter.GetValue()
	}
	load.set(3)
	b.kill() // then the standby dies
	time.Sleep(3 * time.Second)
	load.stop()
	after := stats()

	names := []string{"before", "primary killed", "primary restarted", "standby killed"}
	load.failures(t, names...)
	windows := load.windows
	// After the kill no decision may lack a snapshot (before it, a worker
	// VM may still be loading its first).
	for i, w := range windows[1:] {
		if w.rendezvous > 0 {
			t.Errorf("%s: %d decisions without a snapshot", names[i+1], w.rendezvous)
		}
	}
	share := func(w window) float64 { return float64(w.affinity) / float64(w.sent) }
	for i := 1; i < len(windows); i++ {
		if d := share(windows[i]) - share(windows[0]); d < -0.05 {
			t.Errorf("%s: affinity %.0f%% of decisions against %.0f%% before", names[i], 100*share(windows[i]), 100*share(windows[0]))
		}
	}
	syncErrors := during["wasmcustom.kvroute.sync.errors"] - before["wasmcustom.kvroute.sync.errors"]
	t.Logf("sync errors while the primary was down: %d; fetched %d bytes then, %d after its restart",
		syncErrors, during["wasmcustom.kvroute.sync.fetched_bytes"]-before["wasmcustom.kvroute.sync.fetched_bytes"],
		after["wasmcustom.kvroute.sync.fetched_bytes"]-during["wasmcustom.kvroute.sync.fetched_bytes"])
	if syncErrors > 1 {
		t.Errorf("%d failed fetches before the filter moved to the standby", syncErrors)
	}
	if standbyBatches == 0 {
		t.Error("the standby received no report batches")
	}
}

func engineAddrs(es []*vllmsim.Engine) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Addr())
	}
	return out
}
