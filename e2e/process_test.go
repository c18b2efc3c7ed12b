package e2e

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/e2e/vllmsim"
)

var (
	cachesyncOnce sync.Once
	cachesyncBin  string
	cachesyncErr  error
)

// cachesyncBinary builds cachesync once per test binary.
func cachesyncBinary(t *testing.T) string {
	t.Helper()
	cachesyncOnce.Do(func() {
		cachesyncBin = filepath.Join(workDir, "cachesync")
		if out, err := exec.Command("go", "build", "-o", cachesyncBin, "../cachesync").CombinedOutput(); err != nil {
			cachesyncErr = &buildError{string(out), err}
		}
	})
	if cachesyncErr != nil {
		t.Fatal(cachesyncErr)
	}
	return cachesyncBin
}

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return "build cachesync: " + e.err.Error() + "\n" + e.out }

// freeAddr returns a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// cachesyncProcess is cachesync run as a process of its own, precise for
// the engines, so that it can be killed (SIGKILL) and its memory is its
// own.
type cachesyncProcess struct {
	addr string
	args []string
	cmd  *exec.Cmd
}

func newCachesyncProcess(t *testing.T, engines []*vllmsim.Engine, addr string, extra ...string) *cachesyncProcess {
	t.Helper()
	var spec []string
	for _, e := range engines {
		spec = append(spec, e.Addr()+"?events="+e.EventsEndpoint()+"&replay="+e.ReplayEndpoint())
	}
	p := &cachesyncProcess{addr: addr, args: append([]string{"-listen", addr, "-engines", strings.Join(spec, ","),
		"-report-token", reportToken, "-tokenizer", "cl100k_base", "-scrape-interval", "250ms", "-log-level", "warn"}, extra...)}
	t.Cleanup(p.kill)
	return p
}

// start runs the process and waits until it answers.
func (p *cachesyncProcess) start(t *testing.T) {
	t.Helper()
	p.cmd = exec.Command(cachesyncBinary(t), p.args...)
	p.cmd.Stderr = os.Stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "cachesync to listen on "+p.addr, func() bool {
		resp, err := http.Get("http://" + p.addr + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	})
}

// kill sends SIGKILL and reaps the process.
func (p *cachesyncProcess) kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.cmd.Wait()
	p.cmd = nil
}

// clients runs n clients, client c calling do(c, i) for its i-th request
// in a loop, until the returned stop is called; stop waits for them and
// may be called again. It is also called at the end of the test.
func clients(t *testing.T, n int, do func(c, i int)) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for c := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				do(c, i)
			}
		}()
	}
	var once sync.Once
	stop = func() { once.Do(func() { close(done); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// window counts one phase of a phased load: requests sent and failed, and
// decisions by affinity and by rendezvous (no snapshot).
type window struct{ sent, failed, affinity, rendezvous int }

// phasedLoad runs 4 clients posting tenant(c+i)'s chat requests to url,
// counting them in the window of the current phase (0 at first, then
// whatever set says) until stop.
type phasedLoad struct {
	mu      sync.Mutex
	phase   int
	windows []window
	stop    func()
}

func newPhasedLoad(t *testing.T, client *http.Client, url string, phases int, tenant func(int) string, pause time.Duration) *phasedLoad {
	l := &phasedLoad{windows: make([]window, phases)}
	l.stop = clients(t, 4, func(c, i int) {
		code, d, err := tryPost(client, url, simChat(tenant(c+i), "client "+strconv.Itoa(c)+" question "+strconv.Itoa(i), 2))
		l.mu.Lock()
		w := &l.windows[l.phase]
		w.sent++
		if err != nil || code != http.StatusOK {
			w.failed++
		}
		switch field(d, "reason") {
		case "affinity":
			w.affinity++
		case "rendezvous":
			w.rendezvous++
		}
		l.mu.Unlock()
		time.Sleep(pause)
	})
	return l
}

// set moves the clients' counting to phase p.
func (l *phasedLoad) set(p int) {
	l.mu.Lock()
	l.phase = p
	l.mu.Unlock()
}

// failures logs each phase, named, and fails the test for a failed
// request in any.
func (l *phasedLoad) failures(t *testing.T, names ...string) {
	t.Helper()
	for i, w := range l.windows {
		t.Logf("%s: %d requests, %d failed, affinity %.0f%%, rendezvous %d", names[i], w.sent, w.failed,
			100*float64(w.affinity)/float64(max(w.sent, 1)), w.rendezvous)
		if w.failed > 0 || w.sent < 20 {
			t.Errorf("%s: %d of %d requests failed", names[i], w.failed, w.sent)
		}
	}
}

// skipUnderRace skips a test whose code under test runs outside Go's race
// detector (in Envoy, in a module under wazero, in a cachesync process): it
// would find nothing there, and the race pass is the longest part of CI.
func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceDetector {
		t.Skip("nothing here for the race detector: the full pass runs it")
	}
}
