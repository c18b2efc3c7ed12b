// Command bench runs kvroute's routing benchmark (package e2e/bench): the
// workloads through every arm, inference-perf as the client, results in a
// folder. Run it from the repository root with `make bench`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/e2e/bench"
	"github.com/kvroute/kvroute/e2e/envoy"
	"github.com/kvroute/kvroute/e2e/vllmsim"
)

// The binaries make builds; the bench refuses them when older than their
// sources.
const (
	defaultCachesync = "build/cachesync"
	defaultWasm      = "build/kvroute.wasm"
)

func main() {
	var (
		out          = flag.String("out", "results/bench", "results directory")
		workloads    = flag.String("workloads", "", "comma-separated workloads (default: all but the extended ones, mixed and the shared-fraction sweep; none: only -filter-cost)")
		arms         = flag.String("arms", "", "comma-separated arms for every workload (default: each workload's own; every arm on b2b-saas)")
		quick        = flag.Bool("quick", false, "a reduced ladder: b2b-saas with round robin, kvroute precise and sglang-router")
		rates        = flag.String("rates", "", "comma-separated Poisson rates replacing every selected workload's ladder")
		seed         = flag.Uint64("seed", 0, "seed of the prompts and arrival traces (default: the committed runs' 42)")
		stageSeconds = flag.Int("stage-seconds", 15, "seconds per Poisson stage")
		engines      = flag.Int("engines", 4, "simulated engines")
		accelerator  = flag.String("accelerator", bench.DefaultAccelerator, "the engines' cost model: a100 or h100 (Qwen3-32B, TP=2)")
		gpuBlocks    = flag.Int("gpu-blocks", 4096, "KV blocks of 16 tokens per engine")
		timeScale    = flag.Float64("time-scale", 1, "wall seconds per simulated second")
		maxLag       = flag.Float64("max-lag", 0.05, "largest simulated-clock lag an arm may show and count")
		venvs        = flag.String("venvs", "build/bench", "directory of the virtualenvs make bench-setup makes")
		render       = flag.Bool("render", false, "rewrite the report and plots in -out from its summary.json, running nothing")
		merge        = flag.String("merge", "", "with -render: comma-separated results directories whose arms replace the same arms in -out")
		tokenizer    = flag.String("tokenizer", "build/bench/tokenizer", "HuggingFace tokenizer directory (written if missing)")
		cachesync    = flag.String("cachesync", defaultCachesync, "cachesync binary (the default checked against its sources)")
		wasm         = flag.String("wasm", defaultWasm, "the filter module (the default checked against its sources)")
		floor        = flag.String("floor", "build/floor.wasm", "the floor module (e2e/bench/floor)")
		filterCost   = flag.Bool("filter-cost", false, "measure the filter's own cost in real Envoy first")
		costRounds   = flag.Int("filter-cost-rounds", 5, "interleaved rounds of the filter-cost measurement")
		costSizes    = flag.String("filter-cost-sizes", "2,16,128,512", "comma-separated request body sizes of the filter-cost measurement, KiB")
	)
	flag.Parse()
	if *render {
		if err := bench.Render(*out, split(*merge)...); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		fmt.Printf("report: %s\n", filepath.Join(*out, "README.md"))
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o, err := options(*out, *workloads, *arms, *quick, *venvs, *tokenizer, *cachesync, *wasm)
	var sizes []int
	if err == nil && *filterCost {
		sizes, err = kibs(*costSizes)
	}
	if err == nil && len(o.Workloads) == 0 && !*filterCost {
		err = errors.New("-workloads none measures nothing without -filter-cost")
	}
	if err == nil && *rates != "" {
		err = setRates(o.Workloads, *rates)
	}
	if *seed != 0 {
		for i, w := range o.Workloads {
			c := *w
			c.Seed = *seed
			o.Workloads[i] = &c
		}
	}
	if err == nil {
		o.StageSeconds = *stageSeconds
		o.Engines = bench.EngineConfig{Count: *engines, GPUBlocks: *gpuBlocks, TimeScale: *timeScale, Accelerator: *accelerator}
		o.MaxLag = *maxLag
		o.Command = "go run ./e2e/cmd/bench " + strings.Join(os.Args[1:], " ")
		o.Log = os.Stdout
		o.Versions = versions(ctx, o)
		if *filterCost {
			o.FilterCost = &bench.FilterCostOptions{EnvoyYAML: "envoy.yaml", Wasm: *wasm, Floor: *floor,
				Sizes: sizes, Rounds: *costRounds, PerRound: 400,
				Concurrency: 8, RPSDuration: 3 * time.Second, Dir: filepath.Join(*out, "runs", "filter-cost")}
		}
		_, err = bench.Run(ctx, o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	fmt.Printf("report: %s\n", filepath.Join(*out, "README.md"))
}

func options(out, workloads, arms string, quick bool, venvs, tokenizer, cachesync, wasm string) (bench.Options, error) {
	o := bench.Options{Out: out, Arms: map[string][]*bench.Arm{}}
	names := split(workloads)
	if quick && names != nil && !slices.Equal(names, []string{"b2b-saas"}) {
		// Running b2b-saas in its stead would file its figures under the
		// name of the workload asked for.
		return o, errors.New("-quick runs b2b-saas's reduced ladder only: leave out -workloads " + workloads)
	}
	if _, err := os.Stat("envoy.yaml"); err != nil {
		return o, errors.New("run from the repository root (make bench)")
	}
	if workloads == "none" {
		// The filter's cost alone needs Envoy and the modules, not the
		// benchmark client or the rival routers.
		o.Tools = bench.Tools{EnvoyYAML: "envoy.yaml", Wasm: wasm}
		return o, nil
	}
	if quick {
		names = []string{"b2b-saas"}
		if arms == "" {
			arms = "envoy-round-robin,kvroute-precise,sglang-router"
		}
	}
	if len(names) == 0 {
		for _, w := range bench.Workloads {
			if !w.Extended {
				names = append(names, w.Name)
			}
		}
	}
	for _, n := range names {
		w, err := bench.WorkloadByName(n)
		if err != nil {
			return o, err
		}
		if quick {
			q := *w
			q.Rates = []float64{8, 24, 40, 48, 56, 64} // light load, and around the knees of the good arms
			w = &q
		}
		o.Workloads = append(o.Workloads, w)
		sel := split(arms)
		switch {
		case sel != nil:
		case w.Arms != nil:
			sel = w.Arms
		default:
			for _, a := range bench.Arms {
				if !a.Variant {
					sel = append(sel, a.Name)
				}
			}
		}
		for _, a := range sel {
			arm, err := bench.ArmByName(a)
			if err != nil {
				return o, err
			}
			o.Arms[n] = append(o.Arms[n], arm)
		}
	}
	o.Client = bench.InferencePerf{Bin: filepath.Join(venvs, "venv-inference-perf", "bin", "inference-perf"), Tokenizer: tokenizer}
	if _, err := os.Stat(o.Client.Bin); err != nil {
		return o, fmt.Errorf("inference-perf is not installed at %s: run make bench-setup", o.Client.Bin)
	}
	if _, err := os.Stat(filepath.Join(tokenizer, "tokenizer.json")); err != nil {
		if err := vllmsim.WriteHFTokenizer(tokenizer); err != nil {
			return o, err
		}
	}
	if cachesync == defaultCachesync {
		if err := notStale(cachesync, "cachesync", "shared"); err != nil {
			return o, err
		}
	}
	if wasm == defaultWasm {
		if err := notStale(wasm, "filter", "shared"); err != nil {
			return o, err
		}
	}
	o.Tools = bench.Tools{EnvoyYAML: "envoy.yaml", Wasm: wasm, Cachesync: cachesync, Routers: map[string]string{}}
	for _, r := range []string{"smg", "sglang-router", "vllm-router"} {
		bin := filepath.Join(venvs, "venv-"+r, "bin", r)
		if _, err := os.Stat(bin); err == nil {
			o.Tools.Routers[r] = bin
		}
	}
	return o, nil
}

func setRates(ws []*bench.Workload, list string) error {
	var rates []float64
	for _, f := range split(list) {
		r, err := strconv.ParseFloat(f, 64)
		if err != nil || r <= 0 {
			return fmt.Errorf("-rates: %q is not a rate", f)
		}
		rates = append(rates, r)
	}
	for i, w := range ws {
		if w.Concurrency != nil {
			return fmt.Errorf("-rates: %s is a concurrency ladder", w.Name)
		}
		c := *w
		c.Rates = rates
		ws[i] = &c
	}
	return nil
}

// kibs parses a comma-separated list of sizes in KiB into bytes.
func kibs(list string) ([]int, error) {
	var sizes []int
	for _, f := range split(list) {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 || n > 64<<10 {
			return nil, fmt.Errorf("-filter-cost-sizes: %q is not a size in KiB (1 to 65536)", f)
		}
		sizes = append(sizes, n<<10)
	}
	if len(sizes) == 0 {
		return nil, errors.New("-filter-cost-sizes: no size")
	}
	return sizes, nil
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// versions names what the run used.
func versions(ctx context.Context, o bench.Options) map[string]string {
	v := map[string]string{"go": runtime.Version()}
	if o.Client.Bin != "" {
		v["inference-perf"] = o.Client.Version()
	}
	if p, err := envoy.Path(ctx); err == nil {
		if ver, err := envoy.Version(ctx, p); err == nil {
			v["envoy"] = ver
		}
	}
	for name, bin := range o.Tools.Routers {
		py := filepath.Join(filepath.Dir(bin), "python")
		if out, err := exec.Command(py, "-c", "import importlib.metadata as m; print(m.version('"+name+"'))").Output(); err == nil {
			v[name] = strings.TrimSpace(string(out))
		}
	}
	return v
}
