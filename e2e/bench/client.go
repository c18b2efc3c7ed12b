package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"

	"sigs.k8s.io/yaml"
)

// InferencePerf runs inference-perf, the benchmark client llm-d publishes
// its results with, from its virtualenv.
type InferencePerf struct {
	Bin       string // the venv's inference-perf script
	Tokenizer string // a local HuggingFace tokenizer directory
}

// stageEvent is a run's stage starting or ending, as inference-perf logs
// it.
type stageEvent struct {
	start bool
}

var stageLine = regexp.MustCompile(`Stage (\d+) - run (started|completed)`)

// run runs stage i of the workload (-1: its warm-up) against baseURL,
// writing inference-perf's reports and log under dir, and calls onStage
// (from another goroutine) as the stage starts and completes.
func (c *InferencePerf) run(ctx context.Context, w *Workload, model, baseURL, dir string, i, stageSeconds int, onStage func(stageEvent)) ([]byte, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	trace := filepath.Join(dir, "arrivals.csv")
	if w.replayed(i) {
		if err := os.WriteFile(trace, w.arrivals(i, stageSeconds), 0o644); err != nil {
			return nil, err
		}
	}
	cfg := w.config(model, baseURL, c.Tokenizer, filepath.Join(dir, "reports"), trace, i, stageSeconds)
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "inference-perf.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "inference-perf.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, c.Bin, "-c", path)
	cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "TOKENIZERS_PARALLELISM=false")
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logf, line)
			if m := stageLine.FindStringSubmatch(line); m != nil {
				onStage(stageEvent{start: m[2] == "started"})
			}
		}
		io.Copy(io.Discard, pr)
	}()
	err = cmd.Run()
	pw.Close()
	wg.Wait()
	if err != nil {
		return b, fmt.Errorf("bench: inference-perf: %w (log in %s)", err, logf.Name())
	}
	return b, nil
}

// stageReport is what the bench reads of inference-perf's
// stage_N_lifecycle_metrics.json.
type stageReport struct {
	Load struct {
		Count         int     `json:"count"`
		RequestedRate float64 `json:"requested_rate"`
		AchievedRate  float64 `json:"achieved_rate"`
		ScheduleDelay dist    `json:"schedule_delay"`
	} `json:"load_summary"`
	Successes struct {
		Count   int `json:"count"`
		Latency struct {
			RequestLatency    dist `json:"request_latency"`
			TimeToFirstToken  dist `json:"time_to_first_token"`
			InterTokenLatency dist `json:"inter_token_latency"`
			TimePerOutput     dist `json:"time_per_output_token"`
		} `json:"latency"`
		Throughput struct {
			Input    float64 `json:"input_tokens_per_sec"`
			Output   float64 `json:"output_tokens_per_sec"`
			Requests float64 `json:"requests_per_sec"`
		} `json:"throughput"`
		PromptTokens struct {
			Total  float64 `json:"total"`
			Cached float64 `json:"cached"`
		} `json:"prompt_tokens"`
		Goodput *struct {
			Percentage float64 `json:"goodput_percentage"`
			Requests   float64 `json:"request_goodput"`
		} `json:"goodput_metrics"`
	} `json:"successes"`
	Failures struct {
		Count int `json:"count"`
	} `json:"failures"`
}

type dist struct {
	Mean   float64 `json:"mean,omitempty"`
	Median float64 `json:"median"`
	P90    float64 `json:"p90"`
	P99    float64 `json:"p99"`
}

// readStage reads the report of the run in dir.
func readStage(dir string) (*stageReport, error) {
	b, err := os.ReadFile(filepath.Join(dir, "reports", "stage_0_lifecycle_metrics.json"))
	if err != nil {
		return nil, fmt.Errorf("bench: inference-perf wrote no report in %s: %w", dir, err)
	}
	var r stageReport
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("bench: report in %s: %w", dir, err)
	}
	return &r, nil
}

// Version returns the installed inference-perf's version.
func (c *InferencePerf) Version() string {
	py := filepath.Join(filepath.Dir(c.Bin), "python")
	out, err := exec.Command(py, "-c", "import importlib.metadata as m; print(m.version('inference-perf'))").Output()
	if err != nil {
		return "unknown"
	}
	return string(trimNL(out))
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
