// Package llamacpp runs llama.cpp's llama-server with a real model (Gemma 3
// 270M, Q4_K_M): a real inference engine with real prefix caching, for the
// end-to-end tests that need one and for the bench. build.sh builds it from
// PyPI's pinned llama-cpp-python sdist into a cache outside the clone
// (`make llamacpp`); nothing of it is committed.
//
// llama-server keeps one sequence per slot (-np) and reuses the longest
// common prefix of a slot's last prompt; with --cache-ram 0 that is all it
// keeps, so its cache is its slots, as a GPU's is its KV blocks.
package llamacpp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Version is the llama-cpp-python release whose vendored llama.cpp is built.
const Version = "0.3.36"

// Model is the name the servers serve their model under (--alias).
const Model = "gemma-3-270m"

// Install is a built llama-server and its model.
type Install struct {
	Server, Model string
}

// Dir returns the cache build.sh fills: $KVROUTE_LLAMACPP_DIR, else
// ~/.cache/kvroute/llama.cpp-<Version>-avx2 (under $XDG_CACHE_HOME if
// set), where make llamacpp builds it.
func Dir() string {
	if d := os.Getenv("KVROUTE_LLAMACPP_DIR"); d != "" {
		return d
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, _ := os.UserHomeDir()
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "kvroute", "llama.cpp-"+Version+"-avx2")
}

// ErrNotBuilt means the cache holds no server or no model yet.
var ErrNotBuilt = errors.New("llamacpp: llama-server is not built: run make llamacpp")

// Find returns the install in Dir.
func Find() (Install, error) {
	dir := Dir()
	in := Install{Server: filepath.Join(dir, "bin", "llama-server"), Model: filepath.Join(dir, "models", "gemma-3-270m-q4_k_m.gguf")}
	for _, f := range []string{in.Server, in.Model} {
		if _, err := os.Stat(f); err != nil {
			return in, fmt.Errorf("%w (%s: %v)", ErrNotBuilt, f, err)
		}
	}
	return in, nil
}

// Config shapes one server.
type Config struct {
	Host string // default 127.0.0.1
	Port int    // 0: a free one
	// Slots is how many sequences it runs and caches at once (-np);
	// Context the tokens each slot holds.
	Slots, Context int
	// Threads for generation and for prompt processing (-t, -tb).
	Threads int
	// ChatTemplateFile, if set, replaces the model's chat template.
	ChatTemplateFile string
	// Args are more flags.
	Args []string
	// Log receives the server's output; nil discards it.
	Log io.Writer
}

// Server is a running llama-server.
type Server struct {
	in   Install
	cfg  Config
	addr string
	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs a server and waits until it has loaded the model.
func Start(ctx context.Context, in Install, cfg Config) (*Server, error) {
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.Slots == 0 {
		cfg.Slots = 2
	}
	if cfg.Context == 0 {
		cfg.Context = 4096
	}
	if cfg.Threads == 0 {
		cfg.Threads = 1
	}
	if cfg.Port == 0 {
		p, err := freePort(cfg.Host)
		if err != nil {
			return nil, err
		}
		cfg.Port = p
	}
	s := &Server{in: in, cfg: cfg, addr: net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port))}
	if err := s.start(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Env is what the servers run with in their environment: the prompt each
// slot holds shown on /slots, which cachesync reads so that gateways can
// name the slot holding a request's prefix.
var Env = []string{"LLAMA_SERVER_SLOTS_DEBUG=1"}

// Args returns the server's command line, for reports.
func (s *Server) Args() []string {
	c := s.cfg
	args := []string{
		"-m", s.in.Model, "--alias", Model, "--host", c.Host, "--port", strconv.Itoa(c.Port),
		"-np", strconv.Itoa(c.Slots), "-c", strconv.Itoa(c.Slots * c.Context),
		"-t", strconv.Itoa(c.Threads), "-tb", strconv.Itoa(c.Threads),
		// The slots are the whole cache, like a GPU's KV blocks: no
		// prompt cache in host memory behind them.
		"--cache-ram", "0", "--metrics", "--no-webui",
	}
	if c.ChatTemplateFile != "" {
		args = append(args, "--chat-template-file", c.ChatTemplateFile)
	}
	return append(args, c.Args...)
}

func (s *Server) start(ctx context.Context) error {
	cmd := exec.Command(s.in.Server, s.Args()...)
	cmd.Env = append(os.Environ(), Env...)
	out := s.cfg.Log
	if out == nil {
		out = io.Discard
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("llamacpp: start: %w", err)
	}
	s.cmd, s.done = cmd, make(chan struct{})
	go func() { cmd.Wait(); close(s.done) }()
	if err := s.waitHealthy(ctx, 2*time.Minute); err != nil {
		s.Kill()
		return err
	}
	return nil
}

// waitHealthy polls /health, which answers 503 while the model loads.
func (s *Server) waitHealthy(ctx context.Context, within time.Duration) error {
	client := http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(within)
	for {
		select {
		case <-s.done:
			return fmt.Errorf("llamacpp: %s exited while starting", s.addr)
		default:
		}
		resp, err := client.Get(s.URL() + "/health")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("llamacpp: %s not healthy after %v", s.addr, within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Addr returns host:port.
func (s *Server) Addr() string { return s.addr }

// URL returns http://host:port.
func (s *Server) URL() string { return "http://" + s.addr }

// Kill stops the server at once (SIGKILL), as a crash would.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
}

// Stop stops the server gracefully, then by force after 5 s.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		s.Kill()
	}
}

// Restart starts the server again on the same address, with an empty
// cache and its counters from zero.
func (s *Server) Restart(ctx context.Context) error {
	select {
	case <-s.done:
	default:
		return errors.New("llamacpp: restart of a running server")
	}
	return s.start(ctx)
}

// Counters are a server's Prometheus counters since it started.
type Counters struct {
	// PromptTokens counts every prompt token, CachedTokens those of them
	// reused from a slot's cache.
	PromptTokens, CachedTokens float64
	// Generated counts output tokens.
	Generated float64
}

// Minus returns c - o.
func (c Counters) Minus(o Counters) Counters {
	return Counters{c.PromptTokens - o.PromptTokens, c.CachedTokens - o.CachedTokens, c.Generated - o.Generated}
}

// HitRate is the share of prompt tokens served from the cache.
func (c Counters) HitRate() float64 {
	if c.PromptTokens <= 0 {
		return 0
	}
	return c.CachedTokens / c.PromptTokens
}

// ReadCounters scrapes the server's /metrics.
func (s *Server) ReadCounters() (Counters, error) {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(s.URL() + "/metrics")
	if err != nil {
		return Counters{}, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return Counters{}, fmt.Errorf("llamacpp: metrics of %s: %w", s.addr, err)
	}
	get := func(name string) float64 {
		f := fams[name]
		if f == nil || len(f.Metric) == 0 {
			return 0
		}
		return value(f.Metric[0])
	}
	cached := get("llamacpp:prompt_tokens_cached_total")
	// prompt_tokens_total counts only the tokens it computed.
	return Counters{PromptTokens: get("llamacpp:prompt_tokens_total") + cached, CachedTokens: cached,
		Generated: get("llamacpp:tokens_predicted_total")}, nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}

func freePort(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
