package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/go-zeromq/zmq4"
)

// Handler receives one engine's batches. A Subscriber calls it from one
// goroutine, never concurrently.
type Handler interface {
	// Batch applies a batch. Batches come in sequence order, each exactly
	// once and without gaps since the last Reset; the first after a Reset
	// (or the start) need not be the engine's first. b and everything it
	// points to are valid only during the call.
	Batch(b *Batch)
	// Reset says that what the batches so far described no longer holds:
	// forget everything learned from this engine.
	Reset(why Reason)
}

// Reason says why a Subscriber reset its Handler.
type Reason uint8

// The reasons for a Reset.
const (
	// Restart: sequence numbers went backwards, or the replayed stream is
	// not the one applied: the engine restarted.
	Restart Reason = iota
	// Gap: batches were lost and replay could not supply them.
	Gap
	// Unverified: the connection was lost and, without a working replay
	// socket, nothing tells whether batches were lost or the engine
	// restarted meanwhile.
	Unverified
	// Malformed: a batch could not be decoded, so it cannot be applied.
	Malformed
	numReasons
)

var reasonNames = [...]string{Restart: "restart", Gap: "gap", Unverified: "unverified", Malformed: "malformed"}

// String returns the reason's metric label, e.g. "restart".
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// Config describes one engine's event sockets.
type Config struct {
	// Endpoint is the engine's PUB socket, e.g. tcp://10.0.0.5:5557, which
	// the subscriber connects to; with Bind, the local endpoint the
	// subscriber binds and the engine's PUB connects to (vLLM connects
	// when its endpoint names a host, e.g. tcp://cachesync:5557). One
	// endpoint per engine and data-parallel rank.
	Endpoint string
	Bind     bool
	// Listener, when set, is a bound socket shared with other engines
	// whose publishers connect to it; Engine (the engine's ip:port) picks
	// this engine's messages out by topic. Endpoint is then ignored.
	Listener *Listener
	Engine   string
	// ReplayEndpoint is the engine's replay ROUTER socket; "" when the
	// engine has none (then lost batches reset the engine).
	ReplayEndpoint string
	// Topic is the subscription prefix; "" receives every topic.
	Topic string
	// ReplayTimeout bounds the wait for each replay reply, the first
	// including the connection (default 2 s); ReplayLimit bounds a whole
	// replay (default 30 s).
	ReplayTimeout, ReplayLimit time.Duration
	// IdleCheck is how long the stream may stay silent before the
	// subscriber asks the replay socket for what it may have missed and
	// whether the engine is still the one it followed (a restarted idle
	// engine sends nothing); default 30 s, negative disables it. The
	// first check comes at most a second after connecting, for batches
	// sent before the subscription took.
	IdleCheck time.Duration
	// RetryMax caps the wait between connection attempts (default 5 s).
	RetryMax time.Duration
	// Queue is how many received messages wait while a replay runs
	// (default 4096).
	Queue  int
	Logger *slog.Logger
}

func (c Config) withDefaults() (Config, error) {
	if c.Listener != nil {
		c.Endpoint, c.Bind = c.Listener.Endpoint(), true
	}
	if c.Endpoint == "" {
		return c, errors.New("kvevents: no endpoint")
	}
	for _, ep := range []string{c.Endpoint, c.ReplayEndpoint} {
		if ep != "" && !strings.Contains(ep, "://") {
			return c, fmt.Errorf("kvevents: endpoint %q: want transport://address, e.g. tcp://10.0.0.5:5557", ep)
		}
	}
	if c.ReplayTimeout <= 0 {
		c.ReplayTimeout = 2 * time.Second
	}
	if c.ReplayLimit <= 0 {
		c.ReplayLimit = 30 * time.Second
	}
	if c.IdleCheck == 0 {
		c.IdleCheck = 30 * time.Second
	}
	if c.RetryMax <= 0 {
		c.RetryMax = 5 * time.Second
	}
	if c.Queue <= 0 {
		c.Queue = 4096
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// Stats are a Subscriber's counters since it was made, for export as
// Prometheus counters (per engine, or summed).
type Stats struct {
	Batches        uint64             // batches applied
	Stored         uint64             // BlockStored events applied
	Removed        uint64             // BlockRemoved events applied
	Cleared        uint64             // AllBlocksCleared events applied
	UnknownEvents  uint64             // events of unknown types, skipped
	Gaps           uint64             // sequence gaps noticed
	Replays        uint64             // replay requests
	ReplayFailures uint64             // replays that failed (no answer, timeout, dropped connection)
	Replayed       uint64             // batches applied from replay
	Duplicates     uint64             // batches dropped as already applied
	DecodeErrors   uint64             // messages or batches that did not decode
	Connects       uint64             // connections made (or bound)
	Resets         [numReasons]uint64 // Handler resets, by Reason
	LastSeq        uint64             // sequence number of the last batch applied
}

type counters struct {
	batches, stored, removed, cleared, unknown  atomic.Uint64
	gaps, replays, replayFailures, replayed     atomic.Uint64
	duplicates, decodeErrors, connects, lastSeq atomic.Uint64
	resets                                      [numReasons]atomic.Uint64
}

// Subscriber follows one engine's events. Make it with New and run it with
// Run.
type Subscriber struct {
	cfg   Config
	h     Handler
	log   *slog.Logger
	zlog  zmq4.Option
	dec   *Decoder
	batch Batch
	c     counters

	// The last batch handed to the Handler and its payload's hash, which
	// tells a replayed batch of the same seq from another process's.
	applied uint64
	fp      uint64
	have    bool
	// The last sequence number received live on the current connection.
	wire     uint64
	haveWire bool
	// replayWorks: a replay has returned batches, so an empty one means
	// the engine's sequence went back, not that it keeps no buffer (an
	// engine with replay but buffer_steps 0 is reset whenever it is
	// checked: configure it without a replay endpoint).
	replayWorks bool
}

// New returns a Subscriber for cfg that hands batches to h.
func New(cfg Config, h Handler) (*Subscriber, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	log := cfg.Logger.With("endpoint", cfg.Endpoint)
	return &Subscriber{
		cfg:  cfg,
		h:    h,
		log:  log,
		zlog: zmq4.WithLogger(slog.NewLogLogger(log.Handler(), slog.LevelDebug)),
		dec:  NewDecoder(),
	}, nil
}

// Stats returns the counters. It is safe to call concurrently with Run.
func (s *Subscriber) Stats() Stats {
	c := &s.c
	st := Stats{
		Batches: c.batches.Load(), Stored: c.stored.Load(), Removed: c.removed.Load(), Cleared: c.cleared.Load(),
		UnknownEvents: c.unknown.Load(), Gaps: c.gaps.Load(), Replays: c.replays.Load(),
		ReplayFailures: c.replayFailures.Load(), Replayed: c.replayed.Load(), Duplicates: c.duplicates.Load(),
		DecodeErrors: c.decodeErrors.Load(), Connects: c.connects.Load(), LastSeq: c.lastSeq.Load(),
	}
	for i := range st.Resets {
		st.Resets[i] = c.resets[i].Load()
	}
	return st
}

// Run follows the engine until ctx is done, connecting (or binding) again
// whenever the connection fails. It returns nil once ctx is done; Run must
// not be called twice at once.
func (s *Subscriber) Run(ctx context.Context) error {
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		src, err := s.open(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			s.log.Warn("kv events: connect failed", "err", err, "retry", wait)
			sleep(ctx, wait)
			wait = min(2*wait, s.cfg.RetryMax)
			continue
		}
		wait = 100 * time.Millisecond
		s.c.connects.Add(1)
		err = s.serve(ctx, src)
		if ctx.Err() != nil {
			break
		}
		s.log.Warn("kv events: connection lost", "err", err)
		sleep(ctx, wait)
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// source is where a subscriber's messages come from: its own connected
// socket, or a bound one (its own or shared).
type source struct {
	in    <-chan received
	close func()
	// alone reports whether a connection error on a bound socket can only
	// be this engine's (no other engine shares the socket).
	alone func() bool
}

// open makes the SUB socket, subscribed, connected or bound, or attaches
// to the shared Listener. The dial runs apart so that a peer stuck in the
// ZMTP handshake cannot hold Run past ctx.
func (s *Subscriber) open(ctx context.Context) (source, error) {
	switch {
	case s.cfg.Listener != nil:
		in, detach, alone, err := s.cfg.Listener.attach(s.cfg.Engine, s.cfg.Queue)
		return source{in, detach, alone}, err
	case s.cfg.Bind:
		lctx, cancel := context.WithCancel(ctx)
		l, err := Listen(lctx, s.cfg.Endpoint, s.cfg.Topic, s.log)
		if err != nil {
			cancel()
			return source{}, err
		}
		in, detach, alone, err := l.attach("", s.cfg.Queue)
		if err != nil {
			cancel()
			return source{}, err
		}
		return source{in, func() { detach(); cancel(); <-l.done }, alone}, nil
	}
	sock := zmq4.NewSub(ctx, s.zlog, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(s.cfg.ReplayTimeout))
	if err := sock.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		sock.Close()
		return source{}, fmt.Errorf("kvevents: subscribe: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- sock.Dial(s.cfg.Endpoint) }()
	t := time.NewTimer(s.cfg.ReplayTimeout + time.Second)
	defer t.Stop()
	var err error
	select {
	case err = <-done:
	case <-t.C:
		err = errors.New("ZMTP handshake timed out")
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		sock.Close()
		return source{}, fmt.Errorf("kvevents: %s: %w", s.cfg.Endpoint, err)
	}
	stop := make(chan struct{})
	in := make(chan received, s.cfg.Queue)
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		for {
			m, err := sock.Recv()
			select {
			case in <- received{m, err}:
			case <-stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	closeFn := func() {
		close(stop)
		sock.Close()
		<-recvDone
	}
	return source{in: in, close: closeFn}, nil
}

// received is one message or receive error from the SUB socket.
type received struct {
	msg zmq4.Msg
	err error
}

// serve applies messages from src until the connection fails (a connected
// socket) or ctx is done. A bound socket outlives its peers: a peer's
// connection failing means the engine may have restarted, so it catches up
// and goes on.
func (s *Subscriber) serve(ctx context.Context, src source) error {
	defer src.close()
	in := src.in
	s.haveWire = false
	s.catchUp(ctx, true)
	// Batches the engine sends before the subscription reaches it are
	// lost, and only the next batch would show it: check once soon.
	idle := time.NewTimer(min(s.idleCheck(), time.Second))
	defer idle.Stop()
	// A subscriber that has only seen live batches has never had a replay
	// return one, and cannot tell a restarted engine (nothing to replay at
	// its old sequence numbers) from one that keeps no buffer: it would
	// count the restart as an unverified break. Ask once, whatever the
	// traffic, once something is applied and while the engine still holds
	// it.
	proof := time.NewTimer(time.Second)
	defer proof.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case r := <-in:
			if r.err != nil {
				if src.alone == nil {
					return r.err
				}
				// On a shared socket the publisher that went away may be
				// another engine's: check this one, but without replay its
				// continuity is not in doubt; a restart shows anyway as its
				// sequence going back.
				alone := src.alone()
				s.log.Info("kv events: a publisher's connection closed; checking for a restart", "err", r.err, "shared", !alone)
				if alone {
					s.haveWire = false
				}
				s.catchUp(ctx, alone)
			} else {
				s.live(ctx, r.msg)
			}
		case <-idle.C:
			if s.cfg.ReplayEndpoint != "" {
				s.catchUp(ctx, false)
			}
		case <-proof.C:
			switch {
			case s.cfg.ReplayEndpoint == "" || s.replayWorks:
			case s.have:
				s.catchUp(ctx, false)
			default:
				proof.Reset(time.Second)
			}
		}
		idle.Reset(s.idleCheck())
	}
}

func (s *Subscriber) idleCheck() time.Duration {
	if s.cfg.IdleCheck < 0 {
		return time.Duration(1<<63 - 1)
	}
	return s.cfg.IdleCheck
}

// live handles one message from the PUB socket.
func (s *Subscriber) live(ctx context.Context, m zmq4.Msg) {
	if len(m.Frames) != 3 || len(m.Frames[1]) != 8 || !bytes.HasPrefix(m.Frames[0], []byte(s.cfg.Topic)) {
		if s.countDecodeError() {
			s.log.Warn("kv events: message is not [topic, seq, payload]", "frames", len(m.Frames))
		}
		return
	}
	seq := binary.BigEndian.Uint64(m.Frames[1])
	if s.haveWire && seq <= s.wire {
		// One publisher's sequence only grows: a new process sent this.
		s.log.Info("kv events: sequence went back; the engine restarted", "seq", seq, "last", s.wire)
		s.reset(Restart)
	}
	s.wire, s.haveWire = seq, true
	switch {
	case s.have && seq <= s.applied:
		s.c.duplicates.Add(1)
		return
	case s.next(seq):
		s.apply(seq, m.Frames[2], false)
		return
	}
	// Batches before seq are missing: those the engine sent before the
	// subscription took, or lost on the way.
	if s.have {
		s.c.gaps.Add(1)
		s.log.Info("kv events: sequence gap", "seq", seq, "last", s.applied)
	}
	if s.cfg.ReplayEndpoint != "" {
		s.catchUp(ctx, false)
	}
	switch {
	case s.have && seq <= s.applied:
		s.c.duplicates.Add(1)
	case s.next(seq):
		s.apply(seq, m.Frames[2], false)
	default:
		if s.have {
			s.reset(Gap)
		}
		s.apply(seq, m.Frames[2], false)
	}
}

// next reports whether seq is the batch to apply next: the one after the
// last applied, or any, on a fresh start, when history cannot be had.
func (s *Subscriber) next(seq uint64) bool {
	if s.have {
		return seq == s.applied+1
	}
	return seq == 0
}

// errBroken ends a replay whose batches do not continue what was applied.
var errBroken = errors.New("replayed stream does not continue the applied one")

// catchUp asks the replay socket for every batch after the last one
// applied (from 0 on a fresh start) and applies them. It starts the replay
// at the last applied batch itself and compares payloads, so that a
// restarted engine whose sequence numbers have grown past the old ones is
// not taken for the same stream; if the replay does not continue the
// applied stream it resets the Handler and applies what the engine still
// has. lost says the connection to the engine was lost, so an engine whose
// continuity cannot be checked (no replay socket, or no answer) is reset.
func (s *Subscriber) catchUp(ctx context.Context, lost bool) {
	if s.cfg.ReplayEndpoint == "" {
		if s.have && lost {
			s.reset(Unverified)
		}
		return
	}
	verify := s.have
	why, err := s.replayFrom(ctx, verify)
	if err == nil && why < numReasons {
		s.log.Info("kv events: replay does not continue the applied stream", "reason", why)
		s.reset(why)
		// The live stream's watermark was the old stream's: the new one
		// starting lower is what this reset already accounts for.
		s.haveWire = false
		_, err = s.replayFrom(ctx, false)
	}
	if err != nil {
		s.c.replayFailures.Add(1)
		s.log.Warn("kv events: replay failed", "endpoint", s.cfg.ReplayEndpoint, "err", err)
		if verify && lost && s.have {
			s.reset(Unverified)
		}
	}
}

// replayFrom runs one replay, from the last applied batch when verify is
// set, else from 0. It returns numReasons when the replay continued the
// applied stream (or none was applied), else why it does not.
func (s *Subscriber) replayFrom(ctx context.Context, verify bool) (Reason, error) {
	start := uint64(0)
	if verify {
		start = s.applied
	}
	s.c.replays.Add(1)
	why, first, got := numReasons, true, false
	err := s.replay(ctx, start, func(seq uint64, payload []byte) error {
		got = true
		if verify && first {
			first = false
			switch {
			case seq != s.applied:
				why = Gap // the engine's buffer no longer reaches back
				return errBroken
			case xxhash.Sum64(payload) != s.fp:
				why = Restart
				return errBroken
			}
			return nil
		}
		first = false
		switch {
		case s.have && seq <= s.applied:
			s.c.duplicates.Add(1)
		case s.have && seq != s.applied+1:
			why = Gap
			return errBroken
		default:
			s.apply(seq, payload, true)
		}
		return nil
	})
	if got {
		s.replayWorks = true
	}
	if errors.Is(err, errBroken) {
		return why, nil
	}
	if err == nil && verify && !got {
		// Nothing at or after the last applied batch: the engine's
		// sequence went back (or it keeps no buffer at all).
		if s.replayWorks {
			return Restart, nil
		}
		return Unverified, nil
	}
	return numReasons, err
}

// endSeq is the replay end marker: -1 as 8 big-endian bytes.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

var errReplayTimeout = errors.New("replay reply timed out")

// replay asks the ROUTER for every buffered batch from start and calls fn
// for each, in order, until the end marker. Replies are [seq, payload]
// (vLLM before 0.26) or [topic, seq, payload], after the empty delimiter.
func (s *Subscriber) replay(ctx context.Context, start uint64, fn func(seq uint64, payload []byte) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ReplayLimit)
	defer cancel()
	sock := zmq4.NewDealer(ctx, s.zlog, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(s.cfg.ReplayTimeout))
	replies := make(chan received)
	go func() {
		if err := sock.Dial(s.cfg.ReplayEndpoint); err != nil {
			select {
			case replies <- received{err: fmt.Errorf("connect: %w", err)}:
			case <-ctx.Done():
			}
			return
		}
		if err := sock.SendMulti(zmq4.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, start))); err != nil {
			select {
			case replies <- received{err: fmt.Errorf("request: %w", err)}:
			case <-ctx.Done():
			}
			return
		}
		for {
			m, err := sock.Recv()
			select {
			case replies <- received{m, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	// The receiving goroutine ends once the socket is closed (every send
	// of it gives up when ctx is done); it is not waited for, as a peer
	// stuck in the ZMTP handshake would hold the dial.
	defer func() {
		cancel()
		sock.Close()
	}()

	t := time.NewTimer(s.cfg.ReplayTimeout)
	defer t.Stop()
	for {
		select {
		case r := <-replies:
			if r.err != nil {
				return r.err
			}
			f := r.msg.Frames
			if len(f) > 0 && len(f[0]) == 0 {
				f = f[1:] // the delimiter
			}
			if len(f) < 2 || len(f) > 3 || len(f[len(f)-2]) != 8 {
				return fmt.Errorf("replay reply of %d frames is not [topic,] seq, payload", len(r.msg.Frames))
			}
			seq, payload := f[len(f)-2], f[len(f)-1]
			if bytes.Equal(seq, endSeq) && len(payload) == 0 {
				return nil
			}
			if err := fn(binary.BigEndian.Uint64(seq), payload); err != nil {
				return err
			}
		case <-t.C:
			return errReplayTimeout
		case <-ctx.Done():
			return ctx.Err()
		}
		t.Reset(s.cfg.ReplayTimeout)
	}
}

// apply decodes and hands one batch to the Handler. A batch that does not
// decode cannot be applied, and the state it would have changed is
// unknown: the Handler is reset.
func (s *Subscriber) apply(seq uint64, payload []byte, replayed bool) {
	s.applied, s.fp, s.have = seq, xxhash.Sum64(payload), true
	s.c.lastSeq.Store(seq)
	unknown := s.dec.Unknown
	if err := s.dec.Decode(payload, &s.batch); err != nil {
		if s.countDecodeError() {
			s.log.Warn("kv events: undecodable batch", "seq", seq, "err", err, "errors", s.c.decodeErrors.Load())
		}
		s.reset(Malformed)
		s.applied, s.fp, s.have = seq, xxhash.Sum64(payload), true
		return
	}
	s.c.unknown.Add(s.dec.Unknown - unknown)
	s.batch.Seq = seq
	for i := range s.batch.Events {
		switch s.batch.Events[i].Kind {
		case BlockStored:
			s.c.stored.Add(1)
		case BlockRemoved:
			s.c.removed.Add(1)
		case AllBlocksCleared:
			s.c.cleared.Add(1)
		}
	}
	s.c.batches.Add(1)
	if replayed {
		s.c.replayed.Add(1)
	}
	s.h.Batch(&s.batch)
}

// reset resets the Handler and forgets the applied stream.
func (s *Subscriber) reset(why Reason) {
	s.c.resets[why].Add(1)
	s.have = false
	s.h.Reset(why)
}

// countDecodeError counts one and reports whether to log it: the first,
// then at powers of two, so that an engine speaking an unknown format does
// not flood the log.
func (s *Subscriber) countDecodeError() bool {
	n := s.c.decodeErrors.Add(1)
	return n&(n-1) == 0
}
