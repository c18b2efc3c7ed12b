package vllmsim

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/kvroute/kvroute/internal/syncbuf"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/vmihailenco/msgpack/v5"
)

// testConfig is a small, fast engine: time runs 100 times faster than real
// time, with a 16-block cache unless the test changes it.
func testConfig() Config {
	return Config{
		NumGPUBlocks: 64,
		TimeScale:    0.01,
		KVEvents:     KVEventsConfig{EnableKVCacheEvents: true},
		Logger:       discardLogger(),
	}
}

// startEngine starts one engine on loopback ports, closed with the test.
func startEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	es, err := StartN(context.Background(), 1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { es[0].Close() })
	return es[0]
}

// post sends a JSON body and returns the status and the body.
func post(t *testing.T, url, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// chat posts a one-message chat request with max_tokens and checks for 200.
func chat(t *testing.T, e *Engine, content string, maxTokens int) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{
		"messages":   []map[string]string{{"role": "user", "content": content}},
		"max_tokens": maxTokens,
	})
	code, body := post(t, e.URL()+"/v1/chat/completions", string(b))
	if code != http.StatusOK {
		t.Fatalf("chat: %d %s", code, body)
	}
}

// scrape parses /metrics with the Prometheus text parser.
func scrape(t *testing.T, e *Engine) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(e.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.LegacyValidation)
	mf, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("metrics do not parse: %v", err)
	}
	return mf
}

// value returns a counter's or gauge's value, or a histogram's sum.
func value(t *testing.T, mf map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	f, ok := mf[name]
	if !ok || len(f.Metric) == 0 {
		t.Fatalf("metric %s missing", name)
	}
	m := f.Metric[0]
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return m.Histogram.GetSampleSum()
	}
	t.Fatalf("metric %s has no value", name)
	return 0
}

// histCount returns a histogram's sample count.
func histCount(t *testing.T, mf map[string]*dto.MetricFamily, name string) uint64 {
	t.Helper()
	f, ok := mf[name]
	if !ok || len(f.Metric) == 0 || f.Metric[0].Histogram == nil {
		t.Fatalf("histogram %s missing", name)
	}
	return f.Metric[0].Histogram.GetSampleCount()
}

// ttftOf runs one request and returns its time to first token in
// simulated seconds, read from the TTFT histogram.
func ttftOf(t *testing.T, e *Engine, content string) float64 {
	t.Helper()
	before := value(t, scrape(t, e), "vllm:time_to_first_token_seconds")
	chat(t, e, content, 1)
	return value(t, scrape(t, e), "vllm:time_to_first_token_seconds") - before
}

// wireEvent is one decoded event, whichever encoding carried it.
type wireEvent struct {
	Type     string
	Hashes   []uint64
	Parent   any
	Tokens   []int
	Medium   any
	Locality any
}

// wireBatch is one received message.
type wireBatch struct {
	Topic  string
	Seq    uint64
	Events []wireEvent
}

// subscriber is a Go SUB on an engine's events.
type subscriber struct {
	t   *testing.T
	sub zmq4.Socket
	ch  chan wireBatch
}

// subscribe connects a SUB and waits until it receives: it resets the
// prefix cache (one AllBlocksCleared batch) until a batch arrives, then
// drains what is left, so that the test starts from a quiet stream.
func subscribe(t *testing.T, e *Engine) *subscriber {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &subscriber{t: t, sub: zmq4.NewSub(ctx), ch: make(chan wireBatch, 1024)}
	t.Cleanup(func() { cancel(); s.sub.Close() })
	if err := s.sub.Dial(e.EventsEndpoint()); err != nil {
		t.Fatal(err)
	}
	if err := s.sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			msg, err := s.sub.Recv()
			if err != nil {
				close(s.ch)
				return
			}
			s.ch <- decodeWire(t, msg.Frames)
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if !e.ResetPrefixCache(false) {
			t.Fatal("reset refused on an idle engine")
		}
		select {
		case <-s.ch:
			s.drain(100 * time.Millisecond)
			return s
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("subscriber never received")
		}
	}
}

// drain returns the batches that arrive until the stream is quiet for d.
func (s *subscriber) drain(d time.Duration) []wireBatch {
	var out []wireBatch
	for {
		select {
		case b, ok := <-s.ch:
			if !ok {
				return out
			}
			out = append(out, b)
		case <-time.After(d):
			return out
		}
	}
}

// events flattens batches.
func events(bs []wireBatch) []wireEvent {
	var out []wireEvent
	for _, b := range bs {
		out = append(out, b.Events...)
	}
	return out
}

// decodeWire decodes a [topic, seq, payload] message in any encoding.
func decodeWire(t *testing.T, frames [][]byte) wireBatch {
	if len(frames) != 3 || len(frames[1]) != 8 {
		t.Errorf("message has %d frames", len(frames))
		return wireBatch{}
	}
	b := wireBatch{Topic: string(frames[0]), Seq: binary.BigEndian.Uint64(frames[1])}
	var raw any
	if err := msgpack.Unmarshal(frames[2], &raw); err != nil {
		t.Errorf("payload: %v", err)
		return b
	}
	var evs []any
	switch v := raw.(type) {
	case []any:
		evs, _ = v[1].([]any)
	case map[string]any:
		evs, _ = v["events"].([]any)
	}
	for _, ev := range evs {
		b.Events = append(b.Events, decodeEvent(ev))
	}
	return b
}

func decodeEvent(ev any) wireEvent {
	fields := map[string]any{}
	switch v := ev.(type) {
	case map[string]any:
		fields = v
	case []any:
		fields["type"] = v[0]
		names := map[string][]string{
			"BlockStored":  {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"},
			"BlockRemoved": {"block_hashes", "medium"},
		}[v[0].(string)]
		for i, n := range names {
			if i+1 < len(v) {
				fields[n] = v[i+1]
			}
		}
	}
	w := wireEvent{Type: fields["type"].(string), Parent: fields["parent_block_hash"], Medium: fields["medium"], Locality: fields["locality"]}
	hs, _ := fields["block_hashes"].([]any)
	for _, h := range hs {
		w.Hashes = append(w.Hashes, toUint64(h))
	}
	ts, _ := fields["token_ids"].([]any)
	for _, x := range ts {
		w.Tokens = append(w.Tokens, int(toUint64(x)))
	}
	return w
}

func toUint64(v any) uint64 {
	switch n := v.(type) {
	case int8:
		return uint64(n)
	case int16:
		return uint64(n)
	case int32:
		return uint64(n)
	case int64:
		return uint64(n)
	case uint8:
		return uint64(n)
	case uint16:
		return uint64(n)
	case uint32:
		return uint64(n)
	case uint64:
		return n
	case []byte:
		return binary.BigEndian.Uint64(n[len(n)-8:])
	}
	return 0
}

// pyPeer runs testdata/kvpeer.py and hands back its JSON lines.
type pyPeer struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan map[string]any
	stderr *syncbuf.Buffer
	exited chan struct{} // closed once the process has been waited for
}

// startPeer starts the Python peer. It fails the test, never skips it,
// when Python or its packages are missing.
func startPeer(t *testing.T, args ...string) *pyPeer {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is not on PATH: run make setup (pip install -r e2e/requirements.txt)")
	}
	p := &pyPeer{cmd: exec.Command(py, append([]string{"testdata/kvpeer.py"}, args...)...), lines: make(chan map[string]any, 1024), stderr: &syncbuf.Buffer{}, exited: make(chan struct{})}
	p.cmd.Stderr = p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 16<<20)
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Errorf("peer printed %q", sc.Text())
				continue
			}
			p.lines <- m
		}
		// Wait closes the pipe, so only once everything is read.
		p.cmd.Wait()
		close(p.exited)
		close(p.lines)
	}()
	t.Cleanup(func() {
		p.stdin.Close()
		select {
		case <-p.exited:
		case <-time.After(5 * time.Second):
			p.cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

// next returns the peer's next line, failing the test after d.
func (p *pyPeer) next(t *testing.T, d time.Duration) map[string]any {
	t.Helper()
	select {
	case m, ok := <-p.lines:
		if !ok {
			<-p.exited
			if p.cmd.ProcessState.ExitCode() == 3 {
				t.Fatalf("Python peer is missing packages: run make setup (pip install -r e2e/requirements.txt): %s", p.stderr)
			}
			t.Fatalf("Python peer exited: %s", p.stderr)
		}
		return m
	case <-time.After(d):
		t.Fatalf("no line from the Python peer within %v; stderr: %s", d, p.stderr)
	}
	return nil
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
