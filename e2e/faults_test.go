package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/e2e/vllmsim"
)

// streamed is one streamed request's fate.
type streamed struct {
	start    time.Time
	chosen   string // the filter's choice
	served   string // where Envoy sent it in the end
	complete bool   // 200 and the stream ended with [DONE]
}

// streamChat sends a streamed chat request and reads it to the end.
func streamChat(client *http.Client, url, system, user string, maxTokens int) streamed {
	r := streamed{start: time.Now()}
	b, _ := json.Marshal(map[string]any{
		"model": simModel, "max_tokens": maxTokens, "stream": true,
		"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}},
	})
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		return r
	}
	defer resp.Body.Close()
	r.chosen = field(resp.Header.Get("x-kvroute-decision"), "endpoint")
	r.served = resp.Header.Get("x-gateway-destination-endpoint-served")
	sc := bufio.NewScanner(resp.Body)
	last := ""
	for sc.Scan() {
		if line := sc.Text(); line != "" {
			last = line
		}
	}
	r.complete = resp.StatusCode == http.StatusOK && sc.Err() == nil && last == "data: [DONE]"
	return r
}

// faultTenant is one of six tenants whose long system prompts the fault
// tests' clients rotate through.
func faultTenant(i int) string {
	return "Tenant " + strconv.Itoa(i%6) + " rules. " + strings.Repeat("Quote the policy you apply. ", 40)
}

// streamUnderFault runs three engines behind cachesync and the gateway,
// warms each tenant, streams 6 clients' requests through it, applies fault
// 3 s in, and stops the clients 5 s later. It returns the requests' fates,
// the engines, cachesync and the time the fault was complete: an engine
// being stopped still accepts requests until its listener closes, and
// fails them as it goes.
func streamUnderFault(t *testing.T, maxTokens int, fault func(es []*vllmsim.Engine)) ([]streamed, []*vllmsim.Engine, *runningDaemon, *gateway, time.Time) {
	t.Helper()
	es := startEngines(t, 3, vllmsim.Config{NumGPUBlocks: 1024, TimeScale: 0.05})
	cs := startCachesync(t, "127.0.0.1:0", es, true)
	g := cachesyncGateway(t, es, cs.addr, nil)
	for i := range 6 {
		post(t, g.client, g.url, simChat(faultTenant(i), "warm", 1))
	}
	var mu sync.Mutex
	var results []streamed
	stop := clients(t, 6, func(c, i int) {
		r := streamChat(g.client, g.url, faultTenant(c+i), "client "+strconv.Itoa(c)+" question "+strconv.Itoa(i), maxTokens)
		mu.Lock()
		results = append(results, r)
		mu.Unlock()
	})
	time.Sleep(3 * time.Second)
	fault(es)
	at := time.Now()
	time.Sleep(5 * time.Second)
	stop()
	return results, es, cs, g, at
}

// inflightReleased waits for the gateway's count of requests in flight to
// come back to 0 once the clients have stopped: every stream, the failed
// ones included, gave back what the policy counts against its endpoint.
func inflightReleased(t *testing.T, g *gateway) {
	t.Helper()
	var n int64
	waitFor(t, 5*time.Second, "no request in flight", func() bool {
		s, err := g.envoy.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		n = s["wasmcustom.kvroute.inflight.requests"]
		return n == 0
	})
}

// TestFaultEngineKilledMidStream: an engine dies while it streams answers
// under load. The streams it held fail, as the engine failed them; every
// other request is answered (one routed to the dead engine before the
// router knew is retried on the next endpoint of the filter's list); after
// the scrapes miss it and a snapshot says so, no request is routed there
// at all; and nothing stays counted in flight.
func TestFaultEngineKilledMidStream(t *testing.T) {
	// The engine is dead once Close returns: until then it may still
	// accept a connection, and fail it as it goes.
	var killed time.Time
	var dead *vllmsim.Engine
	results, _, _, g, _ := streamUnderFault(t, 300, func(es []*vllmsim.Engine) {
		// Kill one mid-answer, whichever is decoding: a request still
		// before its first token is retried by Envoy, not cut; once (on a
		// noisy host) the engine's requests were all there at the kill,
		// and once (under the race detector, 2026-12-07) the engine the
		// test always killed had no request left when it did.
		dead = es[1]
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if e := busiestDecoder(es); e != nil {
				time.Sleep(30 * time.Millisecond) // some tokens out, at 0.05 time scale
				if e.Queue().Decoding > 0 {
					dead = e
					break
				}
			}
		}
		dead.Close()
		killed = time.Now()
	})
	victim := dead.Addr()
	inflightReleased(t, g)

	// The router knows once three scrapes (200 ms apart) have missed and a
	// snapshot (100 ms) has been fetched: well within 2 s.
	known := killed.Add(2 * time.Second)
	var onVictim, victimFailed, retried, otherFailed, lateToVictim, total int
	for _, r := range results {
		total++
		switch {
		case r.start.Before(killed) && r.served == victim:
			onVictim++
			if !r.complete {
				victimFailed++
			}
		case !r.complete:
			otherFailed++
			t.Errorf("a request started %v after the kill, chosen %s, served by %s, failed", r.start.Sub(killed).Round(time.Millisecond), r.chosen, r.served)
		case r.chosen == victim && r.served != victim:
			retried++
		}
		if r.start.After(known) && (r.chosen == victim || r.served == victim) {
			lateToVictim++
		}
	}
	t.Logf("%d streamed requests: %d were on the killed engine before it died, %d of them cut off (the engine's failure); "+
		"%d routed to it after its death and retried on the next endpoint; %d failed otherwise; %d routed to it 2 s after its death",
		total, onVictim, victimFailed, retried, otherFailed, lateToVictim)
	if onVictim == 0 || victimFailed == 0 {
		t.Errorf("the kill cut no stream (%d on the engine): the test proves nothing", onVictim)
	}
	if lateToVictim > 0 {
		t.Errorf("%d requests still went to the dead engine 2 s after it died", lateToVictim)
	}
}

// busiestDecoder returns the engine decoding the most requests, nil when
// none is decoding.
func busiestDecoder(es []*vllmsim.Engine) *vllmsim.Engine {
	var best *vllmsim.Engine
	most := 0
	for _, e := range es {
		if n := e.Queue().Decoding; n > most {
			best, most = e, n
		}
	}
	return best
}

// freezer is a TCP proxy in front of an engine's HTTP port that can stop
// answering while keeping the port: connections are accepted and held,
// nothing is forwarded, as from an engine wedged in a CUDA call.
type freezer struct {
	ln     net.Listener
	target string
	frozen atomic.Bool
}

func newFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, target: target}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go f.serve(c)
		}
	}()
	return f
}

func (f *freezer) addr() string { return f.ln.Addr().String() }

func (f *freezer) serve(c net.Conn) {
	defer c.Close()
	if f.frozen.Load() {
		io.Copy(io.Discard, c) // held until the client gives up
		return
	}
	u, err := net.Dial("tcp", f.target)
	if err != nil {
		return
	}
	defer u.Close()
	go func() {
		f.pipe(u, c)
		u.Close()
	}()
	f.pipe(c, u)
}

// pipe copies src to dst until the freezer freezes; from then on it reads
// and drops, so that a pooled connection hangs as a new one does.
func (f *freezer) pipe(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !f.frozen.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestFaultEngineBlackHole: an engine stops answering but keeps its port.
// Requests already sent there are lost (they time out at the client); the
// scrapes time out too, the engine is marked unhealthy within a second,
// and no request is routed there after that.
func TestFaultEngineBlackHole(t *testing.T) {
	es := startEngines(t, 3, vllmsim.Config{NumGPUBlocks: 1024, TimeScale: 0.05})
	fz := newFreezer(t, es[2].Addr())
	spec := []string{}
	addrs := []string{}
	for i, e := range es {
		a := e.Addr()
		if i == 2 {
			a = fz.addr()
		}
		addrs = append(addrs, a)
		spec = append(spec, a+"?events="+e.EventsEndpoint()+"&replay="+e.ReplayEndpoint())
	}
	cs := startDaemon(t, "127.0.0.1:0", spec, true)
	g := cachesyncGatewayFor(t, addrs, cs.addr, nil)
	client := &http.Client{Timeout: 3 * time.Second}
	tenant := faultTenant
	for i := range 6 {
		post(t, g.client, g.url, simChat(tenant(i), "warm", 1))
	}
	waitFor(t, 10*time.Second, "routing by snapshot", func() bool {
		return strings.Contains(probe(t, g, tenant(0), "q"), "reason=")
	})

	type outcome struct {
		start  time.Time
		chosen string
		ok     bool
	}
	var mu sync.Mutex
	var results []outcome
	stop := clients(t, 6, func(c, i int) {
		start := time.Now()
		code, d, err := tryPost(client, g.url, simChat(tenant(c+i), "client "+strconv.Itoa(c)+" question "+strconv.Itoa(i), 8))
		mu.Lock()
		results = append(results, outcome{start: start, chosen: field(d, "endpoint"), ok: err == nil && code == http.StatusOK})
		mu.Unlock()
	})
	time.Sleep(2 * time.Second)
	frozen := time.Now()
	fz.frozen.Store(true)
	time.Sleep(6 * time.Second)
	stop()
	inflightReleased(t, g)

	// Three scrapes of 200 ms time out, then a snapshot: within 1.5 s.
	known := frozen.Add(1500 * time.Millisecond)
	// A request into the black hole times out at the client without a
	// response, so without the filter's header: every failure of a request
	// started before the router knew is the black hole's, any later one
	// the router's.
	var lost, late, total int
	for _, r := range results {
		total++
		switch {
		case !r.ok && r.start.Before(known):
			lost++
		case !r.ok || r.chosen == fz.addr() && r.start.After(known):
			late++
			t.Errorf("a request started %v after the freeze, chosen %q, failed or went to the frozen engine", r.start.Sub(frozen).Round(time.Millisecond), r.chosen)
		}
	}
	t.Logf("%d requests: %d lost in the black hole before it was known (the engine's failure), %d failed or went there 1.5 s after it froze",
		total, lost, late)
	if lost == 0 {
		t.Error("no request went into the black hole: the test proves nothing")
	}
}

// TestFaultEngineRestarted: an engine restarts under load (a new process
// on the same ports: its cache empty, its event sequence numbers back at
// 0, no event saying it lost anything). The streams it held fail; every
// other request is answered; cachesync notices the restart and drops the
// engine's index entries, so prefixes it no longer holds stop drawing
// requests to it, and it is indexed again from its new events.
func TestFaultEngineRestarted(t *testing.T) {
	results, es, cs, _, restarted := streamUnderFault(t, 200, func(es []*vllmsim.Engine) {
		if err := es[0].Restart(); err != nil {
			t.Error(err)
		}
	})
	target := es[0]

	var cut, otherFailed, after, afterOnTarget int
	for _, r := range results {
		switch {
		case !r.complete && r.served == target.Addr() && r.start.Before(restarted):
			cut++
		case !r.complete:
			otherFailed++
			t.Errorf("a request started %v after the restart, chosen %s, served by %s, failed", r.start.Sub(restarted).Round(time.Millisecond), r.chosen, r.served)
		}
		if r.start.After(restarted.Add(2 * time.Second)) {
			after++
			if r.served == target.Addr() {
				afterOnTarget++
			}
		}
	}
	t.Logf("%d streamed requests: %d cut off by the restart (the engine's failure), %d failed otherwise; "+
		"from 2 s after it, %d of %d went to the restarted engine", len(results), cut, otherFailed, afterOnTarget, after)
	if afterOnTarget == 0 {
		t.Error("the restarted engine was never used again")
	}
	// cachesync saw the restart and reset the engine's entries, and knew it
	// for a restart: its replay socket had answered before, so nothing to
	// replay at the old sequence numbers means they went back, not an
	// unverified break.
	m := metrics(t, "http://"+cs.addr+"/metrics")
	proved, _ := sample(m, `kvroute_cachesync_kv_event_resets_total{reason="restart"}`)
	unverified, _ := sample(m, `kvroute_cachesync_kv_event_resets_total{reason="unverified"}`)
	t.Logf("index resets: %v as a restart, %v as an unverified break", proved, unverified)
	if proved < 1 || unverified != 0 {
		t.Error("cachesync did not reset the restarted engine's index entries as a restart")
	}
}

// engineShare counts a load's requests by phase: sent, failed, and sent to
// one engine.
type engineShare struct {
	mu      sync.Mutex
	addr    string
	phase   int
	windows [3]struct {
		sent, failed int
		to           map[string]int // requests by the endpoint chosen
	}
}

func (s *engineShare) record(chosen string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := &s.windows[s.phase]
	w.sent++
	if !ok {
		w.failed++
	}
	if w.to == nil {
		w.to = map[string]int{}
	}
	w.to[chosen]++
}

// next starts the next phase.
func (s *engineShare) next() {
	s.mu.Lock()
	s.phase++
	s.mu.Unlock()
}

// share returns phase p's share of the requests that went to the engine,
// and the requests sent.
func (s *engineShare) share(p int) (float64, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.windows[p]
	return float64(w.to[s.addr]) / float64(max(w.sent, 1)), w.sent
}

// busiest makes the engine the endpoint that drew the most requests in
// phase p, and returns it.
func (s *engineShare) busiest(p int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addr = ""
	for ep, n := range s.windows[p].to {
		if ep != "" && (s.addr == "" || n > s.windows[p].to[s.addr]) {
			s.addr = ep
		}
	}
	return s.addr
}

// spread returns phase p's requests by endpoint, for the log.
func (s *engineShare) spread(p int) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.windows[p].to)
}

func (s *engineShare) failed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.windows[0].failed + s.windows[1].failed + s.windows[2].failed
}

// TestFaultSlowDecoder: an engine of a pool that mostly decodes slows down
// eightfold. Its decoding intervals run eight times what its deployment's
// fitted model predicts while its peers' run as predicted, so cachesync
// scales its model (package pace) and says so; priced as slow as it runs,
// it loses nearly all its share, and no request fails. Nothing else would
// move its traffic soon: the shared fit learns from all three engines,
// and the requests share no more than their template's first block.
func TestFaultSlowDecoder(t *testing.T) {
	es := startEngines(t, 3, vllmsim.Config{NumGPUBlocks: 1024, TimeScale: 1})
	cs := startCachesync(t, "127.0.0.1:0", es, true)
	g := cachesyncGateway(t, es, cs.addr, nil)
	load := &engineShare{} // phases: before, while cachesync learns, after
	stop := clients(t, 6, func(c, i int) {
		r := streamChat(g.client, g.url, "Answer at length.", "client "+strconv.Itoa(c)+" question "+strconv.Itoa(i), 48)
		load.record(r.chosen, r.complete)
	})
	// The deployment's ITL fit needs predict.MinSamples intervals.
	time.Sleep(8 * time.Second)
	load.next()
	// The engine slowed is the one drawing the most. The requests share
	// their template's first block, so the first two engines to hold it
	// may keep all six clients: in 2 of 6 runs on 2026-12-07 the third,
	// healthy and idle, drew none (no copy there ever priced lower),
	// and when that was es[0] the test proved nothing.
	busiest := load.busiest(0)
	i := slices.IndexFunc(es, func(e *vllmsim.Engine) bool { return e.Addr() == busiest })
	if i < 0 {
		t.Fatalf("no engine drew requests before the slowdown: %v", load.spread(0))
	}
	slow := es[i]
	slow.SetSlowdown(8)
	slowdown := func(e *vllmsim.Engine) float64 {
		v, _ := sample(metrics(t, "http://"+cs.addr+"/metrics"), `kvroute_cachesync_engine_slowdown_ratio{engine="`+e.Addr()+`"}`)
		return v
	}
	// Three times in make test (2026-12-07) the model was not scaled within
	// 45 s (4-12 s alone or beside a few other packages' tests). The second
	// time the engine slowed, es[0] then, drew none of 539 requests
	// meanwhile; the third time none of 541, and none before it was slowed
	// either (above): with no interval to learn from, the pace cannot
	// move. Should the slowed engine lose its traffic some faster way, only
	// the share below can be judged; with requests to learn from, an
	// unscaled model is the pace's failure.
	took, scaled := poll(45*time.Second, func() bool { return slowdown(slow) > 2 })
	if learning, sent := load.share(1); !scaled && learning > 0 {
		t.Fatalf("the slowed engine's model was not scaled within 45 s; meanwhile %d requests, %.0f%% to it, %d failed",
			sent, 100*learning, load.failed())
	} else if !scaled {
		t.Logf("the slowed engine drew none of %d requests in 45 s: its traffic left before its pace could be learned", sent)
	}
	load.next()
	time.Sleep(6 * time.Second)
	stop()

	before, sentBefore := load.share(0)
	after, sentAfter := load.share(2)
	t.Logf("before: %d requests, %.0f%% to the engine (by endpoint %v); slowed 8x: scaled %.1fx after %v, then %d requests, %.0f%% to it",
		sentBefore, 100*before, load.spread(0), slowdown(slow), took.Round(100*time.Millisecond), sentAfter, 100*after)
	if n := load.failed(); n > 0 {
		t.Errorf("%d requests failed", n)
	}
	for _, e := range es {
		if e == slow {
			continue
		}
		if s := slowdown(e); s != 1 {
			t.Errorf("engine %s, not slowed, priced %.2fx slower", e.Addr(), s)
		}
	}
	if before < 0.2 {
		t.Fatalf("the engine took %.0f%% of the requests before: the test proves nothing", 100*before)
	}
	// Unpriced (pace.Band set out of reach), it kept 10% from 33-34% in two
	// runs; priced, 1-5% from 33-49% in five.
	if after > before/4 {
		t.Errorf("slowed and priced so, the engine still took %.0f%% of the requests (%.0f%% before)", 100*after, 100*before)
	}
}

// TestFaultSlowEngine: an engine slows down eightfold under load (a
// throttled GPU). Its requests stay in flight eight times as long, the
// price of staying with the prefixes it holds outgrows going elsewhere,
// and affinity releases: its share of the requests falls below half an
// even share and by a third or more of its own, and no request fails.
//
// Not by half of its own: at this time scale no scrape interval is
// decode-only, so the deployment's ITL model is never fitted and the
// engine's pace (TestFaultSlowDecoder) cannot move; what moves the traffic
// is the requests the engine holds, and the share settles where those
// price its prefixes away: 9-12% of the requests, from 19-36% before.
// Held to half, the test failed whenever the warm-up gave the engine fewer
// tenants.
func TestFaultSlowEngine(t *testing.T) {
	es := startEngines(t, 3, vllmsim.Config{NumGPUBlocks: 1024, TimeScale: 0.05})
	cs := startCachesync(t, "127.0.0.1:0", es, true)
	g := cachesyncGateway(t, es, cs.addr, nil)
	for i := range 6 {
		post(t, g.client, g.url, simChat(faultTenant(i), "warm", 1))
	}
	slow := es[0]
	load := &engineShare{addr: slow.Addr()} // phases: before, while the queue builds, after
	stop := clients(t, 6, func(c, i int) {
		code, d, err := tryPost(g.client, g.url, simChat(faultTenant(c+i), "client "+strconv.Itoa(c)+" question "+strconv.Itoa(i), 32))
		load.record(field(d, "endpoint"), err == nil && code == http.StatusOK)
	})
	time.Sleep(4 * time.Second)
	load.next()
	slow.SetSlowdown(8)
	time.Sleep(2 * time.Second) // the engine's queue builds, its scrapes say so
	load.next()
	time.Sleep(5 * time.Second)
	stop()

	before, sentBefore := load.share(0)
	after, sentAfter := load.share(2)
	t.Logf("before: %d requests, %.0f%% to the engine; slowed 8x: %d requests, %.0f%% to it", sentBefore, 100*before, sentAfter, 100*after)
	if n := load.failed(); n > 0 {
		t.Errorf("%d requests failed", n)
	}
	if before < 0.15 {
		t.Fatalf("the engine took %.0f%% of the requests before: the test proves nothing", 100*before)
	}
	if testing.Short() {
		// The race pass: the detector slows cachesync and the clients
		// about twofold, so the 5 s after the slowdown carry half the
		// requests and the share is still settling (13-19% there, 8-12%
		// in the full pass, which holds the bar).
		return
	}
	if after > 1.0/6 || after > before*2/3 {
		t.Errorf("slowed, the engine still took %.0f%% of the requests (%.0f%% before)", 100*after, 100*before)
	}
}
