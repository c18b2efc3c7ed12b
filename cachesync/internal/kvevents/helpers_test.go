package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// testWriter writes a subscriber's log to the test's, shown on failure.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

var quiet = zmq4.WithLogger(log.New(io.Discard, "", 0))

// fakeEngine publishes batches as vLLM's ZmqEventPublisher does (PUB,
// replay ROUTER with a bounded buffer), with knobs to lose batches on the
// way, restart, and answer replays in either shape or not at all.
type fakeEngine struct {
	t         *testing.T
	bindPub   bool   // bind the PUB (else it connects to pubEP)
	pubEP     string // where subscribers connect, or where the PUB connects to
	replayEP  string // "" with no replay socket
	withTopic bool   // replay replies carry the topic frame
	mute      bool   // the ROUTER reads requests and never answers
	topic     []byte
	max       int // replay buffer, batches

	mu     sync.Mutex
	gen    int // process generation, starting at 1
	seq    uint64
	ring   []fakeEntry
	drop   func(seq uint64) bool // lose the live message of seq
	pub    zmq4.Socket
	router zmq4.Socket
	cancel context.CancelFunc
	done   chan struct{}
}

type fakeEntry struct {
	seq     uint64
	payload []byte
}

type fakeOpts struct {
	connectTo string // the PUB connects here instead of binding
	noReplay  bool
	noTopic   bool
	mute      bool
	buffer    int
	topic     string // default kv@test
}

func startFake(t *testing.T, o fakeOpts) *fakeEngine {
	t.Helper()
	f := &fakeEngine{t: t, topic: []byte("kv@test"), withTopic: !o.noTopic, mute: o.mute, max: o.buffer}
	if o.topic != "" {
		f.topic = []byte(o.topic)
	}
	if f.max == 0 {
		f.max = 10000
	}
	if o.connectTo != "" {
		f.pubEP = o.connectTo
	} else {
		f.bindPub, f.pubEP = true, "tcp://127.0.0.1:0"
	}
	if !o.noReplay {
		f.replayEP = "tcp://127.0.0.1:0"
	}
	f.start()
	t.Cleanup(f.stop)
	return f
}

// start brings the engine process up: seq 0, empty buffer, same ports.
func (f *fakeEngine) start() {
	ctx, cancel := context.WithCancel(context.Background())
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen++
	f.seq, f.ring, f.cancel, f.done = 0, nil, cancel, make(chan struct{})
	if f.bindPub {
		f.pub = zmq4.NewPub(ctx, quiet)
		if err := f.pub.Listen(f.pubEP); err != nil {
			f.t.Fatal(err)
		}
		f.pubEP = endpoint(f.pub.Addr())
	} else {
		// As libzmq's connect: in the background, again after a loss.
		f.pub = zmq4.NewPub(ctx, quiet, zmq4.WithDialerMaxRetries(-1), zmq4.WithAutomaticReconnect(true))
		go f.pub.Dial(f.pubEP)
	}
	if f.replayEP == "" {
		close(f.done)
		return
	}
	f.router = zmq4.NewRouter(ctx, quiet)
	if err := f.router.Listen(f.replayEP); err != nil {
		f.t.Fatal(err)
	}
	f.replayEP = endpoint(f.router.Addr())
	go f.serveReplay(f.router, f.done)
}

func endpoint(a net.Addr) string { return "tcp://" + a.String() }

func (f *fakeEngine) stop() {
	f.mu.Lock()
	pub, router, cancel, done := f.pub, f.router, f.cancel, f.done
	f.mu.Unlock()
	cancel()
	pub.Close()
	if router != nil {
		router.Close()
	}
	<-done
}

// restart stops the process and starts a new one on the same ports.
func (f *fakeEngine) restart() {
	f.stop()
	f.start()
}

func (f *fakeEngine) serveReplay(router zmq4.Socket, done chan struct{}) {
	defer close(done)
	for {
		m, err := router.Recv()
		if err != nil {
			return
		}
		if f.mute || len(m.Frames) != 3 {
			continue
		}
		id, from := m.Frames[0], binary.BigEndian.Uint64(m.Frames[2])
		f.mu.Lock()
		var out []fakeEntry
		for _, e := range f.ring {
			if e.seq >= from {
				out = append(out, e)
			}
		}
		f.mu.Unlock()
		for _, e := range out {
			router.SendMulti(f.reply(id, binary.BigEndian.AppendUint64(nil, e.seq), e.payload))
		}
		router.SendMulti(f.reply(id, endSeq, []byte{}))
	}
}

func (f *fakeEngine) reply(id, seq, payload []byte) zmq4.Msg {
	if f.withTopic {
		return zmq4.NewMsgFrom(id, []byte{}, f.topic, seq, payload)
	}
	return zmq4.NewMsgFrom(id, []byte{}, seq, payload)
}

// publish sends one batch holding a BlockStored whose hash is seq and whose
// timestamp is the process generation, and returns its seq.
func (f *fakeEngine) publish() uint64 {
	f.mu.Lock()
	seq, gen := f.seq, f.gen
	f.mu.Unlock()
	return f.publishRaw(batchPayload(f.t, gen, seq))
}

func (f *fakeEngine) publishRaw(payload []byte) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	seq := f.seq
	f.seq++
	f.ring = append(f.ring, fakeEntry{seq, payload})
	if len(f.ring) > f.max {
		f.ring = f.ring[1:]
	}
	if f.drop != nil && f.drop(seq) {
		return seq
	}
	if err := f.pub.SendMulti(zmq4.NewMsgFrom(f.topic, binary.BigEndian.AppendUint64(nil, seq), payload)); err != nil {
		f.t.Errorf("publish %d: %v", seq, err)
	}
	return seq
}

func batchPayload(t testing.TB, gen int, seq uint64) []byte {
	b, err := msgpack.Marshal([]any{float64(gen), []any{[]any{"BlockStored", []any{seq}, nil, []any{1, 2}, 2, nil, "GPU", nil}}, 0})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// applied is one batch a recorder saw: its seq and the generation of the
// process that sent it.
type applied struct {
	seq uint64
	gen int
}

// recorder is a Handler that records what it is given.
type recorder struct {
	mu      sync.Mutex
	batches []applied
	resets  []Reason
}

func (r *recorder) Batch(b *Batch) {
	if len(b.Events) != 1 || len(b.Events[0].Hashes) != 1 || b.Events[0].Hashes[0] != b.Seq {
		panic(fmt.Sprintf("batch %d does not hold its own seq: %+v", b.Seq, b.Events))
	}
	r.mu.Lock()
	r.batches = append(r.batches, applied{b.Seq, int(b.TS)})
	r.mu.Unlock()
}

func (r *recorder) Reset(why Reason) {
	r.mu.Lock()
	r.resets = append(r.resets, why)
	r.mu.Unlock()
}

func (r *recorder) snapshot() ([]applied, []Reason) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]applied(nil), r.batches...), append([]Reason(nil), r.resets...)
}

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// run starts a Subscriber for cfg and stops it with the test, checking
// that its goroutines end.
func run(t *testing.T, cfg Config, h Handler) *Subscriber {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	if cfg.ReplayTimeout == 0 {
		cfg.ReplayTimeout = 500 * time.Millisecond
	}
	s, err := New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context was cancelled")
		}
	})
	return s
}

// goroutines waits for the goroutines, less those of zmq4's PUB sockets
// (their writer goroutine never ends: a zmq4 leak on the fake engines'
// side), to fall to at most n.
func goroutines(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		stacks := allStacks()
		if countGoroutines(stacks) <= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines, want at most %d:\n%s", countGoroutines(stacks), n, stacks)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func allStacks() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

func countGoroutines(stacks string) int {
	n := 0
	for _, g := range strings.Split(stacks, "\n\n") {
		if !strings.Contains(g, "pubMWriter") {
			n++
		}
	}
	return n
}
