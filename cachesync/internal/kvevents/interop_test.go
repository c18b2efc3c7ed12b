package kvevents

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/syncbuf"
)

// pyPub is testdata/vllmpub.py: vLLM's publisher logic on libzmq (pyzmq)
// with msgspec encoding.
type pyPub struct {
	stdin       io.WriteCloser
	lines       chan map[string]any
	pub, replay string
	stderr      syncbuf.Buffer
}

func startPyPub(t *testing.T, mode, shape string) *pyPub {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is not on PATH: run make setup (pip install -r e2e/requirements.txt)")
	}
	p := &pyPub{lines: make(chan map[string]any, 64)}
	cmd := exec.Command(py, "testdata/vllmpub.py", mode, shape)
	cmd.Stderr = &p.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				p.lines <- m
			}
		}
		cmd.Wait()
		close(exited)
		close(p.lines)
	}()
	t.Cleanup(func() {
		p.stdin.Close()
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	m := p.next(t)
	p.pub, p.replay = m["pub"].(string), m["replay"].(string)
	return p
}

func (p *pyPub) next(t *testing.T) map[string]any {
	t.Helper()
	select {
	case m, ok := <-p.lines:
		if !ok {
			t.Fatalf("vllmpub.py exited: %s", p.stderr.String())
		}
		return m
	case <-time.After(30 * time.Second): // Python starts slowly on a busy machine
		t.Fatalf("vllmpub.py is silent: %s", p.stderr.String())
	}
	return nil
}

func (p *pyPub) do(t *testing.T, cmd string) uint64 {
	t.Helper()
	fmt.Fprintln(p.stdin, cmd)
	return uint64(p.next(t)["seq"].(float64))
}

// TestLibzmqPeer follows vLLM's own publisher logic on libzmq: live
// batches over PUB (bound, or connecting to the subscriber), and batches
// lost to a full high-water mark fetched from the ROUTER, in both reply
// shapes.
func TestLibzmqPeer(t *testing.T) {
	for _, tt := range []struct {
		name  string
		bind  bool
		shape string
	}{
		{"pub binds", false, "topic"},
		{"replay without topic", false, "notopic"},
		{"pub connects", true, "topic"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mode, ep := "bind", ""
			if tt.bind {
				ep = freeEndpoint(t)
				mode = "connect:" + ep
			}
			p := startPyPub(t, mode, tt.shape)
			if !tt.bind {
				ep = p.pub
			}
			next := p.do(t, "publish 3")
			r := &recorder{}
			s := run(t, Config{Endpoint: ep, Bind: tt.bind, ReplayEndpoint: p.replay, Topic: "kv@"}, r)
			waitFor(t, "the first batches", lastSeq(r, next-1, 1))
			for deadline := time.Now().Add(20 * time.Second); ; {
				if st := s.Stats(); st.Batches > st.Replayed {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("nothing arrived live: %+v", s.Stats())
				}
				p.do(t, "publish 1")
				time.Sleep(20 * time.Millisecond)
			}
			p.do(t, "drop 3")
			next = p.do(t, "publish 2")
			waitFor(t, "the batches after the lost ones", lastSeq(r, next-1, 1))
			bs, resets := r.snapshot()
			if len(resets) != 0 || len(bs) != int(next) || !contiguous(bs) || bs[0].seq != 0 {
				t.Fatalf("applied %v, resets %v", bs, resets)
			}
			if st := s.Stats(); st.Gaps == 0 {
				t.Fatalf("no gap seen: %+v", st)
			}
		})
	}
}
