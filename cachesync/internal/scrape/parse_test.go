package scrape

import (
	"errors"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
)

// vllmTwoEngines is a page from vLLM with two engine cores (data
// parallel), as prometheus_client writes it: counters with _total and
// _created series, histograms with buckets.
const vllmTwoEngines = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-32B"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-32B"} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-32B"} 1.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-32B"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-32B"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-32B"} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-32B"} 50000.0
vllm:prefix_cache_queries_total{engine="1",model_name="Qwen/Qwen3-32B"} 30000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-32B"} 20000.0
vllm:prefix_cache_hits_total{engine="1",model_name="Qwen/Qwen3-32B"} 10000.0
# HELP vllm:prefix_cache_hits_created Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_created gauge
vllm:prefix_cache_hits_created{engine="0",model_name="Qwen/Qwen3-32B"} 1.7e+09
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-32B"} 48000.0
vllm:prompt_tokens_total{engine="1",model_name="Qwen/Qwen3-32B"} 29000.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="Qwen/Qwen3-32B"} 5.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-32B"} 10.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-32B"} 10.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-32B"} 6.5
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.5",model_name="Qwen/Qwen3-32B"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="Qwen/Qwen3-32B"} 7.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="Qwen/Qwen3-32B"} 7.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="Qwen/Qwen3-32B"} 4.0
# HELP vllm:request_prefill_time_seconds Histogram of time spent in PREFILL phase for request.
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{engine="0",le="0.3",model_name="Qwen/Qwen3-32B"} 4.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-32B"} 9.0
vllm:request_prefill_time_seconds_count{engine="0",model_name="Qwen/Qwen3-32B"} 9.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="Qwen/Qwen3-32B"} 3.25
vllm:request_prefill_time_seconds_bucket{engine="1",le="0.3",model_name="Qwen/Qwen3-32B"} 6.0
vllm:request_prefill_time_seconds_bucket{engine="1",le="+Inf",model_name="Qwen/Qwen3-32B"} 6.0
vllm:request_prefill_time_seconds_count{engine="1",model_name="Qwen/Qwen3-32B"} 6.0
vllm:request_prefill_time_seconds_sum{engine="1",model_name="Qwen/Qwen3-32B"} 1.5
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="24978",prefix_caching_hash_algo="sha256"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="1",gpu_memory_utilization="0.9",num_gpu_blocks="24978",prefix_caching_hash_algo="sha256"} 1.0
`

// sglangTP2 is a page from SGLang with two tensor-parallel ranks that both
// report the same scheduler's figures.
const sglangTP2 = `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="meta-llama/Llama-3.1-8B-Instruct",pp_rank="0",tp_rank="0"} 5.0
sglang:num_running_reqs{engine_type="unified",model_name="meta-llama/Llama-3.1-8B-Instruct",pp_rank="0",tp_rank="1"} 5.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="meta-llama/Llama-3.1-8B-Instruct",pp_rank="0",tp_rank="0"} 2.0
sglang:num_queue_reqs{engine_type="unified",model_name="meta-llama/Llama-3.1-8B-Instruct",pp_rank="0",tp_rank="1"} 2.0
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="meta-llama/Llama-3.1-8B-Instruct",pp_rank="0",tp_rank="0"} 0.42
sglang:token_usage{engine_type="unified",model_name="meta-llama/Llama-3.1-8B-Instruct",pp_rank="0",tp_rank="1"} 0.42
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{engine_type="unified",model_name="meta-llama/Llama-3.1-8B-Instruct",pp_rank="0",tp_rank="0"} 500000.0
# TYPE sglang:cache_config_info gauge
sglang:cache_config_info{model_name="meta-llama/Llama-3.1-8B-Instruct",num_pages="500000",page_size="1"} 1.0
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 90000.0
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 30000.0
# TYPE sglang:realtime_tokens_total counter
sglang:realtime_tokens_total{engine_type="unified",mode="prefill_compute",model_name="meta-llama/Llama-3.1-8B-Instruct",pp_rank="0",tp_rank="0"} 61000.0
sglang:realtime_tokens_total{engine_type="unified",mode="prefill_cache",model_name="meta-llama/Llama-3.1-8B-Instruct",pp_rank="0",tp_rank="0"} 31000.0
sglang:realtime_tokens_total{engine_type="unified",mode="decode",model_name="meta-llama/Llama-3.1-8B-Instruct",pp_rank="0",tp_rank="0"} 500000.0
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 40.0
sglang:time_to_first_token_seconds_sum{model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
sglang:time_to_first_token_seconds_count{model_name="meta-llama/Llama-3.1-8B-Instruct"} 40.0
`

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		page string
		want Metrics
	}{
		{"vLLM, two engine cores", vllmTwoEngines, Metrics{
			Kind: KindVLLM, Cores: 2, Running: 7, Waiting: 1, KVCacheUsage: 0.375,
			BlockSize: 16, NumBlocks: 2 * 24978, KVCapacity: 2 * 24978 * 16,
			PromptTokens: 77000, CachedTokens: 30000, Requests: 17, PrefillSeconds: 4.75, PrefillCount: 15,
		}},
		{"vLLM with cached prompt tokens and a capacity label", `
vllm:num_requests_running{engine="0"} 1
vllm:num_requests_waiting{engine="0"} 0
vllm:kv_cache_usage_perc{engine="0"} 0.1
vllm:prefix_cache_hits_total{engine="0"} 999
vllm:prompt_tokens_total{engine="0"} 5000
vllm:prompt_tokens_cached_total{engine="0"} 1200
vllm:cache_config_info{block_size="32",engine="0",kv_cache_size_tokens="218464",num_gpu_blocks="6827"} 1
`, Metrics{Kind: KindVLLM, Cores: 1, Running: 1, KVCacheUsage: 0.1, BlockSize: 32, NumBlocks: 6827, KVCapacity: 218464,
			PromptTokens: 5000, CachedTokens: 1200}},
		{"old vLLM, cache not yet sized", `
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 2
vllm:gpu_cache_usage_perc{model_name="m"} 0.75
vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1
`, Metrics{Kind: KindVLLM, Cores: 1, Running: 2, KVCacheUsage: 0.75, BlockSize: 16}},
		{"SGLang, tensor-parallel replicas", sglangTP2, Metrics{
			Kind: KindSGLang, Cores: 1, Running: 5, Waiting: 2, KVCacheUsage: 0.42,
			BlockSize: 1, NumBlocks: 500000, KVCapacity: 500000,
			PromptTokens: 92000, CachedTokens: 31000, Requests: 40,
		}},
		{"SGLang without per-step tokens", `
sglang:num_running_reqs 1
sglang:num_queue_reqs 0
sglang:token_usage 0.5
sglang:cache_config_info{num_pages="1000",page_size="64"} 1
sglang:prompt_tokens_total 90000
sglang:cached_tokens_total 30000
`, Metrics{Kind: KindSGLang, Cores: 1, Running: 1, KVCacheUsage: 0.5, BlockSize: 64, NumBlocks: 1000, KVCapacity: 64000,
			PromptTokens: 90000, CachedTokens: 30000}},
		{"values out of range", `
vllm:num_requests_running{engine="0"} NaN
vllm:num_requests_waiting{engine="0"} -3
vllm:kv_cache_usage_perc{engine="0"} 7
vllm:prompt_tokens_total{engine="0"} +Inf
vllm:num_requests_running{engine="1"} 1e300
`, Metrics{Kind: KindVLLM, Cores: 1, Running: 4294967295, KVCacheUsage: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.page))
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// llamaCppPage is llama-server's /metrics (--metrics) while it served two
// requests and held a third, after two earlier ones whose prompts shared
// all but two tokens.
func llamaCppPage(t testing.TB) []byte {
	b, err := os.ReadFile("testdata/llamacpp-metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseLlamaCpp(t *testing.T) {
	got, err := Parse(llamaCppPage(t))
	if err != nil {
		t.Fatal(err)
	}
	// prompt_tokens_total leaves the cached tokens out; the cache size
	// comes from /props, not from this page.
	want := Metrics{Kind: KindLlamaCpp, Cores: 1, Running: 2, PromptTokens: 1959 + 1955, CachedTokens: 1955,
		PrefillTime: 8.07664, ITLSeconds: 0.867348, ITLCount: 32}
	if got != want {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	checkFilter(t, llamaCppPage(t))
}

func TestParseProps(t *testing.T) {
	real, err := os.ReadFile("testdata/llamacpp-props.json")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		body    string
		tokens  int
		wantErr bool
	}{
		{string(real), 2 * 4096, false},
		{`{"total_slots":4,"default_generation_settings":{"n_ctx":32768}}`, 4 * 32768, false},
		{`{"total_slots":0,"default_generation_settings":{"n_ctx":4096}}`, 0, true},
		{`{"total_slots":2}`, 0, true},
		{`{"total_slots":65536,"default_generation_settings":{"n_ctx":65536}}`, 0, true},
		{`<html>`, 0, true},
	}
	for _, tt := range tests {
		pr, err := parseProps([]byte(tt.body))
		if (err != nil) != tt.wantErr || pr.cacheTokens != tt.tokens {
			t.Errorf("parseProps(%.60q) = %d, %v; want %d", tt.body, pr.cacheTokens, err, tt.tokens)
		}
	}
}

// TestFilterKeepsWhatParseReads parses pages with and without the filter
// that drops the lines Parse does not read.
func TestFilterKeepsWhatParseReads(t *testing.T) {
	for _, page := range []string{vllmTwoEngines, sglangTP2} {
		checkFilter(t, []byte(page))
	}
}

func checkFilter(t *testing.T, page []byte) {
	t.Helper()
	got, err := Parse(page)
	if err != nil {
		t.Fatal(err)
	}
	want, err := parse(page)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("filtered  %+v\nunfiltered %+v", got, want)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(llamaCppPage(f))
	for _, s := range []string{vllmTwoEngines, sglangTP2, "vllm:num_requests_running 1\n", "# TYPE vllm:num_requests_running gauge\n{\"vllm:num_requests_running\"} 2\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, page []byte) {
		got, err := Parse(page)
		if err != nil {
			return
		}
		if got.Running < 0 || got.Waiting < 0 || !(got.KVCacheUsage >= 0 && got.KVCacheUsage <= 1) || got.Kind == KindUnknown {
			t.Fatalf("Parse(%q) = %+v", page, got)
		}
		if want, err := parse(page); err == nil && got != want {
			t.Fatalf("Parse(%q): filtered %+v, unfiltered %+v", page, got, want)
		}
	})
}

func TestParseErrors(t *testing.T) {
	for _, page := range []string{
		"",
		"process_cpu_seconds_total 12\n",
		"vllm:num_requests_running{engine=\"0\" 1\n",
		"<html>502 Bad Gateway</html>",
		"\x00\xff\xfe",
	} {
		if m, err := Parse([]byte(page)); err == nil {
			t.Errorf("Parse(%q) = %+v, want an error", page, m)
		}
	}
}

func TestParseModels(t *testing.T) {
	long := strings.Repeat("x", 256)
	tests := []struct {
		body             string
		models, adapters []string
		wantErr          bool
	}{
		{`{"object":"list","data":[{"id":"Qwen/Qwen3-32B","root":"Qwen/Qwen3-32B","parent":null},
			{"id":"sql-lora","root":"/adapters/sql","parent":"Qwen/Qwen3-32B"}]}`,
			[]string{"Qwen/Qwen3-32B"}, []string{"sql-lora"}, false},
		{`{"data":[{"id":"a"},{"id":"a"},{"id":""},{"id":"` + long + `"},{"id":"b","parent":""}]}`,
			[]string{"a", "b"}, nil, false},
		{`{"data":[{"id":"lora","parent":"base"}]}`, nil, nil, true},
		{`{"data":[]}`, nil, nil, true},
		{`not json`, nil, nil, true},
	}
	for _, tt := range tests {
		models, adapters, err := parseModels([]byte(tt.body))
		if (err != nil) != tt.wantErr || !reflect.DeepEqual(models, tt.models) || !reflect.DeepEqual(adapters, tt.adapters) {
			t.Errorf("parseModels(%.60q) = %q, %q, %v", tt.body, models, adapters, err)
		}
	}
	var b strings.Builder
	b.WriteString(`{"data":[`)
	for i := range 300 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"id":"m` + strings.Repeat("i", i) + `"}`)
	}
	b.WriteString(`]}`)
	if models, _, err := parseModels([]byte(b.String())); err != nil || len(models) != maxModelNames {
		t.Errorf("300 models: kept %d (%v), want %d", len(models), err, maxModelNames)
	}
}

func TestParseSlots(t *testing.T) {
	tests := []struct {
		name, body string
		want       []Slot
		err        error
	}{
		{"a fresh server", `[{"id":0,"n_ctx":2048,"is_processing":false},{"id":1,"n_ctx":2048,"is_processing":false}]`, []Slot{{ID: 0}, {ID: 1}}, nil},
		{"no limit on a busy slot's answer", `[{"id":0,"id_task":7,"is_processing":true,"prompt":"<bos>hi","next_token":[{"n_remain":-1}]}]`,
			[]Slot{{ID: 0, Busy: true, Remaining: math.MaxUint32, Prompt: "hi"}}, nil},
		{"prompts not shown", `[{"id":0,"id_task":7,"is_processing":false,"next_token":[{"n_remain":-1}]}]`, nil, errNoSlotPrompts},
		{"a slot without an id", `[{"is_processing":false}]`, nil, nil},
		{"not a list", `{"error":"nope"}`, nil, nil},
	}
	for _, tt := range tests {
		got, err := parseSlots([]byte(tt.body), "<bos>")
		switch {
		case tt.want == nil && tt.err == nil:
			if err == nil {
				t.Errorf("%s: no error", tt.name)
			}
		case !errors.Is(err, tt.err) || !reflect.DeepEqual(got, tt.want):
			t.Errorf("%s: parseSlots = %+v, %v; want %+v, %v", tt.name, got, err, tt.want, tt.err)
		}
	}
}
