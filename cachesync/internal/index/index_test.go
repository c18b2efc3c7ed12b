package index

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/shared/predict"
	"github.com/kvroute/kvroute/shared/report"
	"github.com/kvroute/kvroute/shared/snapshot"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newIndex(t testing.TB, cfg Config) *Index {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	x, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// H turns a small number into a block hash. The snapshot relies on
// hashes being uniform: hashes sharing their top 32+ bits would merge.
func H(i uint64) uint64 {
	i += 0x9e3779b97f4a7c15
	i = (i ^ i>>30) * 0xbf58476d1ce4e5b9
	i = (i ^ i>>27) * 0x94d049bb133111eb
	return i ^ i>>31
}

// hs maps H over its arguments.
func hs(is ...uint64) []uint64 {
	out := make([]uint64, len(is))
	for i, v := range is {
		out[i] = H(v)
	}
	return out
}

func addr(i int) string { return "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256) + ":8000" }

func info(i int) snapshot.EndpointInfo {
	return snapshot.EndpointInfo{Addr: addr(i), Models: []string{"m"}, Health: snapshot.HealthHealthy, Running: 1}
}

func addEndpoints(t testing.TB, x *Index, n int, mode Mode) {
	t.Helper()
	for i := range n {
		if err := x.SetEndpoint(info(i)); err != nil {
			t.Fatal(err)
		}
		if err := x.SetMode(addr(i), mode); err != nil {
			t.Fatal(err)
		}
	}
}

// state reads a published image back, as a filter would, into
// hash -> address -> tier.
type state map[uint64]map[string]snapshot.Tier

func read(t testing.TB, im *snapshot.Image, hashes []uint64) state {
	t.Helper()
	v := viewOf(t, im)
	st := state{}
	m := v.Manifest()
	for _, h := range hashes {
		hs := v.Lookup(h)
		for i := range hs.Len() {
			if st[h] == nil {
				st[h] = map[string]snapshot.Tier{}
			}
			st[h][m.Endpoint(hs.At(i).Endpoint()).Addr()] = hs.At(i).Tier()
		}
	}
	return st
}

func viewOf(t testing.TB, im *snapshot.Image) *snapshot.View {
	t.Helper()
	bd, err := snapshot.ParseBundle(im.AppendBundle(nil, 0))
	if err != nil {
		t.Fatal(err)
	}
	keys := snapshot.NewKeys("t/")
	kv := map[string][]byte{}
	for _, p := range bd.Parts() {
		kv[keys.Part(p)] = p.Data
	}
	kv[keys.Head()] = bd.Manifest().AppendHead(nil)
	v := snapshot.NewView(keys)
	if _, err := v.Refresh(func(k string) ([]byte, error) { return kv[k], nil }); err != nil {
		t.Fatal(err)
	}
	return v
}

func equalState(a, b state) bool {
	return maps.EqualFunc(a, b, func(x, y map[string]snapshot.Tier) bool { return maps.Equal(x, y) })
}

func sink(t testing.TB, x *Index, a string) *Sink {
	t.Helper()
	s, err := x.Sink(a)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func batch(t testing.TB, recs ...report.Record) report.Batch {
	t.Helper()
	var w report.Writer
	for i := range recs {
		if err := w.Add(&recs[i]); err != nil {
			t.Fatal(err)
		}
	}
	bt, err := report.Parse(w.Bytes(), report.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return bt
}

func TestPrecise(t *testing.T) {
	x := newIndex(t, Config{})
	addEndpoints(t, x, 2, Precise)
	a, b := sink(t, x, addr(0)), sink(t, x, addr(1))
	a.Add(H(1), snapshot.TierGPU)
	a.Add(H(2), snapshot.TierGPU)
	a.Add(H(3), snapshot.TierCPU)
	b.Add(H(2), snapshot.TierCPU)
	b.Add(H(9), snapshot.TierGPU)
	a.Remove(H(1), snapshot.TierGPU)
	all := hs(1, 2, 3, 9)
	want := state{
		H(2): {addr(0): snapshot.TierGPU, addr(1): snapshot.TierCPU},
		H(3): {addr(0): snapshot.TierCPU},
		H(9): {addr(1): snapshot.TierGPU},
	}
	if got := read(t, x.Publish(), all); !equalState(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	a.Clear()
	a.Add(H(5), snapshot.TierGPU)
	want = state{H(2): {addr(1): snapshot.TierCPU}, H(9): {addr(1): snapshot.TierGPU}, H(5): {addr(0): snapshot.TierGPU}}
	if got := read(t, x.Publish(), append(all, H(5))); !equalState(got, want) {
		t.Fatalf("after Clear: got %v, want %v", got, want)
	}
}

// TestPendingBlocks: a report naming a precise endpoint makes the blocks
// its engine does not hold pending; the engine's events confirm them or
// they expire, and a report can never remove or keep what the engine's
// events say.
func TestPendingBlocks(t *testing.T) {
	x := newIndex(t, Config{PendingTTL: 10 * time.Second})
	clock := time.Unix(1_790_000_000, 0)
	x.now = func() time.Time { return clock }
	addEndpoints(t, x, 2, Precise)
	a := sink(t, x, addr(0))
	a.Add(H(1), snapshot.TierGPU) // the engine holds 1
	a.Add(H(2), snapshot.TierCPU) // and 2 on the CPU only
	x.Publish()

	x.Report(batch(t, report.Record{Endpoint: addr(0), Hashes: hs(1, 2, 3, 4)}))
	all := hs(1, 2, 3, 4)
	want := state{
		H(1): {addr(0): snapshot.TierGPU},
		H(2): {addr(0): snapshot.TierGPU}, // and still on the CPU
		H(3): {addr(0): snapshot.TierGPU},
		H(4): {addr(0): snapshot.TierGPU},
	}
	if got := read(t, x.Publish(), all); !equalState(got, want) {
		t.Fatalf("after the report: got %v, want %v", got, want)
	}
	// The engine stores 3 and drops 1; 2 and 4 never come.
	a.Add(H(3), snapshot.TierGPU)
	a.Remove(H(1), snapshot.TierGPU)
	clock = clock.Add(5 * time.Second)
	x.Report(batch(t, report.Record{Endpoint: addr(0), Hashes: hs(4)})) // renews 4
	x.Publish()
	// A request routed to 0 for 1 after its engine dropped it (a stale
	// snapshot, or a request the engine refused) does not make 1 look held
	// again: each such report would renew it and attract the next.
	x.Report(batch(t, report.Record{Endpoint: addr(0), Hashes: hs(1)}))
	clock = clock.Add(6 * time.Second) // 2 expires, 4 was renewed
	want = state{H(2): {addr(0): snapshot.TierCPU}, H(3): {addr(0): snapshot.TierGPU}, H(4): {addr(0): snapshot.TierGPU}}
	if got := read(t, x.Publish(), all); !equalState(got, want) {
		t.Fatalf("after 11 s: got %v, want %v", got, want)
	}
	clock = clock.Add(5 * time.Second)
	delete(want, H(4))
	if got := read(t, x.Publish(), all); !equalState(got, want) {
		t.Fatalf("after 16 s: got %v, want %v", got, want)
	}
	for outcome, n := range map[string]float64{"added": 3, "confirmed": 1, "expired": 2} {
		if got := value(x.m.pending.WithLabelValues(outcome)); got != n {
			t.Errorf("pending %s = %v, want %v", outcome, got, n)
		}
	}
	if x.pendingN.Load() != 0 {
		t.Errorf("%d blocks still counted pending", x.pendingN.Load())
	}
	// A TTL after the eviction, a report may make 1 pending again.
	x.Report(batch(t, report.Record{Endpoint: addr(0), Hashes: hs(1)}))
	if got := read(t, x.Publish(), hs(1)); !equalState(got, state{H(1): {addr(0): snapshot.TierGPU}}) {
		t.Errorf("a TTL after its eviction, a report of 1: %v, want it pending", got)
	}

	// A cleared engine drops its pending blocks too; with pending blocks
	// off, a report leaves a precise endpoint alone.
	x.Report(batch(t, report.Record{Endpoint: addr(0), Hashes: hs(7)}))
	x.Publish()
	a.Clear()
	if got := read(t, x.Publish(), hs(7)); len(got) != 0 || x.pendingN.Load() != 0 {
		t.Errorf("after Clear: %v, %d pending", got, x.pendingN.Load())
	}
	off := newIndex(t, Config{}) // the default
	addEndpoints(t, off, 1, Precise)
	off.Report(batch(t, report.Record{Endpoint: addr(0), Hashes: hs(7, 8)}))
	if got := read(t, off.Publish(), hs(7, 8)); len(got) != 0 {
		t.Fatalf("with pending blocks off, a report reached a precise endpoint: %v", got)
	}
	if got := value(off.m.records.WithLabelValues("precise_endpoint")); got != 1 {
		t.Fatalf("precise_endpoint records = %v, want 1", got)
	}
}

func TestApproximate(t *testing.T) {
	x := newIndex(t, Config{DefaultCapacity: 3})
	addEndpoints(t, x, 2, Approximate)
	if _, err := x.Sink(addr(0)); err == nil {
		t.Fatal("Sink of an approximate endpoint succeeded")
	}
	x.Report(batch(t,
		report.Record{Endpoint: addr(0), Model: "m", Hashes: hs(1, 2, 3)},
		report.Record{Endpoint: addr(1), Hashes: hs(1, 2)},
		report.Record{Endpoint: "10.9.9.9:1", Hashes: hs(42)},
	))
	// Another gateway's report: endpoint 0 goes over capacity and drops
	// the tail of the older prompt.
	x.Report(batch(t, report.Record{Endpoint: addr(0), Hashes: hs(1, 5)}))
	all := hs(1, 2, 3, 5, 42)
	want := state{
		H(1): {addr(0): snapshot.TierGPU, addr(1): snapshot.TierGPU},
		H(2): {addr(0): snapshot.TierGPU, addr(1): snapshot.TierGPU},
		H(5): {addr(0): snapshot.TierGPU},
	}
	if got := read(t, x.Publish(), all); !equalState(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for outcome, want := range map[string]float64{"applied": 3, "unknown_endpoint": 1} {
		if got := value(x.m.records.WithLabelValues(outcome)); got != want {
			t.Errorf("%s records = %v, want %v", outcome, got, want)
		}
	}
	if got := value(x.m.evicted); got != 1 {
		t.Errorf("evicted = %v, want 1", got)
	}

	// Shrinking evicts from the least recently used end.
	if err := x.SetCapacity(addr(0), 1); err != nil {
		t.Fatal(err)
	}
	want[H(2)] = map[string]snapshot.Tier{addr(1): snapshot.TierGPU}
	delete(want, H(5))
	if got := read(t, x.Publish(), all); !equalState(got, want) {
		t.Fatalf("after shrinking: got %v, want %v", got, want)
	}
	if st := x.Stats(); st.ApproxEntries != 3 || st.Entries != 2 {
		t.Fatalf("Stats %+v, want 3 approximate entries over 2 hashes", st)
	}
}

func TestModeSwitch(t *testing.T) {
	x := newIndex(t, Config{})
	addEndpoints(t, x, 1, Approximate)
	x.Report(batch(t, report.Record{Endpoint: addr(0), Hashes: hs(1, 2)}))
	x.Publish()

	// Going precise clears what reports taught.
	if err := x.SetMode(addr(0), Precise); err != nil {
		t.Fatal(err)
	}
	s := sink(t, x, addr(0))
	s.Add(H(3), snapshot.TierGPU)
	want := state{H(3): {addr(0): snapshot.TierGPU}}
	if got := read(t, x.Publish(), hs(1, 2, 3)); !equalState(got, want) {
		t.Fatalf("precise: got %v, want %v", got, want)
	}

	// Going back clears the events' entries; the old sink goes stale, and
	// so do changes it queued before the switch.
	s.Add(H(4), snapshot.TierGPU)
	if err := x.SetMode(addr(0), Approximate); err != nil {
		t.Fatal(err)
	}
	s.Add(H(5), snapshot.TierGPU)
	x.Report(batch(t, report.Record{Endpoint: addr(0), Hashes: hs(6)}))
	want = state{H(6): {addr(0): snapshot.TierGPU}}
	if got := read(t, x.Publish(), hs(1, 2, 3, 4, 5, 6)); !equalState(got, want) {
		t.Fatalf("approximate again: got %v, want %v", got, want)
	}
	if got := value(x.m.stale); got != 1 {
		t.Fatalf("stale changes = %v, want 1", got)
	}
	if err := x.SetMode(addr(0), Mode(7)); err == nil {
		t.Fatal("SetMode accepted an unknown mode")
	}
	if err := x.SetMode("nowhere:1", Precise); err == nil {
		t.Fatal("SetMode accepted an unknown endpoint")
	}
}

func TestRemoveEndpoint(t *testing.T) {
	x := newIndex(t, Config{})
	addEndpoints(t, x, 2, Precise)
	old := sink(t, x, addr(0))
	old.Add(H(1), snapshot.TierGPU)
	sink(t, x, addr(1)).Add(H(1), snapshot.TierGPU)
	x.Publish()
	if !x.RemoveEndpoint(addr(0)) || x.RemoveEndpoint(addr(0)) {
		t.Fatal("RemoveEndpoint: want true, then false")
	}
	// Back at the same address: a bridge left over from before writes
	// into nothing.
	addEndpoints(t, x, 1, Precise)
	old.Add(H(2), snapshot.TierGPU)
	want := state{H(1): {addr(1): snapshot.TierGPU}}
	im := x.Publish()
	if got := read(t, im, hs(1, 2)); !equalState(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if st := x.Stats(); st.Endpoints != 2 || st.Precise != 2 || st.Generation != im.Generation() {
		t.Fatalf("Stats %+v", st)
	}
}

// TestUpdateAfterRemoval checks that a late scrape of a removed endpoint
// does not bring it back.
func TestUpdateAfterRemoval(t *testing.T) {
	x := newIndex(t, Config{})
	if err := x.UpdateEndpoint(info(0)); !errors.Is(err, ErrUnknownEndpoint) {
		t.Fatalf("UpdateEndpoint of an unknown endpoint = %v", err)
	}
	_ = x.SetEndpoint(info(0))
	in := info(0)
	in.Running = 7
	if err := x.UpdateEndpoint(in); err != nil {
		t.Fatal(err)
	}
	if e := viewOf(t, x.Publish()).Manifest().Endpoint(0); e.Running() != 7 {
		t.Fatalf("running %d after the update", e.Running())
	}
	x.RemoveEndpoint(addr(0))
	if err := x.UpdateEndpoint(in); !errors.Is(err, ErrUnknownEndpoint) {
		t.Fatalf("UpdateEndpoint after removal = %v", err)
	}
	if st := x.Stats(); x.Publish() == nil || x.Stats().Endpoints != 0 {
		t.Fatalf("endpoint back after removal: %+v", st)
	}
	if _, err := x.Sink(addr(0)); !errors.Is(err, ErrUnknownEndpoint) {
		t.Fatalf("Sink of a removed endpoint = %v", err)
	}
}

// TestQueuedReportsBeforeRemoval checks that reports queued for an endpoint
// do not land on the endpoint re-added at its address.
func TestQueuedReportsBeforeRemoval(t *testing.T) {
	x := newIndex(t, Config{})
	addEndpoints(t, x, 1, Approximate)
	x.Report(batch(t, report.Record{Endpoint: addr(0), Hashes: hs(1)}))
	x.RemoveEndpoint(addr(0))
	addEndpoints(t, x, 1, Approximate)
	if got := read(t, x.Publish(), hs(1)); len(got) != 0 {
		t.Fatalf("a report for the removed endpoint reached its successor: %v", got)
	}
}

func TestChangeDetection(t *testing.T) {
	x := newIndex(t, Config{})
	first := x.Publish()
	if first == nil || x.Image() != first {
		t.Fatal("the first Publish builds even an empty index")
	}
	if x.Publish() != first {
		t.Fatal("Publish built with nothing changed")
	}
	steps := []struct {
		name    string
		do      func()
		rebuild bool
	}{
		{"new endpoint", func() { _ = x.SetEndpoint(info(0)) }, true},
		{"same info", func() { _ = x.SetEndpoint(info(0)) }, false},
		{"load changed", func() { i := info(0); i.Running = 5; _ = x.SetEndpoint(i) }, true},
		{"report adds", func() { x.Report(batch(t, report.Record{Endpoint: addr(0), Hashes: hs(1)})) }, true},
		{"report repeats", func() { x.Report(batch(t, report.Record{Endpoint: addr(0), Hashes: hs(1)})) }, false},
		{"report for nobody", func() { x.Report(batch(t, report.Record{Endpoint: "x:1", Hashes: hs(2)})) }, false},
		{"same capacity", func() { _ = x.SetCapacity(addr(0), DefaultCapacity) }, false},
		{"same mode", func() { _ = x.SetMode(addr(0), Approximate) }, false},
	}
	prev := first
	for _, s := range steps {
		s.do()
		im := x.Publish()
		if rebuilt := im != prev; rebuilt != s.rebuild {
			t.Fatalf("%s: rebuilt %v, want %v", s.name, rebuilt, s.rebuild)
		}
		prev = im
	}
}

func TestBadInput(t *testing.T) {
	x := newIndex(t, Config{})
	if err := x.SetEndpoint(snapshot.EndpointInfo{}); err == nil {
		t.Fatal("SetEndpoint accepted an endpoint without address")
	}
	if err := x.SetEndpoint(snapshot.EndpointInfo{Addr: "a:1", KVCacheUsage: 2}); err == nil {
		t.Fatal("SetEndpoint accepted KV usage 2")
	}
	_ = x.SetEndpoint(info(0))
	for _, n := range []int{0, -1, 1 << 30} {
		if err := x.SetCapacity(addr(0), n); err == nil {
			t.Fatalf("SetCapacity(%d) succeeded", n)
		}
	}
	if err := x.SetCapacity("b:1", 10); err == nil {
		t.Fatal("SetCapacity of an unknown endpoint succeeded")
	}
	if _, err := x.Sink("b:1"); err == nil {
		t.Fatal("Sink of an unknown endpoint succeeded")
	}
	for _, cfg := range []Config{{Interval: -1}, {DefaultCapacity: -1}, {MaxPending: -1}, {Snapshot: snapshot.BuilderConfig{ShardBits: 99}}} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
}

// TestBackpressure checks that writers that outrun the builder apply their
// own queues, and that nothing is lost on the way.
func TestBackpressure(t *testing.T) {
	x := newIndex(t, Config{MaxPending: 8, MaxPendingHashes: 8})
	addEndpoints(t, x, 1, Precise)
	_ = x.SetEndpoint(info(1))
	s := sink(t, x, addr(0))
	var all []uint64
	for h := range uint64(100) {
		s.Add(H(h), snapshot.TierGPU)
		x.Report(batch(t, report.Record{Endpoint: addr(1), Hashes: hs(1000 + h)}))
		all = append(all, H(h), H(1000+h))
	}
	if got := value(x.m.ops); got < 90 {
		t.Fatalf("%v changes applied before Publish, want writers to have applied most", got)
	}
	x.rmu.Lock()
	queued := x.rhashes
	x.rmu.Unlock()
	if queued >= 8 {
		t.Fatalf("%d report hashes queued, limit 8", queued)
	}
	if got := read(t, x.Publish(), all); len(got) != 200 {
		t.Fatalf("%d of 200 hashes published", len(got))
	}
}

// TestConcurrent runs engines, gateways, a scraper and the builder loop at
// once (run it with -race), then checks the final snapshot.
func TestConcurrent(t *testing.T) {
	x := newIndex(t, Config{Interval: time.Millisecond, MaxPending: 64})
	const engines, gateways, per = 4, 3, 300
	addEndpoints(t, x, engines, Precise)
	for i := engines; i < engines+gateways; i++ {
		_ = x.SetEndpoint(info(i))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = x.Run(ctx); close(done) }()

	var wg sync.WaitGroup
	for e := range engines {
		s := sink(t, x, addr(e))
		wg.Go(func() {
			for h := range uint64(per) {
				s.Add(H(uint64(e)<<32|h), snapshot.TierGPU)
				if h%3 == 0 {
					s.Remove(H(uint64(e)<<32|h), snapshot.TierGPU)
				}
			}
		})
	}
	for g := range gateways {
		wg.Go(func() {
			for h := range uint64(per) {
				x.Report(batch(t, report.Record{Endpoint: addr(engines + g), Hashes: hs(uint64(100+g)<<32 | h)}))
			}
		})
	}
	wg.Go(func() {
		for i := range 200 {
			in := info(engines)
			in.Running = i
			_ = x.SetEndpoint(in)
		}
	})
	wg.Wait()
	cancel()
	<-done

	want := state{}
	var all []uint64
	for e := range engines {
		for h := range uint64(per) {
			all = append(all, H(uint64(e)<<32|h))
			if h%3 != 0 {
				want[H(uint64(e)<<32|h)] = map[string]snapshot.Tier{addr(e): snapshot.TierGPU}
			}
		}
	}
	for g := range gateways {
		for h := range uint64(per) {
			all = append(all, H(uint64(100+g)<<32|h))
			want[H(uint64(100+g)<<32|h)] = map[string]snapshot.Tier{addr(engines + g): snapshot.TierGPU}
		}
	}
	if got := read(t, x.Publish(), all); !equalState(got, want) {
		t.Fatalf("final state has %d hashes, want %d", len(got), len(want))
	}
}

// TestRun checks the builder loop: a change is published without a call to
// Publish, builds are spaced by the interval, and a quiet index does not
// rebuild.
func TestRun(t *testing.T) {
	const interval = 20 * time.Millisecond
	x := newIndex(t, Config{Interval: interval})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = x.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitFor("the first build", func() bool { return x.Image() != nil })
	_ = x.SetEndpoint(info(0))
	waitFor("the endpoint", func() bool { return x.Stats().Endpoints == 1 })

	// Changes arriving continuously: builds stay at least an interval
	// apart, measured on the builds' own start times.
	var built []time.Time
	start := x.Stats().Builds
	for i := 0; len(built) < 5; i++ {
		in := info(0)
		in.Running = i
		_ = x.SetEndpoint(in)
		if st := x.Stats(); len(built) == 0 || st.Built != built[len(built)-1] {
			built = append(built, st.Built)
		}
		time.Sleep(time.Millisecond)
	}
	for i := 1; i < len(built); i++ {
		if gap := built[i].Sub(built[i-1]); gap < interval {
			t.Fatalf("builds %v apart, interval %v", gap, interval)
		}
	}
	if n := x.Stats().Builds - start; n < 4 {
		t.Fatalf("%d builds", n)
	}

	// Quiet: after the pending change is published, no more builds.
	time.Sleep(2 * interval)
	quiet := x.Stats().Builds
	time.Sleep(3 * interval)
	if n := x.Stats().Builds; n != quiet {
		t.Fatalf("%d builds with nothing changed", n-quiet)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	x := newIndex(t, Config{Registerer: reg})
	addEndpoints(t, x, 2, Approximate)
	_ = x.SetMode(addr(1), Precise)
	x.Report(batch(t, report.Record{Endpoint: addr(0), Hashes: hs(1, 2, 3)}))
	im := x.Publish()
	want := map[string]float64{
		"kvroute_cachesync_snapshot_generation":         float64(im.Generation()),
		"kvroute_cachesync_index_entries":               3,
		"kvroute_cachesync_approx_entries":              3,
		"kvroute_cachesync_snapshot_bytes":              float64(im.Size()),
		"kvroute_cachesync_report_hashes_total":         3,
		"kvroute_cachesync_approx_added_total":          3,
		"kvroute_cachesync_snapshot_build_seconds":      1, // sample count
		"kvroute_cachesync_endpoints{mode=precise}":     1,
		"kvroute_cachesync_endpoints{mode=approximate}": 1,
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			name := mf.GetName()
			for _, l := range m.Label {
				name += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			switch {
			case m.Gauge != nil:
				got[name] = m.Gauge.GetValue()
			case m.Counter != nil:
				got[name] = m.Counter.GetValue()
			case m.Histogram != nil:
				got[name] = float64(m.Histogram.GetSampleCount())
			}
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if _, err := New(Config{Registerer: reg}); err == nil {
		t.Fatal("registering a second index's metrics in the same registry succeeded")
	}
}

// value reads a single counter or gauge.
func value(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var m dto.Metric
	if err := (<-ch).Write(&m); err != nil {
		panic(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// TestOutcomesGoToTheHook checks that outcome records in a report batch
// reach Config.OnOutcome with their endpoint, are counted as outcomes and
// never touch the prefix index; routing records for a known endpoint reach
// Config.OnRoute with their output.
func TestOutcomesGoToTheHook(t *testing.T) {
	type got struct {
		addr string
		o    report.Outcome
	}
	var seen []got
	var routed []string
	x := newIndex(t, Config{OnOutcome: func(a string, o report.Outcome) { seen = append(seen, got{a, o}) },
		OnRoute: func(e report.Entry) { routed = append(routed, string(e.Endpoint())+" "+strconv.Itoa(e.Output())) }})
	addEndpoints(t, x, 1, Approximate)
	out := report.Outcome{Endpoint: addr(0), Features: predict.Features{Uncached: 10, Running: 2}, Predicted: 0.5, Observed: 0.25}
	rec, err := report.AppendOutcome(nil, &out)
	if err != nil {
		t.Fatal(err)
	}
	var w report.Writer
	if _, err := w.AddEncoded(rec); err != nil {
		t.Fatal(err)
	}
	for _, r := range []report.Record{{Endpoint: addr(0), Hashes: hs(1), Output: 120}, {Endpoint: "10.9.9.9:1", Hashes: hs(2)}} {
		if err := w.Add(&r); err != nil {
			t.Fatal(err)
		}
	}
	bt, err := report.Parse(w.Bytes(), report.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	x.Report(bt)
	im := x.Publish()
	if want := []string{addr(0) + " 120"}; !slices.Equal(routed, want) {
		t.Errorf("route hook saw %q, want %q", routed, want)
	}
	out.Endpoint = ""
	if len(seen) != 1 || seen[0].addr != addr(0) || seen[0].o != out {
		t.Fatalf("hook saw %+v, want one outcome %+v for %s", seen, out, addr(0))
	}
	if got := read(t, im, hs(1)); !equalState(got, state{H(1): {addr(0): snapshot.TierGPU}}) {
		t.Errorf("index %v: want only the routing record's block", got)
	}
	for label, want := range map[string]float64{"applied": 1, "outcome": 1, "unknown_endpoint": 1} {
		if got := value(x.m.records.WithLabelValues(label)); got != want {
			t.Errorf("%s records = %v, want %v", label, got, want)
		}
	}
}

// TestRestarted: an approximate endpoint whose engine restarted forgets
// what reports taught it, keeps its capacity, and learns again; the other
// endpoints, and a precise one's events, are left alone.
func TestRestarted(t *testing.T) {
	x := newIndex(t, Config{DefaultCapacity: 4})
	addEndpoints(t, x, 3, Approximate)
	if err := x.SetMode(addr(2), Precise); err != nil {
		t.Fatal(err)
	}
	sink(t, x, addr(2)).Add(H(9), snapshot.TierGPU)
	x.Report(batch(t, report.Record{Endpoint: addr(0), Hashes: hs(1, 2)}, report.Record{Endpoint: addr(1), Hashes: hs(1)}))
	x.Publish()
	for _, a := range []string{addr(0), addr(2)} {
		if err := x.Restarted(a); err != nil {
			t.Fatal(err)
		}
	}
	want := state{H(1): {addr(1): snapshot.TierGPU}, H(9): {addr(2): snapshot.TierGPU}}
	if got := read(t, x.Publish(), hs(1, 2, 9)); !equalState(got, want) {
		t.Fatalf("after the restart: got %v, want %v", got, want)
	}
	x.Report(batch(t, report.Record{Endpoint: addr(0), Hashes: hs(3, 4, 5, 6, 7)}))
	// A prompt longer than the capacity keeps its head.
	for _, h := range hs(3, 4, 5, 6) {
		want[h] = map[string]snapshot.Tier{addr(0): snapshot.TierGPU}
	}
	if got := read(t, x.Publish(), hs(1, 2, 3, 4, 5, 6, 7, 9)); !equalState(got, want) {
		t.Fatalf("learning again, capacity 4: got %v, want %v", got, want)
	}
	if err := x.Restarted("nowhere:1"); err == nil {
		t.Fatal("Restarted accepted an unknown endpoint")
	}
}

// TestDecisions: the reported decisions are counted by reason, routing
// records only, whatever became of them in the index.
func TestDecisions(t *testing.T) {
	x := newIndex(t, Config{})
	addEndpoints(t, x, 1, Approximate)
	x.Report(batch(t,
		report.Record{Endpoint: addr(0), Hashes: hs(1), Reason: "affinity"},
		report.Record{Endpoint: addr(0), Hashes: hs(2), Reason: "affinity"},
		report.Record{Endpoint: addr(0), Hashes: hs(5), Reason: "moved"},
		report.Record{Endpoint: "10.9.9.9:1", Hashes: hs(3), Reason: "least-load"}, // unknown endpoint: counted all the same
		report.Record{Endpoint: addr(0), Hashes: hs(4)},
	))
	x.Publish()
	got := x.Decisions()
	want := map[string]uint64{"affinity": 2, "least-load": 1, "unknown": 1, "saturated-release": 0, "fallback": 0, "rendezvous": 0, "response": 0, "moved": 1}
	if !maps.Equal(got, want) {
		t.Errorf("Decisions = %v, want %v", got, want)
	}
}

// TestPrefixes: an endpoint's Prefixes counts the distinct first blocks of
// the prompts reports routed there within PrefixWindow that its index
// holds; a prefix reported before its engine's event counts once the event
// comes, one evicted or silent for the window stops counting.
func TestPrefixes(t *testing.T) {
	x := newIndex(t, Config{})
	clock := time.Unix(1_790_000_000, 0)
	x.now = func() time.Time { return clock }
	addEndpoints(t, x, 2, Precise)
	a := sink(t, x, addr(0))
	prefixes := func() [2]int {
		t.Helper()
		m := viewOf(t, x.Publish()).Manifest()
		var n [2]int
		for i := range m.NumEndpoints() {
			switch m.Endpoint(i).Addr() {
			case addr(0):
				n[0] = m.Endpoint(i).Prefixes()
			case addr(1):
				n[1] = m.Endpoint(i).Prefixes()
			}
		}
		return n
	}
	for _, h := range hs(1, 2, 3, 10, 11, 20) {
		a.Add(h, snapshot.TierGPU)
	}
	x.Report(batch(t,
		report.Record{Endpoint: addr(0), Hashes: hs(1, 2, 3)},
		report.Record{Endpoint: addr(0), Hashes: hs(1, 2, 4)}, // the same prefix, another question
		report.Record{Endpoint: addr(0), Hashes: hs(10, 11)},
		report.Record{Endpoint: addr(0), Hashes: hs(30, 31)}, // its engine's event has not come
		report.Record{Endpoint: addr(1), Hashes: hs(40)},     // nor here
	))
	if got := prefixes(); got != [2]int{2, 0} {
		t.Fatalf("prefixes %v, want [2 0]: 20 held but never reported, 30 reported but not held", got)
	}
	a.Add(H(30), snapshot.TierGPU)
	if got := prefixes(); got != [2]int{3, 0} {
		t.Fatalf("once 30 is stored: %v, want [3 0]", got)
	}
	a.Remove(H(10), snapshot.TierGPU)
	clock = clock.Add(PrefixWindow / 2)
	x.Report(batch(t, report.Record{Endpoint: addr(0), Hashes: hs(1, 2)}))
	if got := prefixes(); got != [2]int{2, 0} {
		t.Fatalf("after 10's eviction: %v, want [2 0]", got)
	}
	clock = clock.Add(PrefixWindow/2 + time.Millisecond)
	if got := prefixes(); got != [2]int{1, 0} {
		t.Fatalf("a window after: %v, want [1 0], the prefix reported since", got)
	}
	a.Clear()
	if got := prefixes(); got != [2]int{0, 0} {
		t.Fatalf("after Clear: %v, want none", got)
	}
	ep := x.eps[addr(1)]
	for i := range MaxPrefixes + 10 {
		x.noteRoot(ep, H(uint64(1000+i)), clock.UnixNano())
	}
	if len(ep.roots) != MaxPrefixes {
		t.Errorf("%d prefixes remembered, want the bound, %d", len(ep.roots), MaxPrefixes)
	}
}

// TestPrefixesByTrafficShare: a prefix held by several endpoints counts at
// each by its share of the traffic reported to them. A copy made by one
// request counts next to nothing beside its owner's twenty, and a prefix
// sent evenly to two counts half at each.
func TestPrefixesByTrafficShare(t *testing.T) {
	x := newIndex(t, Config{})
	clock := time.Unix(1_790_000_000, 0)
	x.now = func() time.Time { return clock }
	addEndpoints(t, x, 2, Precise)
	a, b := sink(t, x, addr(0)), sink(t, x, addr(1))
	prefixes := func() [2]int {
		t.Helper()
		m := viewOf(t, x.Publish()).Manifest()
		var n [2]int
		for i := range m.NumEndpoints() {
			for j := range n {
				if m.Endpoint(i).Addr() == addr(j) {
					n[j] = m.Endpoint(i).Prefixes()
				}
			}
		}
		return n
	}
	// 1, 2 and 3 are the first endpoint's, 4 the second's, and a request of
	// 1 went once to the second (a copy).
	for _, h := range hs(1, 2, 3) {
		a.Add(h, snapshot.TierGPU)
	}
	b.Add(H(1), snapshot.TierGPU)
	b.Add(H(4), snapshot.TierGPU)
	var recs []report.Record
	for range 20 {
		recs = append(recs, report.Record{Endpoint: addr(0), Hashes: hs(1, 100)})
	}
	recs = append(recs,
		report.Record{Endpoint: addr(0), Hashes: hs(2, 101)},
		report.Record{Endpoint: addr(0), Hashes: hs(3, 102)},
		report.Record{Endpoint: addr(1), Hashes: hs(1, 103)},
		report.Record{Endpoint: addr(1), Hashes: hs(4, 104)},
	)
	x.Report(batch(t, recs...))
	if got := prefixes(); got != [2]int{3, 1} {
		t.Fatalf("prefixes %v, want [3 1]: the copy of 1 counts at its owner", got)
	}
	// 5 and 6 go to both evenly, as a hot prefix spread over two does:
	// half of each at each.
	for _, h := range hs(5, 6) {
		a.Add(h, snapshot.TierGPU)
		b.Add(h, snapshot.TierGPU)
	}
	x.Report(batch(t,
		report.Record{Endpoint: addr(0), Hashes: hs(5, 105)},
		report.Record{Endpoint: addr(1), Hashes: hs(5, 106)},
		report.Record{Endpoint: addr(0), Hashes: hs(6, 107)},
		report.Record{Endpoint: addr(1), Hashes: hs(6, 108)},
	))
	if got := prefixes(); got != [2]int{4, 2} {
		t.Fatalf("prefixes %v, want [4 2]: 5 and 6 count half at each", got)
	}
	// The owner evicts 1: the copy now draws all of 1's traffic there is.
	a.Remove(H(1), snapshot.TierGPU)
	if got := prefixes(); got != [2]int{3, 3} {
		t.Fatalf("prefixes %v, want [3 3] once only the copy holds 1", got)
	}
}
