// Package discovery finds the inference engines cachesync watches, as they
// come and go: from a static list, from the DNS records of a headless
// Service, or from a Service's Kubernetes EndpointSlices.
//
// Every Source reports the whole current set of engines, never a diff, so a
// consumer that misses an update loses nothing: the next one says it all.
package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
)

// Engine is one engine as discovery sees it.
type Engine struct {
	// Addr is the engine's HTTP address, ip:port: the endpoint's identity
	// in the snapshot and the value of x-gateway-destination-endpoint.
	Addr string
	// Name says where the engine came from (a pod or an SRV target), for
	// logs; it may be empty.
	Name string
	// Events lists the engine's KV-event sockets, one per data-parallel
	// rank; empty when the engine publishes no events.
	Events []EventEndpoint
	// Draining marks an engine that is going away (a terminating pod): it
	// finishes what it has and must get no new work.
	Draining bool
}

// EventEndpoint is the pair of ZeroMQ sockets of one data-parallel rank.
type EventEndpoint struct {
	Rank int
	// Pub is the engine's PUB socket, e.g. tcp://10.0.0.1:5557, which
	// cachesync connects to; with Listen, the local endpoint cachesync
	// binds and the engine's PUB connects to, e.g. tcp://0.0.0.0:5557.
	Pub    string
	Listen bool
	Replay string // replay ROUTER socket; "" when the engine has none
}

// Source reports the engines to watch.
type Source interface {
	// Run sends the current set of engines, sorted by Addr, once at the
	// start and again after every change, until ctx ends; then it returns
	// nil. It returns an error only if it cannot start at all.
	Run(ctx context.Context, out chan<- []Engine) error
	// Counters returns the source's running totals.
	Counters() Counters
}

var (
	_ Source = (*Static)(nil)
	_ Source = (*DNS)(nil)
	_ Source = (*Kubernetes)(nil)
)

// EventPorts places an engine's KV-event sockets, as vLLM and SGLang lay
// them out: rank r of a data-parallel engine uses the configured ports
// plus r.
//
// Which side binds is the engine's choice: vLLM's publisher binds when its
// endpoint has "*" or "::" in it (its default, tcp://*:5557) and connects
// otherwise. Pub is for engines that bind (cachesync connects to the port
// on each engine's IP); Listen is for engines that connect (cachesync binds
// it, and the engines' endpoints name cachesync).
type EventPorts struct {
	// Pub is rank 0's PUB port on each engine's IP; 0 means the engines'
	// publishers do not bind.
	Pub int
	// Listen is rank 0's endpoint that cachesync binds for publishers that
	// connect, e.g. tcp://0.0.0.0:5557; "" means none.
	Listen string
	// Replay is rank 0's replay ROUTER port; 0 means no replay socket.
	Replay int
	// DPSize is the number of data-parallel ranks; 0 means 1.
	DPSize int
}

// Validate checks that the ports are in range and that no two ranks'
// sockets share a port.
func (p EventPorts) Validate() error {
	if p.DPSize < 0 || p.DPSize > 1024 || p.Pub < 0 || p.Replay < 0 {
		return fmt.Errorf("discovery: events port %d, replay port %d, data-parallel size %d: want ports 0 to 65535 and a size 0 to 1024",
			p.Pub, p.Replay, p.DPSize)
	}
	if p.Listen != "" {
		if p.Pub != 0 {
			return errors.New("discovery: an events port (cachesync connects) and an events listen endpoint (engines connect) together: engines do one or the other")
		}
		if _, _, err := listenEndpoint(p.Listen); err != nil {
			return fmt.Errorf("discovery: %w", err)
		}
	}
	s, err := p.sockets(netip.IPv4Unspecified())
	if err == nil {
		err = s.validate()
	}
	if err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	return nil
}

func (p EventPorts) sockets(ip netip.Addr) (sockets, error) {
	h := ip.String()
	s := sockets{pubHost: h, pub: p.Pub, replayHost: h, replay: p.Replay, dp: p.DPSize}
	if p.Listen != "" {
		var err error
		s.listen = true
		if s.pubHost, s.pub, err = listenEndpoint(p.Listen); err != nil {
			return s, err
		}
	}
	return s, nil
}

// ListenEndpoints returns the endpoints cachesync binds for publishers that
// connect, one per data-parallel rank; none without Listen. p has been
// validated.
func (p EventPorts) ListenEndpoints() []string {
	if p.Listen == "" {
		return nil
	}
	s, _ := p.sockets(netip.IPv4Unspecified())
	var out []string
	for _, ep := range s.endpoints() {
		out = append(out, ep.Pub)
	}
	return out
}

// listenEndpoint parses an endpoint cachesync binds: tcp://HOST:PORT, where
// HOST may be ZeroMQ's wildcard "*".
func listenEndpoint(v string) (string, int, error) {
	rest, ok := strings.CutPrefix(v, "tcp://")
	host, port, err := net.SplitHostPort(rest)
	if !ok || err != nil || host == "" {
		return "", 0, fmt.Errorf("events listen endpoint %q: want tcp://HOST:PORT, e.g. tcp://0.0.0.0:5557", v)
	}
	n, err := portOf(port)
	if err != nil {
		return "", 0, fmt.Errorf("events listen endpoint %q: %w", v, err)
	}
	return host, n, nil
}

// endpoints returns the sockets of an engine at ip; p has been validated.
func (p EventPorts) endpoints(ip netip.Addr) []EventEndpoint {
	s, _ := p.sockets(ip)
	return s.endpoints()
}

// sockets says where one engine's event sockets are.
type sockets struct {
	pubHost    string
	pub        int  // 0: no events
	listen     bool // cachesync binds pubHost:pub, the engine connects
	replayHost string
	replay     int // 0: no replay
	dp         int
}

func (s sockets) endpoints() []EventEndpoint {
	if s.pub == 0 {
		return nil
	}
	eps := make([]EventEndpoint, max(s.dp, 1))
	for r := range eps {
		eps[r] = EventEndpoint{Rank: r, Pub: tcp(s.pubHost, s.pub+r), Listen: s.listen}
		if s.replay != 0 {
			eps[r].Replay = tcp(s.replayHost, s.replay+r)
		}
	}
	return eps
}

func tcp(host string, port int) string {
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port))
}

// parseAddr parses an engine's ip:port, accepting an http:// prefix and
// unmapping IPv4-mapped IPv6 addresses so that one engine has one Addr.
func parseAddr(s string) (netip.AddrPort, error) {
	s = strings.TrimSuffix(strings.TrimPrefix(s, "http://"), "/")
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("engine address %q: want ip:port (use DNS discovery for names): %w", s, err)
	}
	if ap.Port() == 0 {
		return netip.AddrPort{}, fmt.Errorf("engine address %q: port 0", s)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// portOf parses a port number, 1 to 65535.
func portOf(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %q: want 1 to 65535", s)
	}
	return n, nil
}

// normalize sorts engines by Addr and merges duplicates: an address listed
// twice (an endpoint moving between EndpointSlices) is active if any
// listing says so.
func normalize(es []Engine) []Engine {
	slices.SortFunc(es, func(a, b Engine) int { return strings.Compare(a.Addr, b.Addr) })
	out := es[:0]
	for _, e := range es {
		if n := len(out); n > 0 && out[n-1].Addr == e.Addr {
			if !e.Draining {
				out[n-1] = e
			}
			continue
		}
		out = append(out, e)
	}
	return out
}

// equal reports whether two normalized sets are the same.
func equal(a, b []Engine) bool {
	return slices.EqualFunc(a, b, func(x, y Engine) bool {
		return x.Addr == y.Addr && x.Name == y.Name && x.Draining == y.Draining && slices.Equal(x.Events, y.Events)
	})
}

// Counters are a source's running totals, for export as Prometheus
// counters.
type Counters struct {
	Updates uint64 // engine sets sent
	Errors  uint64 // lookups that failed; the last set sent still stands
}

// counters is the live form of Counters.
type counters struct{ updates, errors atomic.Uint64 }

func (c *counters) load() Counters {
	return Counters{Updates: c.updates.Load(), Errors: c.errors.Load()}
}

// sender sends sets that differ from the last one sent.
type sender struct {
	out     chan<- []Engine
	last    []Engine
	started bool
	c       *counters
}

// send normalizes es and sends it unless it equals the last set sent. It
// returns false if ctx ended first.
func (s *sender) send(ctx context.Context, es []Engine) bool {
	es = normalize(es)
	if s.started && equal(es, s.last) {
		return true
	}
	select {
	case s.out <- clone(es): // the receiver may keep or change its copy
		s.last, s.started = es, true
		s.c.updates.Add(1)
		return true
	case <-ctx.Done():
		return false
	}
}

// clone copies a set deeply.
func clone(es []Engine) []Engine {
	out := slices.Clone(es)
	for i := range out {
		out[i].Events = slices.Clone(out[i].Events)
	}
	return out
}
