package vllmsim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"

	"github.com/go-zeromq/zmq4"
)

// endSeq is the replay end marker: -1 as 8 big-endian bytes.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// publisher sends event batches as vLLM's ZmqEventPublisher does: a PUB
// socket sends [topic, seq (8 bytes, big-endian), payload] per batch, seq
// counting from 0 per process, and an optional ROUTER socket replays the
// last buffered batches from a requested seq, then the end marker.
type publisher struct {
	log         *slog.Logger
	pub, router zmq4.Socket
	topic       []byte
	withTopic   bool // replay replies carry the topic frame (vLLM >= 0.26)
	pubEP       string
	replayEP    string
	cancel      context.CancelFunc
	done        chan struct{}

	mu   sync.Mutex
	seq  uint64
	ring []replayEntry // the last len(ring) <= bufferSteps batches, oldest at head
	head int
	max  int
}

type replayEntry struct {
	seq     uint64
	payload []byte
}

// endpointSpec is a ZeroMQ endpoint and whether to bind it.
type endpointSpec struct {
	addr string
	bind bool
}

// pubEndpoint applies vLLM's rule: bind if the endpoint holds "*" or "::" or
// is ipc/inproc, else connect.
func pubEndpoint(ep string) endpointSpec {
	bind := strings.Contains(ep, "*") || strings.Contains(ep, "::") ||
		strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://")
	return endpointSpec{ep, bind}
}

func newPublisher(log *slog.Logger, pubEP endpointSpec, replayEP string, cfg KVEventsConfig, withTopic bool) (*publisher, error) {
	ctx, cancel := context.WithCancel(context.Background())
	zlog := slog.NewLogLogger(log.Handler(), slog.LevelDebug)
	p := &publisher{
		log:       log,
		topic:     []byte(cfg.Topic),
		withTopic: withTopic,
		max:       cfg.BufferSteps,
		cancel:    cancel,
		done:      make(chan struct{}),
	}
	opts := []zmq4.Option{zmq4.WithLogger(zlog)}
	if !pubEP.bind {
		opts = append(opts, zmq4.WithDialerMaxRetries(-1), zmq4.WithAutomaticReconnect(true))
	}
	p.pub = zmq4.NewPub(ctx, opts...)
	if cfg.HWM > 0 {
		if err := p.pub.SetOption(zmq4.OptionHWM, cfg.HWM); err != nil {
			p.close()
			return nil, fmt.Errorf("vllmsim: set PUB hwm: %w", err)
		}
	}
	if pubEP.bind {
		if err := p.pub.Listen(pubEP.addr); err != nil {
			p.close()
			return nil, fmt.Errorf("vllmsim: bind PUB: %w", err)
		}
		p.pubEP = boundEndpoint(pubEP.addr, p.pub.Addr())
	} else {
		// Like libzmq's connect: returns at once, connects (and reconnects)
		// in the background; batches sent before that are dropped.
		p.pubEP = pubEP.addr
		go func() {
			if err := p.pub.Dial(pubEP.addr); err != nil && ctx.Err() == nil {
				log.Warn("kv events: PUB connect failed", "endpoint", pubEP.addr, "err", err)
			}
		}()
	}
	if replayEP == "" {
		close(p.done)
		return p, nil
	}
	p.router = zmq4.NewRouter(ctx, zmq4.WithLogger(zlog))
	if err := p.router.Listen(replayEP); err != nil {
		close(p.done)
		p.close()
		return nil, fmt.Errorf("vllmsim: bind replay ROUTER: %w", err)
	}
	p.replayEP = boundEndpoint(replayEP, p.router.Addr())
	go p.serveReplay(ctx)
	return p, nil
}

// boundEndpoint names a bound socket's address so that a local peer can
// connect to it: the real port, and 127.0.0.1 for a wildcard host.
func boundEndpoint(ep string, addr net.Addr) string {
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return ep
	}
	host := ta.IP.String()
	if ta.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "tcp://" + net.JoinHostPort(host, fmt.Sprint(ta.Port))
}

// publish sends one encoded batch and keeps it for replay.
func (p *publisher) publish(payload []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := p.seq
	p.seq++
	if p.max > 0 {
		if len(p.ring) < p.max {
			p.ring = append(p.ring, replayEntry{seq, payload})
		} else {
			p.ring[p.head] = replayEntry{seq, payload}
			p.head = (p.head + 1) % p.max
		}
	}
	// PUB sends only queue the message, so holding the lock keeps seq order.
	msg := zmq4.NewMsgFrom(p.topic, binary.BigEndian.AppendUint64(nil, seq), payload)
	if err := p.pub.SendMulti(msg); err != nil {
		p.log.Warn("kv events: send failed", "seq", seq, "err", err)
	}
}

// buffered returns the kept batches with seq >= from, oldest first.
func (p *publisher) buffered(from uint64) []replayEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []replayEntry
	for i := range p.ring {
		e := p.ring[(p.head+i)%len(p.ring)]
		if e.seq >= from {
			out = append(out, e)
		}
	}
	return out
}

func (p *publisher) serveReplay(ctx context.Context) {
	defer close(p.done)
	for {
		msg, err := p.router.Recv()
		if err != nil {
			if ctx.Err() == nil {
				p.log.Warn("kv events: replay receive failed", "err", err)
			}
			return
		}
		// [identity, "", start seq]; vLLM ignores anything else.
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			p.log.Warn("kv events: invalid replay request", "frames", len(msg.Frames))
			continue
		}
		id := msg.Frames[0]
		from := binary.BigEndian.Uint64(msg.Frames[2])
		for _, e := range p.buffered(from) {
			if err := p.router.SendMulti(p.replayMsg(id, binary.BigEndian.AppendUint64(nil, e.seq), e.payload, p.topic)); err != nil {
				p.log.Warn("kv events: replay send failed", "err", err)
				break
			}
		}
		if err := p.router.SendMulti(p.replayMsg(id, endSeq, []byte{}, []byte{})); err != nil {
			p.log.Warn("kv events: replay end send failed", "err", err)
		}
	}
}

func (p *publisher) replayMsg(id, seq, payload, topic []byte) zmq4.Msg {
	if p.withTopic {
		return zmq4.NewMsgFrom(id, []byte{}, topic, seq, payload)
	}
	return zmq4.NewMsgFrom(id, []byte{}, seq, payload)
}

func (p *publisher) close() error {
	p.cancel()
	var errs []error
	if p.pub != nil {
		errs = append(errs, p.pub.Close())
	}
	if p.router != nil {
		errs = append(errs, p.router.Close())
		<-p.done
	}
	return errors.Join(errs...)
}
