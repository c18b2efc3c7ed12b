package discovery

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// dnsServer is an authoritative DNS server on loopback UDP that answers
// from records a test changes as it goes, in the real wire format, so the
// resolver under test is Go's own.
type dnsServer struct {
	pc net.PacketConn

	mu      sync.Mutex
	ips     map[string][]netip.Addr // A and AAAA
	srv     map[string][]net.SRV
	failing map[string]bool // answer SERVFAIL
}

func startDNS(t *testing.T) *dnsServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &dnsServer{pc: pc, ips: map[string][]netip.Addr{}, srv: map[string][]net.SRV{}, failing: map[string]bool{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if resp, err := s.answer(buf[:n]); err == nil {
				pc.WriteTo(resp, from)
			}
		}
	}()
	t.Cleanup(func() { pc.Close(); <-done })
	return s
}

// resolver returns a Go resolver that asks only this server.
func (s *dnsServer) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", s.pc.LocalAddr().String())
	}}
}

func (s *dnsServer) set(f func(s *dnsServer)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

func (s *dnsServer) answer(req []byte) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(req)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	name := strings.ToLower(q.Name.String())
	ips, hasIPs := s.ips[name]
	srvs, hasSRV := s.srv[name]
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	switch {
	case s.failing[name]:
		rh.RCode = dnsmessage.RCodeServerFailure
	case !hasIPs && !hasSRV:
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	if rh.RCode == dnsmessage.RCodeSuccess {
		rr := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}
		switch q.Type {
		case dnsmessage.TypeA, dnsmessage.TypeAAAA:
			for _, ip := range ips {
				switch {
				case ip.Is4() && q.Type == dnsmessage.TypeA:
					err = b.AResource(rr, dnsmessage.AResource{A: ip.As4()})
				case ip.Is6() && q.Type == dnsmessage.TypeAAAA:
					err = b.AAAAResource(rr, dnsmessage.AAAAResource{AAAA: ip.As16()})
				}
				if err != nil {
					return nil, err
				}
			}
		case dnsmessage.TypeSRV:
			for _, srv := range srvs {
				target, err := dnsmessage.NewName(srv.Target)
				if err != nil {
					return nil, err
				}
				if err := b.SRVResource(rr, dnsmessage.SRVResource{Priority: srv.Priority, Weight: srv.Weight, Port: srv.Port, Target: target}); err != nil {
					return nil, err
				}
			}
		}
	}
	return b.Finish()
}

// runSource runs src until the test ends and returns its channel.
func runSource(t *testing.T, src Source) <-chan []Engine {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan []Engine)
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, out) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return out
}

// quiet checks that no set arrives for a while.
func quiet(t *testing.T, out <-chan []Engine, d time.Duration) {
	t.Helper()
	select {
	case es := <-out:
		t.Fatalf("unexpected set %+v", es)
	case <-time.After(d):
	}
}

// waitFor polls cond until it holds or the test times out.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func TestDNSARecords(t *testing.T) {
	srv := startDNS(t)
	const name = "vllm.kvroute.test."
	srv.set(func(s *dnsServer) { s.ips[name] = addrs("127.0.0.11", "127.0.0.12", "2001:db8::1") })
	d := &DNS{Name: name, Port: 8000, Events: EventPorts{Pub: 5557, Replay: 5600, DPSize: 2},
		Interval: 20 * time.Millisecond, Resolver: srv.resolver(), Logger: discard}
	out := runSource(t, d)

	ev := func(ip string) []EventEndpoint {
		h := netip.MustParseAddr(ip).String()
		if strings.Contains(h, ":") {
			h = "[" + h + "]"
		}
		return []EventEndpoint{
			{Rank: 0, Pub: "tcp://" + h + ":5557", Replay: "tcp://" + h + ":5600"},
			{Rank: 1, Pub: "tcp://" + h + ":5558", Replay: "tcp://" + h + ":5601"},
		}
	}
	want := []Engine{
		{Addr: "127.0.0.11:8000", Name: name, Events: ev("127.0.0.11")},
		{Addr: "127.0.0.12:8000", Name: name, Events: ev("127.0.0.12")},
		{Addr: "[2001:db8::1]:8000", Name: name, Events: ev("2001:db8::1")},
	}
	if got := next(t, out); !reflect.DeepEqual(got, want) {
		t.Fatalf("first set\ngot  %+v\nwant %+v", got, want)
	}
	quiet(t, out, 100*time.Millisecond) // unchanged answers send nothing

	// A pod replaced by another.
	srv.set(func(s *dnsServer) { s.ips[name] = addrs("127.0.0.12", "127.0.0.13") })
	want = []Engine{
		{Addr: "127.0.0.12:8000", Name: name, Events: ev("127.0.0.12")},
		{Addr: "127.0.0.13:8000", Name: name, Events: ev("127.0.0.13")},
	}
	// A change landing between the A and the AAAA lookup of one round
	// sends a set of both answers first; the next round is whole.
	sets := 2
	for got := next(t, out); !reflect.DeepEqual(got, want); got = next(t, out) {
		if sets++; sets > 3 {
			t.Fatalf("after a change\ngot  %+v\nwant %+v", got, want)
		}
	}

	// A failing server keeps the engines.
	errs := d.Counters().Errors
	srv.set(func(s *dnsServer) { s.failing[name] = true })
	waitFor(t, "a failed lookup", func() bool { return d.Counters().Errors > errs+1 })
	quiet(t, out, 50*time.Millisecond)

	// The name gone: no engines.
	srv.set(func(s *dnsServer) { delete(s.failing, name); delete(s.ips, name) })
	if got := next(t, out); len(got) != 0 {
		t.Fatalf("after NXDOMAIN: %+v, want no engines", got)
	}
	sets++
	// The counter moves just after the set is handed over.
	waitFor(t, "every update counted", func() bool { return d.Counters().Updates >= uint64(sets) })
	if c := d.Counters(); c.Updates != uint64(sets) {
		t.Errorf("counters %+v, want %d updates", c, sets)
	}
}

func TestDNSSRVRecords(t *testing.T) {
	srv := startDNS(t)
	const name = "_http._tcp.vllm.kvroute.test."
	srv.set(func(s *dnsServer) {
		s.srv[name] = []net.SRV{
			{Target: "pod-a.vllm.kvroute.test.", Port: 8000, Priority: 10, Weight: 50},
			{Target: "pod-b.vllm.kvroute.test.", Port: 8001, Priority: 10, Weight: 50},
		}
		s.ips["pod-a.vllm.kvroute.test."] = addrs("127.0.0.21")
		s.ips["pod-b.vllm.kvroute.test."] = addrs("127.0.0.22")
	})
	d := &DNS{Name: name, Events: EventPorts{Pub: 5557}, Interval: 20 * time.Millisecond, Resolver: srv.resolver(), Logger: discard}
	out := runSource(t, d)
	want := []Engine{
		{Addr: "127.0.0.21:8000", Name: "pod-a.vllm.kvroute.test.", Events: []EventEndpoint{{Pub: "tcp://127.0.0.21:5557"}}},
		{Addr: "127.0.0.22:8001", Name: "pod-b.vllm.kvroute.test.", Events: []EventEndpoint{{Pub: "tcp://127.0.0.22:5557"}}},
	}
	if got := next(t, out); !reflect.DeepEqual(got, want) {
		t.Fatalf("first set\ngot  %+v\nwant %+v", got, want)
	}

	// One target failing to resolve keeps the whole set: dropping its
	// engine would clear its part of the index.
	errs := d.Counters().Errors
	srv.set(func(s *dnsServer) { s.failing["pod-b.vllm.kvroute.test."] = true })
	waitFor(t, "a failed lookup", func() bool { return d.Counters().Errors > errs+1 })
	quiet(t, out, 50*time.Millisecond)

	// A target that no longer exists is gone.
	srv.set(func(s *dnsServer) {
		delete(s.failing, "pod-b.vllm.kvroute.test.")
		delete(s.ips, "pod-b.vllm.kvroute.test.")
	})
	if got := next(t, out); !reflect.DeepEqual(got, want[:1]) {
		t.Fatalf("after a target went\ngot  %+v\nwant %+v", got, want[:1])
	}
}

func TestDNSConfigErrors(t *testing.T) {
	for _, d := range []*DNS{
		{},
		{Name: "x.", Port: 70000},
		{Name: "x.", Port: 8000, Events: EventPorts{Replay: 5558}},
	} {
		if err := d.Run(context.Background(), nil); err == nil {
			t.Errorf("Run(%+v) started", d)
		}
	}
}

// TestDNSStopsWithContext checks that Run returns promptly when ctx ends,
// even while the receiver is not reading.
func TestDNSStopsWithContext(t *testing.T) {
	srv := startDNS(t)
	srv.set(func(s *dnsServer) { s.ips["x.kvroute.test."] = addrs("127.0.0.1") })
	d := &DNS{Name: "x.kvroute.test.", Port: 8000, Interval: time.Millisecond, Resolver: srv.resolver(), Logger: discard}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- d.Run(ctx, make(chan []Engine)) }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after ctx ended")
	}
}

// TestDNSPublishersConnect: engines whose publishers connect all name
// cachesync's listen endpoint; their replay sockets stay on their own IPs.
func TestDNSPublishersConnect(t *testing.T) {
	srv := startDNS(t)
	const name = "vllm.kvroute.test."
	srv.set(func(s *dnsServer) { s.ips[name] = addrs("127.0.0.11", "127.0.0.12") })
	d := &DNS{Name: name, Port: 8000, Events: EventPorts{Listen: "tcp://0.0.0.0:5557", Replay: 5600},
		Interval: 20 * time.Millisecond, Resolver: srv.resolver(), Logger: discard}
	want := []Engine{
		{Addr: "127.0.0.11:8000", Name: name, Events: []EventEndpoint{{Pub: "tcp://0.0.0.0:5557", Listen: true, Replay: "tcp://127.0.0.11:5600"}}},
		{Addr: "127.0.0.12:8000", Name: name, Events: []EventEndpoint{{Pub: "tcp://0.0.0.0:5557", Listen: true, Replay: "tcp://127.0.0.12:5600"}}},
	}
	if got := next(t, runSource(t, d)); !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
}
