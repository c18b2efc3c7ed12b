package calibrate

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Probe defaults.
const (
	// DefaultBatchedTokens is vLLM's --max-num-batched-tokens in the
	// deployments llm-d calibrates (B).
	DefaultBatchedTokens = 8192
	// DefaultRuns is how many timed prefills a probe takes the median of.
	DefaultRuns = 5
	// DefaultProbeTimeout bounds one request.
	DefaultProbeTimeout = 2 * time.Minute
)

// Probe measures an engine's peak prefill rate directly, as llm-d's
// calibration recipe does: it sends prompts of B uncached tokens (B = the
// engine's max-num-batched-tokens, so that one engine step prefills a
// whole prompt) with max_tokens=1, streaming, one at a time, times each to
// its first token, and takes R_peak = tokens / TTFT, the median over the
// runs. Prompts are random words, so nothing hits a prefix cache; where
// the engine has /tokenize (vLLM) they go as token ids, cut to B, so the
// timing leaves out tokenizing; the token count is the one the engine
// reports in usage.
//
// Run it against an idle engine: other traffic would queue the probes.
type Probe struct {
	// URL is the engine's base URL, e.g. http://10.0.0.1:8000.
	URL string
	// Model names the model to prompt; "" means the first base model
	// /v1/models lists.
	Model string
	// Tokens is B; 0 means DefaultBatchedTokens.
	Tokens int
	// Runs is the number of timed prefills; 0 means DefaultRuns. One
	// warm-up request, half as long and not counted, comes first.
	Runs int
	// Timeout bounds each request; 0 means DefaultProbeTimeout.
	Timeout time.Duration
	// Client sends the requests; nil means a client of its own.
	Client *http.Client
	// Now reads the clock; nil means time.Now. Tests pass a simulated
	// engine's clock.
	Now    func() time.Time
	Logger *slog.Logger // nil means slog.Default()
}

// Run is one timed prefill.
type Run struct {
	PromptTokens int           `json:"prompt_tokens"`
	TTFT         time.Duration `json:"ttft_ns"`
	Rate         float64       `json:"tokens_per_second"`
}

// Result is what a probe measured.
type Result struct {
	URL   string `json:"url"`
	Model string `json:"model"`
	// Tokens is the median prompt length of the runs.
	Tokens int `json:"prompt_tokens"`
	// TTFT is the median time to first token.
	TTFT time.Duration `json:"ttft_ns"`
	// Rate is R_peak, the median of the runs' rates, in tokens per second.
	Rate float64 `json:"tokens_per_second"`
	Runs []Run   `json:"runs"`
}

// Measure runs the probe.
func (p *Probe) Measure(ctx context.Context) (Result, error) {
	cfg := *p
	if cfg.Tokens == 0 {
		cfg.Tokens = DefaultBatchedTokens
	}
	if cfg.Runs == 0 {
		cfg.Runs = DefaultRuns
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultProbeTimeout
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.URL = strings.TrimSuffix(cfg.URL, "/")
	switch {
	case !strings.HasPrefix(cfg.URL, "http://") && !strings.HasPrefix(cfg.URL, "https://"):
		return Result{}, fmt.Errorf("calibrate: engine URL %q: want http://host:port", p.URL)
	case cfg.Tokens < 16 || cfg.Runs < 1 || cfg.Timeout < 0:
		return Result{}, fmt.Errorf("calibrate: tokens %d (at least 16), runs %d (at least 1), timeout %v: out of range",
			cfg.Tokens, cfg.Runs, cfg.Timeout)
	}
	return cfg.measure(ctx)
}

func (p *Probe) measure(ctx context.Context) (Result, error) {
	log := p.Logger.With("engine", p.URL)
	if p.Model == "" {
		m, err := p.baseModel(ctx)
		if err != nil {
			return Result{}, err
		}
		p.Model = m
	}
	log = log.With("model", p.Model)

	pr := prompter{p: p, log: log, tokenize: true, perWord: 1}
	warm, err := pr.run(ctx, p.Tokens/2)
	if err != nil {
		return Result{}, fmt.Errorf("calibrate: warm-up request: %w", err)
	}
	log.Info("warmed up", "prompt_tokens", warm.PromptTokens, "ttft", warm.TTFT)

	res := Result{URL: p.URL, Model: p.Model}
	for i := range p.Runs {
		r, err := pr.run(ctx, p.Tokens)
		if err != nil {
			return Result{}, fmt.Errorf("calibrate: run %d: %w", i+1, err)
		}
		log.Info("run", "n", i+1, "prompt_tokens", r.PromptTokens, "ttft", r.TTFT, "tokens_per_second", math.Round(r.Rate))
		res.Runs = append(res.Runs, r)
	}
	res.Tokens = int(median(res.Runs, func(r Run) float64 { return float64(r.PromptTokens) }))
	res.TTFT = time.Duration(median(res.Runs, func(r Run) float64 { return float64(r.TTFT) }))
	res.Rate = median(res.Runs, func(r Run) float64 { return r.Rate })
	return res, nil
}

func median(runs []Run, f func(Run) float64) float64 {
	vs := make([]float64, len(runs))
	for i, r := range runs {
		vs[i] = f(r)
	}
	slices.Sort(vs)
	n := len(vs)
	if n%2 == 1 {
		return vs[n/2]
	}
	return (vs[n/2-1] + vs[n/2]) / 2
}

// maxResponse bounds what the probe reads of any response.
const maxResponse = 4 << 20

// baseModel returns the first model /v1/models lists that is not a LoRA
// adapter.
func (p *Probe) baseModel(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/v1/models", nil)
	if err != nil {
		return "", fmt.Errorf("calibrate: %w", err)
	}
	resp, err := p.Client.Do(req)
	if err != nil {
		return "", fmt.Errorf("calibrate: listing models: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return "", fmt.Errorf("calibrate: listing models: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("calibrate: listing models: %s: %s", resp.Status, bytes.TrimSpace(body))
	}
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return "", fmt.Errorf("calibrate: listing models: %w", err)
	}
	for _, m := range list.Data {
		if m.ID != "" && (m.Parent == nil || *m.Parent == "") {
			return m.ID, nil
		}
	}
	return "", errors.New("calibrate: the engine lists no model")
}

// prompter makes the prompts of a probe. Where the engine has vLLM's
// /tokenize, it tokenizes random text beforehand and sends exactly the
// tokens wanted, so the time to first token is the engine's prefill and
// not its tokenizer's work; elsewhere it sends text of about the tokens
// wanted.
type prompter struct {
	p        *Probe
	log      *slog.Logger
	tokenize bool    // the engine has /tokenize, as far as is known
	perWord  float64 // tokens per word of random text, as last seen
}

// run times one prefill of about tokens uncached tokens.
func (pr *prompter) run(ctx context.Context, tokens int) (Run, error) {
	if pr.tokenize {
		// Ten per cent more words than needed; the tokens are cut to size.
		words := int(1.1*float64(tokens)/pr.perWord) + 1
		ids, err := pr.p.tokenize(ctx, randomText(words))
		switch {
		case err == nil && len(ids) > 0:
			pr.perWord = float64(len(ids)) / float64(words)
			return pr.p.prefill(ctx, ids[:min(tokens, len(ids))])
		case ctx.Err() != nil:
			return Run{}, ctx.Err()
		}
		pr.log.Info("no /tokenize; sending text, so runs include the engine's tokenizing", "err", err)
		pr.tokenize = false
	}
	// Aim a little under: a prompt one token over takes two steps.
	words := max(1, int(0.99*float64(tokens)/pr.perWord))
	r, err := pr.p.prefill(ctx, randomText(words))
	if err == nil {
		pr.perWord = float64(r.PromptTokens) / float64(words)
	}
	return r, err
}

// tokenize asks the engine's /tokenize for the token ids of text.
func (p *Probe) tokenize(ctx context.Context, text string) ([]int, error) {
	body, err := json.Marshal(map[string]any{"model": p.Model, "prompt": text, "add_special_tokens": false})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+"/tokenize", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("POST /tokenize: %s", resp.Status)
	}
	var out struct {
		Tokens []int `json:"tokens"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("POST /tokenize: %w", err)
	}
	return out.Tokens, nil
}

// prefill sends one prompt, text or token ids, and times its first token.
func (p *Probe) prefill(ctx context.Context, prompt any) (Run, error) {
	body, err := json.Marshal(map[string]any{
		"model":          p.Model,
		"prompt":         prompt,
		"max_tokens":     1,
		"temperature":    0,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
	})
	if err != nil {
		return Run{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return Run{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := p.Now()
	resp, err := p.Client.Do(req)
	if err != nil {
		return Run{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return Run{}, fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	var ttft time.Duration
	var usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, maxResponse))
	sc.Buffer(nil, maxResponse)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			break
		}
		var chunk struct {
			Choices []json.RawMessage `json:"choices"`
			Usage   json.RawMessage   `json:"usage"`
			Error   json.RawMessage   `json:"error"`
		}
		if err := json.Unmarshal(data, &chunk); err != nil {
			return Run{}, fmt.Errorf("stream chunk %.100q: %w", data, err)
		}
		if len(chunk.Error) > 0 {
			return Run{}, fmt.Errorf("engine error in stream: %s", chunk.Error)
		}
		if ttft == 0 && len(chunk.Choices) > 0 {
			ttft = p.Now().Sub(start)
		}
		if len(chunk.Usage) > 0 && string(chunk.Usage) != "null" {
			if err := json.Unmarshal(chunk.Usage, &usage); err != nil {
				return Run{}, fmt.Errorf("usage %.100q: %w", chunk.Usage, err)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return Run{}, fmt.Errorf("reading the stream: %w", err)
	}
	switch {
	case ttft <= 0:
		return Run{}, errors.New("the stream carried no token")
	case usage == nil || usage.PromptTokens < 1:
		return Run{}, errors.New("the stream reported no usage.prompt_tokens (does the engine honour stream_options.include_usage?)")
	}
	if d := usage.PromptTokensDetails; d != nil && d.CachedTokens > 0 {
		p.Logger.Warn("prompt partly served from the prefix cache; the run overstates the rate", "cached_tokens", d.CachedTokens)
	}
	return Run{PromptTokens: usage.PromptTokens, TTFT: ttft, Rate: float64(usage.PromptTokens) / ttft.Seconds()}, nil
}

// randomText returns n words drawn at random, after a random tag, so that
// no two prompts share a first block and nothing hits a prefix cache.
func randomText(n int) string {
	var tag [8]byte
	rand.Read(tag[:])
	var b strings.Builder
	b.WriteString(hex.EncodeToString(tag[:]))
	for range n - 1 {
		b.WriteByte(' ')
		b.WriteString(vocabulary[mrand.IntN(len(vocabulary))])
	}
	return b.String()
}

// vocabulary is common English words: each one or two tokens in every
// BPE vocabulary, so word counts convert to token counts steadily.
var vocabulary = strings.Fields(`
the of and to in is was for that on with as by at from his her they this have not are but had one
were which been their said all there when who more will would time about some what can out other into
only new then after first also two them over like these people than may most well years back could
made just before where any because through between under around while place water again house every
world state family school country another number night point city might light large small great
morning letter river music garden window market paper doctor summer winter story answer
common ground animal mountain island forest engine signal cable memory planet silver orange yellow
purple simple gentle sudden narrow heavy quiet early later always never often seldom nearly almost
follow carry listen travel gather wonder finish measure balance borrow harvest promise describe`)
