package kvevents

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/syncbuf"
)

// listen binds a Listener for the test on a free port.
func listen(t *testing.T) *Listener {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l, err := Listen(ctx, "tcp://127.0.0.1:0", "", slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		<-l.done
	})
	return l
}

// TestSharedListener: engines whose publishers connect (vLLM with an
// endpoint naming a host) share one bound socket; each engine's batches
// reach its own subscriber by the topic, a restart of one resets only it,
// and a topic naming no engine is counted and dropped.
func TestSharedListener(t *testing.T) {
	l := listen(t)
	ep := "tcp://" + l.Addr()
	a := startFake(t, fakeOpts{connectTo: ep, topic: "kv@127.0.0.1:8001@Qwen/Qwen3-32B"})
	b := startFake(t, fakeOpts{connectTo: ep, topic: "kv@127.0.0.2@Qwen/Qwen3-32B"})
	stray := startFake(t, fakeOpts{connectTo: ep, topic: "kv@10.9.9.9@other", noReplay: true})
	ra, rb := &recorder{}, &recorder{}
	sa := run(t, Config{Listener: l, Engine: "127.0.0.1:8001", ReplayEndpoint: a.replayEP}, ra)
	sb := run(t, Config{Listener: l, Engine: "127.0.0.2:8000", ReplayEndpoint: b.replayEP}, rb)
	warmUp(t, a, sa)
	warmUp(t, b, sb)
	var lastA, lastB uint64
	for range 5 {
		lastA, lastB = a.publish(), b.publish()
		stray.publish()
	}
	waitFor(t, "engine a's batches", lastSeq(ra, lastA, 1))
	waitFor(t, "engine b's batches", lastSeq(rb, lastB, 1))
	waitFor(t, "the stray topic counted", func() bool { return l.Stats().Unrouted > 0 })
	for _, r := range []*recorder{ra, rb} {
		bs, resets := r.snapshot()
		if !contiguous(bs) || len(resets) != 0 {
			t.Fatalf("applied %v, resets %v", bs, resets)
		}
		for _, x := range bs {
			if x.gen != 1 {
				t.Fatalf("a batch of another process reached a subscriber: %v", bs)
			}
		}
	}

	b.restart()
	for range 3 {
		lastA = a.publish()
	}
	waitFor(t, "engine a after b's restart", lastSeq(ra, lastA, 1))
	waitFor(t, "engine b's new process", func() bool {
		b.publish()
		bs, _ := rb.snapshot()
		return bs[len(bs)-1].gen == 2
	})
	if _, resets := ra.snapshot(); len(resets) != 0 {
		t.Errorf("engine a was reset (%v) when engine b restarted", resets)
	}
	// Whether b's new replay socket answers before its new stream arrives
	// decides how the restart shows, as with an engine's own socket.
	if _, resets := rb.snapshot(); len(resets) != 1 || resets[0] != Restart && resets[0] != Unverified {
		t.Errorf("engine b's resets %v, want one restart", resets)
	}
}

func TestListenerAttachRejects(t *testing.T) {
	l := listen(t)
	if _, _, _, err := l.attach("not-an-address", 8); err == nil {
		t.Error("attached an engine that is not ip:port")
	}
	if _, _, _, err := l.attach("10.0.0.1:8000", 8); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := l.attach("10.0.0.1:8000", 8); err == nil {
		t.Error("attached one engine twice")
	}
}

func TestTopicRouting(t *testing.T) {
	l := listen(t)
	for _, k := range []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.2:8001", "[fd00::7]:8000"} {
		if _, _, _, err := l.attach(k, 1); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ topic, want string }{
		{"kv@10.0.0.1@Qwen/Qwen3-32B", "10.0.0.1:8000"},
		{"kv@10.0.0.1:8000@m", "10.0.0.1:8000"},
		{"kv@10.0.0.2:8001@m", "10.0.0.2:8001"},
		{"kv@10.0.0.2@m", ""}, // two engines on the IP: ambiguous
		{"kv@[fd00::7]:8000@m", "[fd00::7]:8000"},
		{"kv@fd00::7@m", "[fd00::7]:8000"},
		{"kv@10.0.0.9@m", ""},
		{"kv-events", ""},
		{"", ""},
	} {
		l.mu.Lock()
		r := l.route([][]byte{[]byte(tc.topic), make([]byte, 8), nil})
		l.mu.Unlock()
		got := ""
		if r != nil {
			got = r.key
		}
		if got != tc.want {
			t.Errorf("topic %q went to %q, want %q", tc.topic, got, tc.want)
		}
	}
}

// TestLoneEngineTopics: an engine alone on a Listener takes any topic that
// names no IP, but not one naming another engine, which may be connecting
// before discovery attaches it.
func TestLoneEngineTopics(t *testing.T) {
	l := listen(t)
	if _, _, _, err := l.attach("10.0.0.1:8000", 1); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		topic string
		taken bool
	}{
		{"", true},
		{"kv-events", true},
		{"kv@pod-a@m", true},
		{"kv@10.0.0.1@m", true},
		{"kv@10.0.0.1:9000@m", true}, // the one engine on that IP
		{"kv@10.0.0.2@m", false},
		{"kv@[fd00::7]:8000@m", false},
	} {
		l.mu.Lock()
		r := l.route([][]byte{[]byte(tc.topic), make([]byte, 8), nil})
		l.mu.Unlock()
		if taken := r != nil; taken != tc.taken {
			t.Errorf("topic %q taken: %v, want %v", tc.topic, taken, tc.taken)
		}
	}
	if got := l.Stats().Unrouted; got != 2 {
		t.Errorf("unrouted %d, want 2", got)
	}
}

// TestUnknownTopicLoggedWhenItLasts: a topic naming no attached engine is
// logged only once it has lasted the grace period, and never when its
// engine is attached within it (an engine connects as soon as it starts,
// discovery finds it later).
func TestUnknownTopicLoggedWhenItLasts(t *testing.T) {
	var logs syncbuf.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	l, err := Listen(ctx, "tcp://127.0.0.1:0", "", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); <-l.done })
	clock := time.Unix(1e9, 0)
	l.now = func() time.Time { return clock }
	if _, _, _, err := l.attach("10.0.0.1:8000", 1); err != nil {
		t.Fatal(err)
	}
	send := func(topic string) bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.route([][]byte{[]byte(topic), make([]byte, 8), nil}) != nil
	}
	for _, step := range []struct {
		after time.Duration
		topic string
	}{{0, "kv@10.0.0.2@m"}, {0, "kv@10.0.0.3@m"}, {10 * time.Second, "kv@10.0.0.2@m"}, {10 * time.Second, "kv@10.0.0.3@m"}} {
		clock = clock.Add(step.after)
		if send(step.topic) {
			t.Fatalf("%s was routed with no engine of its own attached", step.topic)
		}
	}
	if _, _, _, err := l.attach("10.0.0.2:8000", 1); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(unknownTopicGrace)
	if !send("kv@10.0.0.2@m") {
		t.Fatal("the engine found late does not get its topic")
	}
	for range 3 {
		send("kv@10.0.0.3@m")
	}
	out := logs.String()
	if n := strings.Count(out, "named no engine"); n != 1 || !strings.Contains(out, "topic=kv@10.0.0.3@m") {
		t.Errorf("want one warning, for the topic that lasted:\n%s", out)
	}
}
