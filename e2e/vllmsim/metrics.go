package vllmsim

import (
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the vLLM V1 Prometheus metrics routing reads
// (vllm/v1/metrics/loggers.py), with vLLM's names, labels and buckets.
// Times are simulated seconds.
type metrics struct {
	reg *prometheus.Registry

	running, waiting, kvUsage            prometheus.Gauge
	prefixQueries, prefixHits            prometheus.Counter
	externalQueries, externalHits        prometheus.Counter // only with a CPU tier
	promptTokens, generationTokens       prometheus.Counter
	preemptions                          prometheus.Counter
	success                              *prometheus.CounterVec
	ttft, itl, e2e, queue, prefill       prometheus.Histogram
	requestPrompt, requestGeneration     prometheus.Histogram
	loraInfo                             *prometheus.GaugeVec // only with LoRA modules
	lastQueries, lastHits, lastPreempted int
	lastExtQueries, lastExtHits          int
}

var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
		0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	itlBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
		1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	latencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
		40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// buckets125 is vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to max.
func buckets125(max int) []float64 {
	var out []float64
	for exp := 1; ; exp *= 10 {
		for _, m := range []int{1, 2, 5} {
			if m*exp > max {
				return out
			}
			out = append(out, float64(m*exp))
		}
	}
}

func newMetrics(cfg *Config) *metrics {
	labels := prometheus.Labels{"model_name": cfg.Model, "engine": "0"}
	m := &metrics{reg: prometheus.NewRegistry()}
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels})
		m.reg.MustRegister(g)
		return g
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
		m.reg.MustRegister(c)
		return c
	}
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: labels})
		m.reg.MustRegister(h)
		return h
	}
	m.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
	m.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
	m.kvUsage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
	m.prefixQueries = counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.")
	m.prefixHits = counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.")
	if cfg.NumCPUBlocks > 0 && !cfg.DisablePrefixCaching {
		m.externalQueries = counter("vllm:external_prefix_cache_queries_total", "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.")
		m.externalHits = counter("vllm:external_prefix_cache_hits_total", "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.")
	}
	m.promptTokens = counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.")
	m.generationTokens = counter("vllm:generation_tokens_total", "Number of generation tokens processed.")
	m.preemptions = counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.")
	m.success = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vllm:request_success_total", Help: "Count of successfully processed requests.", ConstLabels: labels,
	}, []string{"finished_reason"})
	m.reg.MustRegister(m.success)
	m.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets)
	m.itl = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itlBuckets)
	m.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", latencyBuckets)
	m.queue = histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", latencyBuckets)
	m.prefill = histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", latencyBuckets)
	m.requestPrompt = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", buckets125(cfg.MaxModelLen))
	m.requestGeneration = histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", buckets125(cfg.MaxModelLen))

	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig",
	}, []string{"block_size", "cache_dtype", "enable_prefix_caching", "engine", "gpu_memory_utilization",
		"kv_cache_size_tokens", "num_cpu_blocks", "num_gpu_blocks", "num_gpu_blocks_override", "prefix_caching_hash_algo"})
	m.reg.MustRegister(info)
	info.WithLabelValues(strconv.Itoa(cfg.BlockSize), "auto", strconv.FormatBool(!cfg.DisablePrefixCaching), "0", "0.9",
		strconv.Itoa((cfg.NumGPUBlocks-1)*cfg.BlockSize), strconv.Itoa(cfg.NumCPUBlocks), strconv.Itoa(cfg.NumGPUBlocks),
		strconv.Itoa(cfg.NumGPUBlocks), "sha256_cbor").Set(1)

	if len(cfg.LoRAModules) > 0 {
		m.loraInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vllm:lora_requests_info", Help: "Running stats on lora requests.",
		}, []string{"max_lora", "running_lora_adapters", "waiting_lora_adapters"})
		m.reg.MustRegister(m.loraInfo)
	}
	return m
}

// step publishes the scheduler's state after a step.
func (m *metrics) step(s *scheduler) {
	m.running.Set(float64(len(s.running)))
	m.waiting.Set(float64(len(s.waiting)))
	m.kvUsage.Set(s.pool.usage())
	st := s.stats
	m.prefixQueries.Add(float64(st.prefixQueries - m.lastQueries))
	m.prefixHits.Add(float64(st.prefixHits - m.lastHits))
	m.preemptions.Add(float64(st.preemptions - m.lastPreempted))
	if m.externalQueries != nil {
		m.externalQueries.Add(float64(st.externalQueries - m.lastExtQueries))
		m.externalHits.Add(float64(st.externalHits - m.lastExtHits))
	}
	m.lastQueries, m.lastHits, m.lastPreempted = st.prefixQueries, st.prefixHits, st.preemptions
	m.lastExtQueries, m.lastExtHits = st.externalQueries, st.externalHits
	if m.loraInfo != nil {
		m.loraInfo.Reset()
		m.loraInfo.WithLabelValues(strconv.Itoa(len(s.cfg.LoRAModules)), adapters(s.running), adapters(s.waiting)).
			Set(float64(time.Now().UnixNano()) / 1e9)
	}
}

// adapters lists the LoRA adapters of rs, comma-separated, each once.
func adapters(rs []*request) string {
	var names []string
	seen := map[string]bool{}
	for _, r := range rs {
		if n := r.meta.loraName; n != "" && !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	return strings.Join(names, ",")
}
