package kvevents

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Listener is a bound SUB socket that engines' KV-event publishers connect
// to. vLLM's publisher binds only when its endpoint has "*" or "::" in it
// (or is ipc or inproc); an endpoint that names a host, tcp://cachesync:5557
// say, makes every engine connect there, and one Listener then serves them
// all.
//
// Each message goes to the subscriber its topic names. Engines sharing a
// Listener must each publish under a topic of the form prefix@HOST@rest,
// where HOST is the engine's IP or ip:port (llm-d's convention is
// kv@<pod-ip>@<model>, set per pod with the Kubernetes downward API). A
// Listener with a single subscriber also hands it the messages whose topic
// names no IP, so an engine alone on its socket may keep any topic but
// another engine's.
type Listener struct {
	endpoint string
	log      *slog.Logger
	sock     zmq4.Socket

	mu       sync.Mutex
	routes   map[string]*route        // by the engine's ip:port
	unknown  map[string]*unknownTopic // topics no route takes
	now      func() time.Time
	unrouted atomic.Uint64
	dropped  atomic.Uint64
	done     chan struct{}
}

type route struct {
	key string
	ip  netip.Addr
	c   chan received
}

// ListenerStats are a Listener's counters.
type ListenerStats struct {
	Unrouted uint64 // messages whose topic names no attached engine
	Dropped  uint64 // messages dropped because their subscriber lagged (replay fills the gap)
}

// maxUnknownTopics bounds the unknown topics a Listener keeps track of.
const maxUnknownTopics = 64

// unknownTopicGrace is how long a topic may name no attached engine before
// it is logged: an engine's publisher connects as soon as it starts, and
// discovery may attach the engine a poll or a watch event later.
const unknownTopicGrace = 30 * time.Second

// unknownTopic is a topic that named no attached engine when it arrived.
type unknownTopic struct {
	first  time.Time
	warned bool
}

// Listen binds a SUB socket on endpoint (e.g. tcp://0.0.0.0:5557),
// subscribed to topic ("" for every topic), and serves it until ctx ends.
func Listen(ctx context.Context, endpoint, topic string, log *slog.Logger) (*Listener, error) {
	if !strings.Contains(endpoint, "://") {
		return nil, fmt.Errorf("kvevents: listen endpoint %q: want transport://address, e.g. tcp://0.0.0.0:5557", endpoint)
	}
	if log == nil {
		log = slog.Default()
	}
	log = log.With("listen", endpoint)
	sock := zmq4.NewSub(ctx, zmq4.WithLogger(slog.NewLogLogger(log.Handler(), slog.LevelDebug)))
	if err := sock.SetOption(zmq4.OptionSubscribe, topic); err != nil {
		sock.Close()
		return nil, fmt.Errorf("kvevents: subscribe: %w", err)
	}
	if err := sock.Listen(bindable(endpoint)); err != nil {
		sock.Close()
		return nil, fmt.Errorf("kvevents: listen on %s: %w", endpoint, err)
	}
	l := &Listener{
		endpoint: endpoint, log: log, sock: sock,
		routes: map[string]*route{}, unknown: map[string]*unknownTopic{}, now: time.Now,
		done: make(chan struct{}),
	}
	go l.serve(ctx)
	go func() {
		<-ctx.Done()
		sock.Close()
	}()
	return l, nil
}

// bindable turns ZeroMQ's wildcard host, which vLLM's docs use, into one
// Go's listener accepts.
func bindable(endpoint string) string {
	return strings.Replace(endpoint, "://*:", "://0.0.0.0:", 1)
}

// Endpoint is the address the Listener was asked to bind.
func (l *Listener) Endpoint() string { return l.endpoint }

// Addr is the bound address, e.g. 0.0.0.0:5557 (the port chosen for :0).
func (l *Listener) Addr() string {
	if a := l.sock.Addr(); a != nil {
		return a.String()
	}
	return ""
}

// Stats returns the counters.
func (l *Listener) Stats() ListenerStats {
	return ListenerStats{Unrouted: l.unrouted.Load(), Dropped: l.dropped.Load()}
}

// attach routes the messages of the engine at key (its ip:port) to a new
// channel of queue messages. A connection error (a publisher went away)
// goes to every subscriber, since nothing says whose it was. detach ends
// the route; exclusive reports whether the engine is alone on the
// Listener, so the error was its own.
func (l *Listener) attach(key string, queue int) (in <-chan received, detach func(), exclusive func() bool, err error) {
	r := &route{key: key, c: make(chan received, queue)}
	if key != "" {
		ap, err := netip.ParseAddrPort(key)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("kvevents: engine %q: want ip:port", key)
		}
		r.ip = ap.Addr().Unmap()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, dup := l.routes[key]; dup {
		return nil, nil, nil, fmt.Errorf("kvevents: engine %q attached twice to %s", key, l.endpoint)
	}
	l.routes[key] = r
	for t := range l.unknown {
		if host, ip, named := topicHost([]byte(t)); named && l.byHost(host, ip) == r {
			delete(l.unknown, t) // it was this engine's, connected before it was found
		}
	}
	detach = func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.routes[key] == r {
			delete(l.routes, key)
		}
	}
	exclusive = func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.routes) == 1
	}
	return r.c, detach, exclusive, nil
}

func (l *Listener) serve(ctx context.Context) {
	defer close(l.done)
	for {
		m, err := l.sock.Recv()
		if ctx.Err() != nil {
			return
		}
		if err != nil && errors.Is(err, context.Canceled) {
			return // closed
		}
		l.mu.Lock()
		if err != nil {
			for _, r := range l.routes {
				l.offer(r, received{err: err})
			}
		} else if r := l.route(m.Frames); r != nil {
			l.offer(r, received{msg: m})
		}
		l.mu.Unlock()
	}
}

// offer queues a message without waiting: one lagging engine must not stall
// the others. A dropped batch shows as a sequence gap, which replay fills.
func (l *Listener) offer(r *route, m received) {
	select {
	case r.c <- m:
	default:
		l.dropped.Add(1)
	}
}

// route finds the subscriber of a message; l.mu is held.
func (l *Listener) route(frames [][]byte) *route {
	var topic []byte
	if len(frames) > 0 {
		topic = frames[0]
	}
	host, ip, named := topicHost(topic)
	if named {
		if r := l.byHost(host, ip); r != nil {
			return r
		}
	} else if len(l.routes) == 1 {
		// A topic that names no engine can only be the lone engine's. One
		// that names another engine is not: that engine may connect before
		// discovery attaches it, and its batches must not land on this one.
		for _, r := range l.routes {
			return r
		}
	}
	if len(l.routes) == 0 {
		return nil // nobody attached yet, or any more
	}
	l.unrouted.Add(1)
	l.noteUnknown(string(topic))
	return nil
}

// noteUnknown logs a topic once it has named no attached engine for the
// grace period; l.mu is held.
func (l *Listener) noteUnknown(topic string) {
	u := l.unknown[topic]
	switch {
	case u == nil:
		if len(l.unknown) < maxUnknownTopics {
			l.unknown[topic] = &unknownTopic{first: l.now()}
		}
	case !u.warned && l.now().Sub(u.first) >= unknownTopicGrace:
		u.warned = true
		l.log.Warn("kv events: a topic has named no engine on this listener since it first arrived; set each engine's topic to kv@<its ip>@<model>",
			"topic", topic, "since", u.first, "engines", len(l.routes))
	}
}

// topicHost parses the HOST of prefix@HOST@rest as an IP or ip:port;
// named is false when the topic has no such HOST.
func topicHost(topic []byte) (host string, ip netip.Addr, named bool) {
	_, rest, ok := bytes.Cut(topic, []byte("@"))
	if !ok {
		return "", ip, false
	}
	h, _, _ := bytes.Cut(rest, []byte("@"))
	host = string(h)
	if ap, err := netip.ParseAddrPort(host); err == nil {
		return host, ap.Addr().Unmap(), true
	}
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return host, a.Unmap(), true
	}
	return "", ip, false
}

// byHost matches a topic's HOST to an engine: its ip:port, else the one
// engine on that IP.
func (l *Listener) byHost(host string, ip netip.Addr) *route {
	if r := l.routes[host]; r != nil {
		return r
	}
	var found *route
	for _, r := range l.routes {
		if r.ip == ip {
			if found != nil {
				return nil // two engines on one IP: the topic must give the port
			}
			found = r
		}
	}
	return found
}
