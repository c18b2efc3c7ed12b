package calibrate

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
)

// Command runs `cachesync calibrate` with its arguments (after the
// subcommand's name): it measures one engine with a Probe and prints the
// result for a person, then as one JSON line for scripts.
func Command(ctx context.Context, args []string, stdout io.Writer, log *slog.Logger) error {
	fs := flag.NewFlagSet("calibrate", flag.ContinueOnError)
	fs.SetOutput(stdout)
	p := Probe{Logger: log}
	fs.StringVar(&p.URL, "url", "", "engine base URL, e.g. http://10.0.0.1:8000 (required)")
	fs.StringVar(&p.Model, "model", "", "model to prompt (default: the first base model /v1/models lists)")
	fs.IntVar(&p.Tokens, "batched-tokens", DefaultBatchedTokens, "the engine's max-num-batched-tokens B: prompts are about this long")
	fs.IntVar(&p.Runs, "runs", DefaultRuns, "timed prefills to take the median of")
	fs.DurationVar(&p.Timeout, "timeout", DefaultProbeTimeout, "timeout of each request")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: cachesync calibrate -url http://HOST:PORT [flags]\n\n"+
			"Measures the engine's peak prefill rate R_peak = B / TTFT(B) from B-token uncached prompts.\n"+
			"Run it against an idle engine.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if p.URL == "" || fs.NArg() > 0 {
		fs.Usage()
		return errors.New("calibrate: -url is required and takes no arguments")
	}
	res, err := p.Measure(ctx)
	if err != nil {
		return err
	}
	return res.Print(stdout)
}

// Print writes the result for a person, then as one JSON line.
func (r Result) Print(w io.Writer) error {
	line, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "engine %s, model %s\n"+
		"%d runs of ~%d uncached prompt tokens: median time to first token %.3f s\n"+
		"peak prefill rate R_peak = %.0f tokens/s (cachesync -prefill-rate)\n%s\n",
		r.URL, r.Model, len(r.Runs), r.Tokens, r.TTFT.Seconds(), math.Round(r.Rate), line)
	return err
}
