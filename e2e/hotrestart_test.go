package e2e

import (
	"context"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute/e2e/envoy"
	"github.com/kvroute/kvroute/e2e/vllmsim"
)

// TestEnvoyHotRestart: Envoy hot-restarts under load (a new process, new
// Wasm VMs, an empty shared data; the old one drains its connections and
// exits). No request fails, and the new process's filter, with no
// snapshot at first, routes by rendezvous until its first fetch and by
// the snapshot after it.
func TestEnvoyHotRestart(t *testing.T) {
	es := startEngines(t, 3, vllmsim.Config{NumGPUBlocks: 1024, TimeScale: 0.05})
	cs := startCachesync(t, "127.0.0.1:0", es, true)
	cfg := cachesyncConfig(t, engineAddrs(es), cs.addr, nil)
	port := freeAddr(t)
	_, p, _ := net.SplitHostPort(port)
	n, _ := strconv.Atoi(p)
	must(t, cfg.SetListenerPort(llmListener, n))
	b, err := cfg.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	base := rand.Uint32N(1 << 20)
	// Envoy names its hot-restart shared memory after the base id and
	// leaves it behind when stopped.
	t.Cleanup(func() { os.Remove("/dev/shm/envoy_shared_memory_" + strconv.FormatUint(uint64(base)*10, 10)) })
	start := func(epoch int) *envoy.Process {
		p, err := envoy.Start(context.Background(), envoy.Options{Config: b, Dir: t.TempDir(), Concurrency: 2,
			HotRestart: &envoy.HotRestart{BaseID: base, Epoch: epoch, DrainSeconds: 2, ParentShutdownSeconds: 4}})
		if err != nil {
			t.Fatalf("start Envoy epoch %d: %v", epoch, err)
		}
		t.Cleanup(func() { p.Stop() })
		return p
	}
	old := start(0)
	url := "http://" + port
	client := &http.Client{Timeout: time.Minute}
	for i := range 6 {
		post(t, client, url, simChat(faultTenant(i), "warm", 1))
	}

	load := newPhasedLoad(t, client, url, 3, faultTenant, 10*time.Millisecond)
	time.Sleep(3 * time.Second)
	load.set(1)
	start(1) // takes the listener over; the old process drains
	select {
	case <-old.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("the old Envoy did not exit after its drain")
	}
	load.set(2)
	time.Sleep(3 * time.Second)
	load.stop()

	load.failures(t, "before", "during the restart", "after the old process exited")
	windows := load.windows
	if w := windows[2]; w.sent < 20 || w.affinity < w.sent*9/10 {
		t.Errorf("after the restart: affinity for %d of %d requests", w.affinity, w.sent)
	}
}
