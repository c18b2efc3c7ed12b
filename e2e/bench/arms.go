package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/cachesync/daemon"
	"github.com/kvroute/kvroute/e2e/envoy"
)

// Tools are the binaries and files the arms run.
type Tools struct {
	// EnvoyYAML is the shipped envoy.yaml; Wasm the built module.
	EnvoyYAML, Wasm string
	// Cachesync is the cachesync binary; "" runs it in this process.
	Cachesync string
	// Routers are the rival routers' executables by arm family: "smg",
	// "sglang-router", "vllm-router".
	Routers map[string]string
	// GoodputSLO is the workload's goodput SLO (Workload.Goodput), for an
	// arm that states it to its router.
	GoodputSLO map[string]float64
}

// Arm is one router in front of the engines.
type Arm struct {
	Name  string
	About string
	// Variant arms answer one workload's question (the policy modes on
	// mixed) and are not among the every-arm default of b2b-saas.
	Variant bool
	start   func(ctx context.Context, t *Tools, p *pool, dir string) (*router, error)
}

// router is a running arm.
type router struct {
	url     string
	command []string // how it was started, for the report
	stop    func()
	// decisions reads kvroute's decisions by reason, where the arm has them.
	decisions func() map[string]int64
	// cachesync is the base URL of the arm's cachesync, "" for arms
	// without one.
	cachesync string
}

const reportToken = "kvroute-bench-token"

// Arms are every arm the bench knows, in report order.
var Arms = []*Arm{
	{Name: "envoy-round-robin", About: "Envoy ROUND_ROBIN, the shipped envoy.yaml without the filter", start: envoyArm("round_robin")},
	{Name: "envoy-least-request", About: "Envoy LEAST_REQUEST, the shipped envoy.yaml without the filter", start: envoyArm("least_request")},
	{Name: "kvroute-precise", About: "kvroute with cachesync following the engines' KV events", start: kvrouteArm(true, nil)},
	{Name: "kvroute-approx", About: "kvroute with cachesync indexing from routing reports only (no events)", start: kvrouteArm(false, nil)},
	// Without moves too: a moved group's pin would send it where it is not
	// best cached.
	{Name: "kvroute-sticky", About: "kvroute precise with an hour's TTFT SLO, which every endpoint meets, so the best-cached one always wins (what \"until saturated\" buys), and no group moves",
		start: kvrouteArm(true, map[string]any{"slo_ttft_ms": 3_600_000}, "-move-groups=false")},
	{Name: "kvroute-prefill", About: "kvroute precise with policy.mode prefill: TTFT alone", Variant: true, start: kvrouteArm(true, map[string]any{"mode": "prefill"})},
	{Name: "kvroute-decode", About: "kvroute precise with policy.mode decode: the decoding alone", Variant: true, start: kvrouteArm(true, map[string]any{"mode": "decode"})},
	{Name: "kvroute-unmoved", About: "kvroute precise without cachesync's group moves (-move-groups=false), the default before 2026-12-07", Variant: true,
		start: kvrouteArm(true, nil, "-move-groups=false")},
	{Name: "kvroute-slo", About: "kvroute precise with the goodput SLO stated, as policy.slo_ttft_ms and slo_tpot_ms", Variant: true, start: kvrouteSLOArm},
	{Name: "sglang-router", About: "sglang-router 0.3.2 cache_aware", start: rivalArm("sglang-router", "launch", "--policy", "cache_aware")},
	{Name: "smg", About: "smg 1.13.0 cache_aware", start: rivalArm("smg", "launch", "--policy", "cache_aware")},
	{Name: "vllm-router", About: "vllm-router 0.1.17 cache_aware", start: rivalArm("vllm-router", "", "--policy", "cache_aware")},
	{Name: "vllm-router-kv", About: "vllm-router 0.1.17 kv_aware, fed the engines' KV events", start: vllmRouterKVArm},
	{Name: "oracle", About: "an oracle: each engine's true cache contents and queue at the moment of routing, lowest predicted TTFT", start: oracleArm},
}

// ArmByName returns the named arm.
func ArmByName(name string) (*Arm, error) {
	for _, a := range Arms {
		if a.Name == name {
			return a, nil
		}
	}
	return nil, fmt.Errorf("bench: unknown arm %q", name)
}

func envoyArm(policy string) func(context.Context, *Tools, *pool, string) (*router, error) {
	return func(ctx context.Context, t *Tools, p *pool, dir string) (*router, error) {
		cfg, err := envoy.LoadConfig(t.EnvoyYAML)
		if err != nil {
			return nil, err
		}
		steps := []error{cfg.UseFreePorts(), cfg.SetEndpoints("engines", p.addrs()), cfg.RemoveWasmFilters(), p.tune(cfg)}
		if policy == "round_robin" {
			steps = append(steps, cfg.SetRoundRobin("engines"))
		} else {
			steps = append(steps, cfg.SetLeastRequest("engines"))
		}
		if err := errors.Join(steps...); err != nil {
			return nil, err
		}
		return startEnvoy(ctx, cfg, dir, []string{"envoy", "-c", "envoy.yaml (no filter, " + policy + ")", "--concurrency", "2"})
	}
}

func startEnvoy(ctx context.Context, cfg *envoy.Config, dir string, command []string) (*router, error) {
	b, err := cfg.Marshal()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "envoy.json"), b, 0o644); err != nil {
		return nil, err
	}
	proc, err := envoy.Start(ctx, envoy.Options{Config: b, Dir: dir, Concurrency: 2})
	if err != nil {
		return nil, fmt.Errorf("bench: start Envoy: %w", err)
	}
	url, err := proc.ListenerURL(ctx, "llm")
	if err != nil {
		proc.Stop()
		return nil, err
	}
	return &router{url: url, command: command, stop: func() { proc.Stop() }, decisions: func() map[string]int64 {
		stats, err := proc.Stats(context.Background())
		if err != nil {
			return nil
		}
		out := map[string]int64{}
		for k, v := range stats {
			if reason, ok := strings.CutPrefix(k, "wasmcustom.kvroute.decisions."); ok {
				out[reason] = v
			}
		}
		return out
	}}, nil
}

// DecisionLog is the file in a kvroute arm's directory where Envoy logs
// every request's decision header, to explain a run after the fact.
const DecisionLog = "decisions.log"

const decisionLogFormat = "%START_TIME(%s.%3f)% %RESPONSE_CODE% %RESP(X-KVROUTE-DECISION)%\n"

// kvrouteArm starts cachesync, with extra flags, and Envoy with the filter.
func kvrouteArm(precise bool, policy map[string]any, extra ...string) func(context.Context, *Tools, *pool, string) (*router, error) {
	return func(ctx context.Context, t *Tools, p *pool, dir string) (*router, error) {
		spec := p.addrs()
		if precise {
			engines, err := p.simulated("KV events")
			if err != nil {
				return nil, err
			}
			for i, e := range engines {
				spec[i] += "?events=" + e.EventsEndpoint() + "&replay=" + e.ReplayEndpoint()
			}
		}
		args := []string{"-engines", strings.Join(spec, ","), "-report-token", reportToken, "-scrape-interval", "250ms", "-pending-ttl", "10s"}
		if precise {
			args = append(args, "-tokenizer", "cl100k_base")
		}
		args = append(args, extra...)
		addr, stopCachesync, err := startCachesync(ctx, t, args, dir)
		if err != nil {
			return nil, err
		}
		cfg, err := envoy.LoadConfig(t.EnvoyYAML)
		if err != nil {
			stopCachesync()
			return nil, err
		}
		wasm, err := filepath.Abs(t.Wasm)
		if err == nil {
			err = errors.Join(cfg.UseFreePorts(), cfg.SetEndpoints("engines", p.addrs()), cfg.SetEndpoints("cachesync", []string{addr}), p.tune(cfg),
				cfg.SetWasmCode("kvroute", wasm), cfg.AddAccessLog(filepath.Join(dir, DecisionLog), decisionLogFormat))
		}
		var pc map[string]any
		if err == nil {
			pc, err = cfg.PluginConfiguration("kvroute")
		}
		if err == nil {
			pc["endpoints"] = p.addrs()
			pc["cachesync"] = map[string]any{"cluster": "cachesync", "report_token": reportToken}
			pc["debug_header"] = true // for the decision log
			if policy != nil {
				pc["policy"] = policy
			}
			err = cfg.SetPluginConfiguration("kvroute", pc)
		}
		if err != nil {
			stopCachesync()
			return nil, err
		}
		command := append([]string{"envoy", "-c", "envoy.yaml", "--concurrency", "2", "+", "cachesync"}, args...)
		if policy != nil {
			command = append(command, "+ plugin policy", fmt.Sprint(policy))
		}
		r, err := startEnvoy(ctx, cfg, dir, command)
		if err != nil {
			stopCachesync()
			return nil, err
		}
		stopEnvoy := r.stop
		r.stop = func() { stopEnvoy(); stopCachesync() }
		r.cachesync = "http://" + addr
		return r, nil
	}
}

// startCachesync runs cachesync with args on a free port: the binary, or
// the daemon in this process when Tools.Cachesync is empty.
func startCachesync(ctx context.Context, t *Tools, args []string, dir string) (string, func(), error) {
	port, err := freePort()
	if err != nil {
		return "", nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	args = append([]string{"-listen", addr}, args...)
	var stop func()
	if t.Cachesync != "" {
		cmd := exec.CommandContext(ctx, t.Cachesync, args...)
		logf, err := os.Create(filepath.Join(dir, "cachesync.log"))
		if err != nil {
			return "", nil, err
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			logf.Close()
			return "", nil, fmt.Errorf("bench: start cachesync: %w", err)
		}
		stop = func() { terminate(cmd); logf.Close() }
	} else {
		cfg, err := daemon.ParseFlags(args, func(string) string { return "" })
		if err != nil {
			return "", nil, err
		}
		d, err := daemon.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			return "", nil, err
		}
		dctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- d.Run(dctx) }()
		stop = func() { cancel(); <-done }
	}
	if err := waitReady(ctx, "http://"+addr+"/readyz", 30*time.Second); err != nil {
		stop()
		return "", nil, fmt.Errorf("bench: cachesync: %w", err)
	}
	return addr, stop, nil
}

// kvrouteSLOArm is kvroute precise told the workload's goodput SLO.
func kvrouteSLOArm(ctx context.Context, t *Tools, p *pool, dir string) (*router, error) {
	ttft, tpot := t.GoodputSLO["ttft"], t.GoodputSLO["tpot"]
	if ttft <= 0 && tpot <= 0 {
		return nil, errors.New("bench: kvroute-slo: the workload states no goodput SLO")
	}
	policy := map[string]any{}
	if ttft > 0 {
		policy["slo_ttft_ms"] = int(ttft * 1000)
	}
	if tpot > 0 {
		policy["slo_tpot_ms"] = int(tpot * 1000)
	}
	return kvrouteArm(true, policy)(ctx, t, p, dir)
}

// rivalArm runs a rival router from its virtualenv.
func rivalArm(family, sub string, flags ...string) func(context.Context, *Tools, *pool, string) (*router, error) {
	return func(ctx context.Context, t *Tools, p *pool, dir string) (*router, error) {
		var args []string
		if sub != "" {
			args = append(args, sub)
		}
		return startRival(ctx, t, family, p, dir, append(args, flags...))
	}
}

// vllmRouterKVArm is vllm-router's kv_aware policy, subscribed to every
// engine's KV events and replay socket.
func vllmRouterKVArm(ctx context.Context, t *Tools, p *pool, dir string) (*router, error) {
	engines, err := p.simulated("KV events")
	if err != nil {
		return nil, err
	}
	args := []string{"--policy", "kv_aware", "--kv-event-block-size", "16", "--kv-event-model", Model}
	for _, e := range engines {
		args = append(args, "--kv-event-source", e.URL()+"="+e.EventsEndpoint(), "--kv-event-replay-source", e.URL()+"="+e.ReplayEndpoint())
	}
	return startRival(ctx, t, "vllm-router", p, dir, args)
}

func startRival(ctx context.Context, t *Tools, family string, p *pool, dir string, args []string) (*router, error) {
	bin := t.Routers[family]
	if bin == "" {
		return nil, fmt.Errorf("bench: no %s installed (make bench-setup)", family)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	metrics, err := freePort()
	if err != nil {
		return nil, err
	}
	args = append(args, "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--prometheus-host", "127.0.0.1", "--prometheus-port", strconv.Itoa(metrics), "--worker-urls")
	args = append(args, p.urls()...)
	cmd := exec.CommandContext(ctx, bin, args...)
	logf, err := os.Create(filepath.Join(dir, family+".log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "RUST_LOG=warn")
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("bench: start %s: %w", family, err)
	}
	stop := func() { terminate(cmd); logf.Close() }
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	if err := waitReady(ctx, url+"/v1/models", 60*time.Second); err != nil {
		stop()
		return nil, fmt.Errorf("bench: %s did not come up (log in %s): %w", family, logf.Name(), err)
	}
	return &router{url: url, command: append([]string{filepath.Base(bin)}, args...), stop: stop}, nil
}

// terminate stops a child process: SIGTERM, then SIGKILL after 10 s.
func terminate(cmd *exec.Cmd) {
	if cmd.Process == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

func waitReady(ctx context.Context, url string, within time.Duration) error {
	deadline := time.Now().Add(within)
	client := http.Client{Timeout: 2 * time.Second}
	for {
		resp, err := client.Get(url)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v: %w", url, within, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
