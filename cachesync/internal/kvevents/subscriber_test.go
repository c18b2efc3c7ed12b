package kvevents

import (
	"net"
	"slices"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// contiguous reports whether bs are consecutive seqs of one generation.
func contiguous(bs []applied) bool {
	for i := 1; i < len(bs); i++ {
		if bs[i].seq != bs[i-1].seq+1 || bs[i].gen != bs[i-1].gen {
			return false
		}
	}
	return true
}

func seqs(from, to uint64, gen int) []applied {
	var out []applied
	for s := from; s <= to; s++ {
		out = append(out, applied{s, gen})
	}
	return out
}

// warmUp publishes until the subscriber applies a batch received live, so
// that the subscription is known to be up.
func warmUp(t *testing.T, f *fakeEngine, s *Subscriber) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		f.publish()
		time.Sleep(20 * time.Millisecond)
		if st := s.Stats(); st.Batches > st.Replayed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the subscriber received nothing live")
		}
	}
}

func count(r *recorder) func() bool {
	return func() bool { bs, _ := r.snapshot(); return len(bs) > 0 }
}

func lastSeq(r *recorder, seq uint64, gen int) func() bool {
	return func() bool {
		bs, _ := r.snapshot()
		return len(bs) > 0 && bs[len(bs)-1] == applied{seq, gen}
	}
}

// TestCatchUpAndLive: batches sent before the subscriber started come from
// the replay socket, later ones live, each once and in order, with either
// replay reply shape.
func TestCatchUpAndLive(t *testing.T) {
	for _, noTopic := range []bool{false, true} {
		f := startFake(t, fakeOpts{noTopic: noTopic})
		for range 5 {
			f.publish()
		}
		r := &recorder{}
		s := run(t, Config{Endpoint: f.pubEP, ReplayEndpoint: f.replayEP, Topic: "kv@"}, r)
		waitFor(t, "the replayed batches", lastSeq(r, 4, 1))
		// Batches sent while the subscription is still being set up are
		// missed live and come from the next replay.
		for range 5 {
			f.publish()
			time.Sleep(10 * time.Millisecond)
		}
		waitFor(t, "the live batches", lastSeq(r, 9, 1))
		bs, resets := r.snapshot()
		if !slices.Equal(bs, seqs(0, 9, 1)) || len(resets) != 0 {
			t.Fatalf("applied %v, resets %v", bs, resets)
		}
		if st := s.Stats(); st.Batches != 10 || st.Stored != 10 || st.Replayed < 5 || st.Connects != 1 || st.LastSeq != 9 {
			t.Fatalf("stats %+v", st)
		}
	}
}

// TestGapReplayed: batches lost on the way are fetched from the replay
// socket and applied in order, once.
func TestGapReplayed(t *testing.T) {
	f := startFake(t, fakeOpts{})
	r := &recorder{}
	s := run(t, Config{Endpoint: f.pubEP, ReplayEndpoint: f.replayEP}, r)
	warmUp(t, f, s)
	bs, _ := r.snapshot()
	last := bs[len(bs)-1].seq
	f.mu.Lock()
	lost := f.seq
	f.drop = func(seq uint64) bool { return seq >= lost && seq < lost+3 }
	f.mu.Unlock()
	for range 5 {
		last = f.publish()
	}
	waitFor(t, "the batches after the gap", lastSeq(r, last, 1))
	bs, resets := r.snapshot()
	if !slices.Equal(bs, seqs(0, last, 1)) || len(resets) != 0 {
		t.Fatalf("applied %v, resets %v", bs, resets)
	}
	if st := s.Stats(); st.Gaps != 1 || st.ReplayFailures != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestGapWithoutReplay: with no replay socket a gap resets the handler,
// which then follows from the first batch after the gap.
func TestGapWithoutReplay(t *testing.T) {
	f := startFake(t, fakeOpts{noReplay: true})
	r := &recorder{}
	s := run(t, Config{Endpoint: f.pubEP}, r)
	warmUp(t, f, s)
	time.Sleep(50 * time.Millisecond)
	before, _ := r.snapshot()
	f.mu.Lock()
	lost := f.seq
	f.drop = func(seq uint64) bool { return seq == lost || seq == lost+1 }
	f.mu.Unlock()
	for range 4 {
		f.publish()
	}
	waitFor(t, "the batches after the gap", lastSeq(r, lost+3, 1))
	bs, resets := r.snapshot()
	if !slices.Equal(resets, []Reason{Gap}) || !slices.Equal(bs[len(before):], seqs(lost+2, lost+3, 1)) {
		t.Fatalf("applied %v after %v, resets %v", bs[len(before):], before, resets)
	}
	if st := s.Stats(); st.Gaps != 1 || st.Resets[Gap] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestGapBeyondBuffer: when the engine's replay buffer no longer reaches
// back to the gap, the handler is reset and gets what the buffer holds.
func TestGapBeyondBuffer(t *testing.T) {
	f := startFake(t, fakeOpts{buffer: 3})
	r := &recorder{}
	s := run(t, Config{Endpoint: f.pubEP, ReplayEndpoint: f.replayEP}, r)
	warmUp(t, f, s)
	time.Sleep(50 * time.Millisecond)
	f.mu.Lock()
	lost := f.seq
	f.drop = func(seq uint64) bool { return seq >= lost && seq < lost+6 }
	f.mu.Unlock()
	var last uint64
	for range 8 {
		last = f.publish()
	}
	waitFor(t, "the batches after the gap", lastSeq(r, last, 1))
	bs, resets := r.snapshot()
	if !slices.Equal(resets, []Reason{Gap}) {
		t.Fatalf("resets %v", resets)
	}
	// After the reset: a contiguous run from what the buffer still held.
	i := slices.Index(bs, applied{lost - 1, 1})
	after := bs[i+1:]
	if len(after) == 0 || after[0].seq < lost+3 || !contiguous(after) {
		t.Fatalf("applied %v after the reset (lost %d..%d)", after, lost, lost+5)
	}
}

// TestRestart: an engine that restarts and sends more batches than before
// by the time the subscriber is back is told from the old one by its
// payloads, and the handler is reset once and follows the new process.
func TestRestart(t *testing.T) {
	f := startFake(t, fakeOpts{})
	r := &recorder{}
	s := run(t, Config{Endpoint: f.pubEP, ReplayEndpoint: f.replayEP}, r)
	for range 3 {
		f.publish()
	}
	waitFor(t, "the first process's batches", lastSeq(r, 2, 1))
	f.restart()
	for range 6 {
		f.publish()
	}
	waitFor(t, "the new process's batches", lastSeq(r, 5, 2))
	bs, resets := r.snapshot()
	if !slices.Equal(resets, []Reason{Restart}) || !slices.Equal(bs, append(seqs(0, 2, 1), seqs(0, 5, 2)...)) {
		t.Fatalf("applied %v, resets %v", bs, resets)
	}
	if st := s.Stats(); st.Connects < 2 || st.Resets[Restart] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestRestartWithoutReplay: with no replay socket, a lost connection means
// the engine may have restarted: the handler is reset.
func TestRestartWithoutReplay(t *testing.T) {
	f := startFake(t, fakeOpts{noReplay: true})
	r := &recorder{}
	s := run(t, Config{Endpoint: f.pubEP}, r)
	warmUp(t, f, s)
	f.restart()
	untilNewProcess(t, f, r)
	if _, resets := r.snapshot(); !slices.Equal(resets, []Reason{Unverified}) {
		t.Fatalf("resets %v", resets)
	}
}

// untilNewProcess publishes from the restarted engine until the
// subscriber applies one of its batches.
func untilNewProcess(t *testing.T, f *fakeEngine, r *recorder) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		f.publish()
		time.Sleep(20 * time.Millisecond)
		if bs, _ := r.snapshot(); bs[len(bs)-1].gen == 2 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("nothing from the new process")
		}
	}
}

func freeEndpoint(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return "tcp://" + ln.Addr().String()
}

// TestBind: the subscriber binds and the engine's PUB connects to it, as
// vLLM does when its endpoint names a host; a restart is still caught.
func TestBind(t *testing.T) {
	ep := freeEndpoint(t)
	f := startFake(t, fakeOpts{connectTo: ep}) // its PUB retries until the subscriber binds
	r := &recorder{}
	s := run(t, Config{Endpoint: ep, Bind: true, ReplayEndpoint: f.replayEP}, r)
	warmUp(t, f, s)
	var last uint64
	for range 3 {
		last = f.publish()
	}
	waitFor(t, "live batches", lastSeq(r, last, 1))
	f.restart()
	untilNewProcess(t, f, r)
	// Whether the new process's replay socket is up when the old
	// connection's end is noticed decides how the restart shows.
	bs, resets := r.snapshot()
	if len(resets) != 1 || resets[0] != Restart && resets[0] != Unverified {
		t.Fatalf("resets %v", resets)
	}
	i := slices.IndexFunc(bs, func(a applied) bool { return a.gen == 2 })
	if bs[i].seq != 0 || !contiguous(bs[i:]) || !contiguous(bs[:i]) {
		t.Fatalf("applied %v", bs)
	}
}

// TestReplayUnanswered: a replay socket that never answers counts as a
// failed replay, and the gap resets the handler.
func TestReplayUnanswered(t *testing.T) {
	f := startFake(t, fakeOpts{mute: true})
	r := &recorder{}
	s := run(t, Config{Endpoint: f.pubEP, ReplayEndpoint: f.replayEP, ReplayTimeout: 200 * time.Millisecond}, r)
	warmUp(t, f, s)
	time.Sleep(300 * time.Millisecond)
	f.mu.Lock()
	lost := f.seq
	f.drop = func(seq uint64) bool { return seq == lost }
	f.mu.Unlock()
	f.publish()
	last := f.publish()
	waitFor(t, "the batch after the gap", lastSeq(r, last, 1))
	if _, resets := r.snapshot(); !slices.Equal(resets, []Reason{Gap}) {
		t.Fatalf("resets %v", resets)
	}
	if st := s.Stats(); st.ReplayFailures < 2 { // at the start and at the gap
		t.Fatalf("stats %+v", st)
	}
}

// TestMalformedMessages: a payload that does not decode resets the handler,
// which goes on with the next batch; a message of the wrong shape is
// counted and dropped.
func TestMalformedMessages(t *testing.T) {
	f := startFake(t, fakeOpts{noReplay: true})
	r := &recorder{}
	s := run(t, Config{Endpoint: f.pubEP}, r)
	warmUp(t, f, s)
	f.publishRaw([]byte{0x93, 0xc1})
	f.mu.Lock()
	f.pub.SendMulti(zmq4.NewMsgFrom(f.topic, []byte{1, 2}))
	f.mu.Unlock()
	last := f.publish()
	waitFor(t, "the batch after the bad one", lastSeq(r, last, 1))
	if _, resets := r.snapshot(); !slices.Equal(resets, []Reason{Malformed}) {
		t.Fatalf("resets %v", resets)
	}
	if st := s.Stats(); st.DecodeErrors != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// TestIdleCheck: a silent engine is asked through the replay socket whether
// it is still the one followed; one that lost its history is reset.
func TestIdleCheck(t *testing.T) {
	f := startFake(t, fakeOpts{})
	f.publish()
	f.publish()
	r := &recorder{}
	s := run(t, Config{Endpoint: f.pubEP, ReplayEndpoint: f.replayEP, IdleCheck: 100 * time.Millisecond}, r)
	waitFor(t, "the batches", lastSeq(r, 1, 1))
	time.Sleep(300 * time.Millisecond)
	if _, resets := r.snapshot(); len(resets) != 0 {
		t.Fatalf("resets %v while nothing changed", resets)
	}
	f.mu.Lock()
	f.ring, f.seq = nil, 0 // the process behind the replay socket starts over
	f.mu.Unlock()
	waitFor(t, "a reset", func() bool { _, resets := r.snapshot(); return len(resets) > 0 })
	if _, resets := r.snapshot(); resets[0] != Restart {
		t.Fatalf("resets %v", resets)
	}
	if st := s.Stats(); st.Replays < 3 {
		t.Fatalf("stats %+v", st)
	}
}

// TestLostTail: batches lost with nothing sent after them (no gap to see)
// are fetched by the idle check.
func TestLostTail(t *testing.T) {
	f := startFake(t, fakeOpts{})
	r := &recorder{}
	s := run(t, Config{Endpoint: f.pubEP, ReplayEndpoint: f.replayEP, IdleCheck: 200 * time.Millisecond}, r)
	warmUp(t, f, s)
	f.mu.Lock()
	f.drop = func(uint64) bool { return true }
	f.mu.Unlock()
	f.publish()
	last := f.publish()
	waitFor(t, "the lost batches", lastSeq(r, last, 1))
	if bs, resets := r.snapshot(); !slices.Equal(bs, seqs(0, last, 1)) || len(resets) != 0 {
		t.Fatalf("applied %v, resets %v", bs, resets)
	}
}

func TestConfig(t *testing.T) {
	for _, cfg := range []Config{{}, {Endpoint: "127.0.0.1:5557"}, {Endpoint: "tcp://a:1", ReplayEndpoint: "a:2"}} {
		if _, err := New(cfg, &recorder{}); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

// TestNoLeaks runs a subscriber through connecting, replays, a restart and
// shutdown, and checks that no goroutine outlives it.
func TestNoLeaks(t *testing.T) {
	n := countGoroutines(allStacks())
	t.Run("run", func(t *testing.T) {
		f := startFake(t, fakeOpts{})
		r := &recorder{}
		run(t, Config{Endpoint: f.pubEP, ReplayEndpoint: f.replayEP}, r)
		f.publish()
		waitFor(t, "a batch", count(r))
		f.restart()
		f.publish()
		waitFor(t, "a batch of the new process", lastSeq(r, 0, 2))
	})
	t.Run("unreachable", func(t *testing.T) {
		r := &recorder{}
		run(t, Config{Endpoint: freeEndpoint(t), ReplayEndpoint: freeEndpoint(t)}, r)
		time.Sleep(300 * time.Millisecond)
	})
	goroutines(t, n)
}

// TestRestartAfterLiveOnly: a subscriber that has only ever received
// batches live (it was there before the engine's first) still tells a
// restart from an unverified break: it proves the replay socket once,
// whatever the traffic.
func TestRestartAfterLiveOnly(t *testing.T) {
	f := startFake(t, fakeOpts{})
	r := &recorder{}
	s := run(t, Config{Endpoint: f.pubEP, ReplayEndpoint: f.replayEP, IdleCheck: time.Hour}, r)
	// Subscribed before the engine's first batch, so every batch comes
	// live and no gap ever asks the replay socket.
	waitFor(t, "the connection", func() bool { return s.Stats().Connects > 0 })
	time.Sleep(500 * time.Millisecond)
	for deadline := time.Now().Add(1500 * time.Millisecond); time.Now().Before(deadline); {
		f.publish() // steady traffic: the idle check never fires
		time.Sleep(20 * time.Millisecond)
	}
	if st := s.Stats(); st.Batches == 0 || st.Gaps != 0 {
		t.Fatalf("the first batches did not all come live: %+v", st)
	}
	f.restart()
	untilNewProcess(t, f, r)
	if _, resets := r.snapshot(); !slices.Equal(resets, []Reason{Restart}) {
		t.Fatalf("resets %v, want one restart", resets)
	}
}
