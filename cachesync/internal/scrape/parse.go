package scrape

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/cachesync/internal/calibrate"
)

// Kind is the engine software behind a target, told by its metric names.
type Kind uint8

// The engine kinds.
const (
	KindUnknown Kind = iota
	KindVLLM
	KindSGLang
	// KindLlamaCpp is llama.cpp's llama-server, started with --metrics.
	KindLlamaCpp
)

// String returns the kind as a label value: vllm, sglang, llamacpp or
// unknown.
func (k Kind) String() string {
	switch k {
	case KindVLLM:
		return "vllm"
	case KindSGLang:
		return "sglang"
	case KindLlamaCpp:
		return "llamacpp"
	}
	return "unknown"
}

// Metrics is what one /metrics page says about an engine. Figures are
// totals over the engine's cores (vLLM's engine label, SGLang's dp_rank):
// series that differ only in other labels (tensor- or pipeline-parallel
// ranks) repeat one core's figure, so the largest of them is taken.
type Metrics struct {
	Kind Kind
	// Cores is the number of engine cores (data-parallel ranks) reporting.
	Cores            int
	Running, Waiting int
	// KVCacheUsage is the fraction of KV-cache blocks in use, the mean over
	// cores.
	KVCacheUsage float64
	// BlockSize is the tokens per KV block (vLLM block_size, SGLang
	// page_size); NumBlocks the GPU blocks and KVCapacity the tokens the
	// KV cache holds, over all cores. 0 when the engine does not say.
	BlockSize, NumBlocks, KVCapacity int

	// Counters since the engine started, for calibration.
	PromptTokens   float64 // prompt tokens whose prefill finished
	CachedTokens   float64 // of them, served from a prefix cache or KV connector
	Requests       float64 // requests past their first token
	PrefillSeconds float64 // Σ per-request prefill time (vLLM only)
	PrefillCount   float64
	// PrefillTime is the time the engine spent prefilling, as it times
	// itself (llama.cpp only).
	PrefillTime float64
	// ITLSeconds over ITLCount is the mean inter-token latency, for the
	// latency model's decode fit.
	ITLSeconds, ITLCount float64
}

// Observation turns m into a calibration input taken at t.
func (m *Metrics) Observation(t time.Time) calibrate.Observation {
	return calibrate.Observation{
		Time: t, PromptTokens: m.PromptTokens, CachedTokens: m.CachedTokens, Requests: m.Requests,
		PrefillSeconds: m.PrefillSeconds, PrefillCount: m.PrefillCount, PrefillTime: m.PrefillTime, Waiting: float64(m.Waiting),
	}
}

// Parse reads a Prometheus text-format page from a vLLM, SGLang or
// llama.cpp engine. It fails on a page that does not parse or carries none
// of their load metrics.
func Parse(text []byte) (Metrics, error) { return parse(filter(text)) }

// parse is Parse without the filter.
func parse(text []byte) (Metrics, error) {
	// Metric names with ':' are valid in either scheme; UTF-8 also admits
	// the quoted names of newer exporters.
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return Metrics{}, fmt.Errorf("metrics do not parse: %w", err)
	}
	pg := page(fams)
	var m Metrics
	switch {
	case pg.has("vllm:num_requests_running"):
		m.Kind = KindVLLM
		pg.vllm(&m)
	case pg.has("sglang:num_running_reqs"):
		m.Kind = KindSGLang
		pg.sglang(&m)
	case pg.has("llamacpp:requests_processing"):
		m.Kind = KindLlamaCpp
		pg.llamacpp(&m)
	default:
		return Metrics{}, errors.New("no vLLM, SGLang or llama.cpp load metrics on the page")
	}
	return m, nil
}

// families are the metric families Parse reads, counters under both
// their names.
var families = map[string]bool{}

func init() {
	for _, name := range []string{
		"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
		"vllm:cache_config_info", "vllm:time_to_first_token_seconds", "vllm:request_prefill_time_seconds",
		"vllm:inter_token_latency_seconds",
		"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:max_total_num_tokens",
		"sglang:cache_config_info", "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
		"llamacpp:requests_processing", "llamacpp:requests_deferred",
	} {
		families[name] = true
	}
	for _, name := range []string{
		"vllm:prompt_tokens", "vllm:prompt_tokens_cached", "vllm:prefix_cache_hits", "vllm:external_prefix_cache_hits",
		"sglang:realtime_tokens", "sglang:prompt_tokens", "sglang:cached_tokens",
		"llamacpp:prompt_tokens", "llamacpp:prompt_tokens_cached", "llamacpp:prompt_seconds",
		"llamacpp:tokens_predicted", "llamacpp:tokens_predicted_seconds",
	} {
		families[name], families[name+"_total"] = true, true
	}
}

// filter returns the lines of page that Parse reads: the samples (but not
// the histogram buckets) and comments of families. Parsing is most of a
// scrape's cost, and an engine's page is mostly histogram buckets and
// families routing does not need.
func filter(page []byte) []byte {
	out := make([]byte, 0, 4096)
	for len(page) > 0 {
		line := page
		if i := bytes.IndexByte(page, '\n'); i >= 0 {
			line, page = page[:i+1], page[i+1:]
		} else {
			page = nil
		}
		if keep(line) {
			out = append(out, line...)
		}
	}
	return out
}

func keep(line []byte) bool {
	if rest, ok := bytes.CutPrefix(line, []byte("#")); ok {
		// A HELP or TYPE line, however it is spaced: the text parser reads
		// "#TYPE x histogram" as a TYPE line too, and a family kept without
		// its type would read differently (found by make fuzz).
		f := bytes.Fields(rest)
		return len(f) >= 2 && families[string(f[1])]
	}
	end := bytes.IndexAny(line, "{ \t")
	if end <= 0 {
		return len(bytes.TrimSpace(line)) > 0 // a quoted name or a bare name: let the parser judge
	}
	name := string(line[:end])
	if families[name] {
		return true
	}
	for _, suffix := range []string{"_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && families[base] {
			return true
		}
	}
	// A bucket without its le is malformed; kept, so that the family reads
	// as the whole page makes it read (found by make fuzz). Well-formed
	// buckets, most of a page, are left out.
	if base, ok := strings.CutSuffix(name, "_bucket"); ok && families[base] {
		return !bytes.Contains(line, []byte("le="))
	}
	return false
}

type page map[string]*dto.MetricFamily

func (p page) has(name string) bool { return p[name] != nil }

func (p page) vllm(m *Metrics) {
	m.Cores = p.cores("vllm:num_requests_running")
	m.Running = count(p.sum("vllm:num_requests_running", nil))
	m.Waiting = count(p.sum("vllm:num_requests_waiting", nil))
	usage := "vllm:kv_cache_usage_perc"
	if !p.has(usage) {
		usage = "vllm:gpu_cache_usage_perc" // before vLLM 0.10
	}
	m.KVCacheUsage = fraction(p.mean(usage))
	p.cacheInfo(m, "vllm:cache_config_info", "block_size", "num_gpu_blocks", "kv_cache_size_tokens")

	m.PromptTokens = p.counter("vllm:prompt_tokens")
	if p.has("vllm:prompt_tokens_cached_total") || p.has("vllm:prompt_tokens_cached") {
		m.CachedTokens = p.counter("vllm:prompt_tokens_cached")
	} else {
		m.CachedTokens = p.counter("vllm:prefix_cache_hits") + p.counter("vllm:external_prefix_cache_hits")
	}
	_, m.Requests = p.histogram("vllm:time_to_first_token_seconds")
	m.PrefillSeconds, m.PrefillCount = p.histogram("vllm:request_prefill_time_seconds")
	m.ITLSeconds, m.ITLCount = p.histogram("vllm:inter_token_latency_seconds")
}

func (p page) sglang(m *Metrics) {
	m.Cores = p.cores("sglang:num_running_reqs")
	m.Running = count(p.sum("sglang:num_running_reqs", nil))
	m.Waiting = count(p.sum("sglang:num_queue_reqs", nil))
	m.KVCacheUsage = fraction(p.mean("sglang:token_usage"))
	p.cacheInfo(m, "sglang:cache_config_info", "page_size", "num_pages", "")
	if p.has("sglang:max_total_num_tokens") {
		m.KVCapacity = count(p.sum("sglang:max_total_num_tokens", nil))
	}

	// Tokens counted as each step runs, when the engine has them, are
	// steadier than prompts counted whole.
	if rt := "sglang:realtime_tokens_total"; p.has(rt) {
		compute := p.sum(rt, map[string]string{"mode": "prefill_compute"})
		m.CachedTokens = p.sum(rt, map[string]string{"mode": "prefill_cache"})
		m.PromptTokens = compute + m.CachedTokens
	} else {
		m.PromptTokens = p.counter("sglang:prompt_tokens")
		m.CachedTokens = p.counter("sglang:cached_tokens")
	}
	_, m.Requests = p.histogram("sglang:time_to_first_token_seconds")
	m.ITLSeconds, m.ITLCount = p.histogram("sglang:inter_token_latency_seconds")
}

// llamacpp reads llama-server's page. It counts prompt tokens without the
// cached ones, and times its prefills and its generated tokens itself;
// its cache size is in /props, not here (see fetchProps).
func (p page) llamacpp(m *Metrics) {
	m.Cores = 1
	m.Running = count(p.sum("llamacpp:requests_processing", nil))
	m.Waiting = count(p.sum("llamacpp:requests_deferred", nil))
	m.CachedTokens = p.counter("llamacpp:prompt_tokens_cached")
	m.PromptTokens = p.counter("llamacpp:prompt_tokens") + m.CachedTokens
	m.PrefillTime = p.counter("llamacpp:prompt_seconds")
	// Seconds spent generating over tokens generated: the mean time per
	// output token, which is what the decode fit reads from vLLM's
	// inter-token histogram.
	m.ITLSeconds = p.counter("llamacpp:tokens_predicted_seconds")
	m.ITLCount = p.counter("llamacpp:tokens_predicted")
}

// cacheInfo reads an info gauge's block size and block count labels per
// core, and the capacity in tokens if a label carries it.
func (p page) cacheInfo(m *Metrics, name, blockSize, numBlocks, capacity string) {
	f := p[name]
	if f == nil {
		return
	}
	type core struct{ bs, n, tokens int }
	cores := map[string]core{}
	for _, s := range f.Metric {
		c := core{bs: labelInt(s, blockSize), n: labelInt(s, numBlocks)}
		if capacity != "" {
			c.tokens = labelInt(s, capacity)
		}
		if c.tokens == 0 {
			c.tokens = c.bs * c.n
		}
		cores[coreOf(s)] = c
	}
	for _, c := range cores {
		if m.BlockSize == 0 {
			m.BlockSize = c.bs
		}
		m.NumBlocks += c.n
		m.KVCapacity += c.tokens
	}
}

// coreOf names the engine core a series belongs to.
func coreOf(s *dto.Metric) string {
	var engine, dp string
	for _, l := range s.Label {
		switch l.GetName() {
		case "engine":
			engine = l.GetValue()
		case "dp_rank":
			dp = l.GetValue()
		}
	}
	return engine + "/" + dp
}

// perCore returns a family's value per core, over the series whose labels
// match, the largest where several series share a core.
func (p page) perCore(name string, match map[string]string) map[string]float64 {
	f := p[name]
	if f == nil {
		return nil
	}
	out := map[string]float64{}
	for _, s := range f.Metric {
		if !matches(s, match) {
			continue
		}
		v := value(s)
		if !(v >= 0) || math.IsInf(v, 1) { // negative or NaN: ignore
			continue
		}
		c := coreOf(s)
		if old, ok := out[c]; !ok || v > old {
			out[c] = v
		}
	}
	return out
}

func (p page) cores(name string) int { return len(p.perCore(name, nil)) }

func (p page) sum(name string, match map[string]string) float64 {
	var t float64
	for _, v := range p.perCore(name, match) {
		t += v
	}
	return t
}

func (p page) mean(name string) float64 {
	vs := p.perCore(name, nil)
	if len(vs) == 0 {
		return 0
	}
	return p.sum(name, nil) / float64(len(vs))
}

// counter sums a counter named with or without the _total suffix.
func (p page) counter(base string) float64 {
	if p.has(base + "_total") {
		return p.sum(base+"_total", nil)
	}
	return p.sum(base, nil)
}

// histogram returns a histogram's sum and count over cores.
func (p page) histogram(name string) (sum, count float64) {
	f := p[name]
	if f == nil {
		return 0, 0
	}
	sums, counts := map[string]float64{}, map[string]float64{}
	for _, s := range f.Metric {
		h := s.GetHistogram()
		if h == nil {
			continue
		}
		c := coreOf(s)
		if n := float64(h.GetSampleCount()); n >= counts[c] {
			sums[c], counts[c] = h.GetSampleSum(), n
		}
	}
	for c := range counts {
		if v := sums[c]; v >= 0 && !math.IsInf(v, 1) {
			sum += v
			count += counts[c]
		}
	}
	return sum, count
}

func value(s *dto.Metric) float64 {
	switch {
	case s.Gauge != nil:
		return s.Gauge.GetValue()
	case s.Counter != nil:
		return s.Counter.GetValue()
	case s.Untyped != nil:
		return s.Untyped.GetValue()
	}
	return math.NaN()
}

func matches(s *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range s.Label {
		if v, ok := want[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

func labelInt(s *dto.Metric, name string) int {
	for _, l := range s.Label {
		if l.GetName() == name {
			n, err := strconv.Atoi(l.GetValue())
			if err != nil || n < 0 {
				return 0 // e.g. "None" before the engine sized its cache
			}
			return n
		}
	}
	return 0
}

// count rounds a gauge to a count that fits the snapshot's 32 bits.
func count(v float64) int { return int(min(math.Round(v), math.MaxUint32)) }

func fraction(v float64) float64 { return min(max(v, 0), 1) }

// maxModelNames bounds how many models and adapters an endpoint may list,
// as the snapshot does.
const maxModelNames = 255

// parseModels reads an OpenAI /v1/models list: base models, and LoRA
// adapters, which vLLM lists with "parent" naming their base model. Names
// the snapshot cannot carry (empty, over 255 bytes, past the 255th) are
// left out.
func parseModels(body []byte) (models, adapters []string, err error) {
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	d := json.NewDecoder(bytes.NewReader(body))
	if err := d.Decode(&list); err != nil {
		return nil, nil, fmt.Errorf("models list: %w", err)
	}
	seen := map[string]bool{}
	for _, m := range list.Data {
		if m.ID == "" || len(m.ID) > 255 || seen[m.ID] || len(models)+len(adapters) == maxModelNames {
			continue
		}
		seen[m.ID] = true
		if m.Parent != nil && *m.Parent != "" {
			adapters = append(adapters, m.ID)
		} else {
			models = append(models, m.ID)
		}
	}
	if len(models) == 0 {
		return nil, nil, errors.New("models list names no base model")
	}
	return models, adapters, nil
}

// props is what a llama-server's /props tells: its KV cache in tokens
// (its slots times the context each holds) and its BOS token's text.
type props struct {
	cacheTokens int
	bos         string
}

// parseProps reads a llama-server's /props.
func parseProps(body []byte) (props, error) {
	var pr struct {
		Slots    int `json:"total_slots"`
		Settings struct {
			Context int `json:"n_ctx"`
		} `json:"default_generation_settings"`
		BOS string `json:"bos_token"`
	}
	if err := json.Unmarshal(body, &pr); err != nil {
		return props{}, fmt.Errorf("props: %w", err)
	}
	if pr.Slots <= 0 || pr.Settings.Context <= 0 || pr.Slots > math.MaxInt32/pr.Settings.Context {
		return props{}, fmt.Errorf("props: %d slots of %d tokens is not a cache size", pr.Slots, pr.Settings.Context)
	}
	return props{cacheTokens: pr.Slots * pr.Settings.Context, bos: pr.BOS}, nil
}

// excerpt returns the start of an error answer's body, on one line.
func excerpt(body []byte) string {
	const n = 160
	s := strings.Join(strings.Fields(string(body)), " ")
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
