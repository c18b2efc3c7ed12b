package vllmsim

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
)

// Defaults. The cache and scheduler figures are those of the deployment the
// cost model is calibrated on (see CostModel): Qwen3-32B, TP=2 on two H100s,
// --max-num-batched-tokens 8192.
const (
	DefaultModel               = "Qwen/Qwen2.5-32B-Instruct"
	DefaultBlockSize           = 16
	DefaultNumGPUBlocks        = 19208 // 307,328 tokens per pod (llm-d blog 2025-09-24) / 16
	DefaultMaxNumBatchedTokens = 8192
	DefaultMaxNumSeqs          = 256 // vLLM SchedulerConfig default
	DefaultMaxModelLen         = 32768
	DefaultOutputTokens        = 128
	DefaultHashSeed            = "0"
	DefaultBufferSteps         = 10000
	DefaultHWM                 = 100000
)

// Config describes one simulated engine. The zero value of every field
// means the default; Start fills them in.
type Config struct {
	// Host and Port are the HTTP listen address; port 0 picks a free one.
	Host string
	Port int

	// Model is the served model name (vLLM --served-model-name, or --model).
	Model string
	// ChatTemplate names an embedded template (chatml, llama3, mistral, qwen3,
	// gemma) or is a Jinja source to use as is. Empty: chosen from Model.
	ChatTemplate string
	// LoRAModules are adapters listed by /v1/models and accepted as "model".
	LoRAModules []LoRAModule

	BlockSize    int // tokens per KV block
	NumGPUBlocks int // GPU KV blocks, including vLLM's reserved null block
	NumCPUBlocks int // CPU offload tier capacity in blocks; 0: no CPU tier
	// OffloadChunkBlocks makes the CPU tier vLLM 0.33's offloading
	// connector with self-describing events: requests' blocks offloaded in
	// chunks of this many as they are computed, each chunk announced with
	// its tokens, hashes shared by two chunks announced twice. 0: blocks
	// offloaded one by one when the GPU evicts them, announced by hash
	// alone (the connector's legacy payload).
	OffloadChunkBlocks  int
	MaxNumBatchedTokens int // token budget per engine step
	MaxNumSeqs          int // running sequences at most
	MaxModelLen         int // prompt + output tokens at most; 0: min(32768, cache capacity)

	// NoTokenize leaves out /tokenize and the render endpoints (404), as
	// an engine that cannot say how it renders a chat request.
	NoTokenize bool
	// NoRender leaves out the render endpoints (/v1/completions/render,
	// /v1/chat/completions/render), as vLLM before them.
	NoRender bool

	// DisablePrefixCaching turns off cache reuse (vLLM --no-enable-prefix-caching):
	// blocks are still allocated, never matched, and no events are sent.
	DisablePrefixCaching bool
	// HashSeed plays the part of PYTHONHASHSEED: NONE_HASH = sha256_cbor(HashSeed).
	HashSeed string

	// DefaultOutputTokens is how many tokens a chat request without
	// max_tokens generates before the simulated end of sequence.
	DefaultOutputTokens int
	// EnablePromptTokensDetails reports usage.prompt_tokens_details.cached_tokens
	// (vLLM --enable-prompt-tokens-details).
	EnablePromptTokensDetails bool

	KVEvents KVEventsConfig
	// Encoding is the msgpack layout of events (default EncodingMap).
	Encoding Encoding
	// BatchAsMap encodes the outer EventBatch as a map {ts, events,
	// data_parallel_rank} instead of the positional array every released
	// vLLM sends; vLLM main's source declares it that way.
	BatchAsMap bool
	// BytesHashes publishes the 32-byte hashes instead of their 64-bit
	// integer form (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0).
	BytesHashes bool
	// ReplayWithoutTopic answers replay requests with [seq, payload] as vLLM
	// before v0.26.0 did, instead of [topic, seq, payload].
	ReplayWithoutTopic bool
	// DataParallelRank is written into every batch.
	DataParallelRank int

	Cost CostModel
	// TimeScale is wall-clock seconds per simulated second: 1 runs in real
	// time, 0.1 ten times faster. 0 does not pace at all: steps run back to
	// back and simulated time advances by the cost model alone.
	TimeScale float64

	Logger *slog.Logger
}

// LoRAModule is a LoRA adapter (vLLM --lora-modules name=path).
type LoRAModule struct {
	Name string
	Path string
}

// KVEventsConfig mirrors vLLM's --kv-events-config JSON.
type KVEventsConfig struct {
	EnableKVCacheEvents bool   `json:"enable_kv_cache_events"`
	Publisher           string `json:"publisher,omitempty"` // "zmq" or "null"
	Endpoint            string `json:"endpoint,omitempty"`  // PUB; binds if it holds "*" or "::", else connects
	ReplayEndpoint      string `json:"replay_endpoint,omitempty"`
	BufferSteps         int    `json:"buffer_steps,omitempty"`
	HWM                 int    `json:"hwm,omitempty"`
	MaxQueueSize        int    `json:"max_queue_size,omitempty"` // accepted for compatibility; sends never queue here
	Topic               string `json:"topic"`
}

// ParseLoRAModule parses vLLM's name=path form.
func ParseLoRAModule(s string) (LoRAModule, error) {
	name, path, ok := strings.Cut(s, "=")
	if !ok || name == "" || path == "" {
		return LoRAModule{}, fmt.Errorf("lora module %q: want name=path", s)
	}
	return LoRAModule{Name: name, Path: path}, nil
}

// withDefaults returns c with zero fields set to their defaults, or an error
// for settings vLLM would refuse to start with.
func (c Config) withDefaults() (Config, error) {
	if c.Host == "" {
		c.Host = "127.0.0.1"
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.BlockSize == 0 {
		c.BlockSize = DefaultBlockSize
	}
	if c.NumGPUBlocks == 0 {
		c.NumGPUBlocks = DefaultNumGPUBlocks
	}
	if c.MaxNumBatchedTokens == 0 {
		c.MaxNumBatchedTokens = DefaultMaxNumBatchedTokens
	}
	if c.MaxNumSeqs == 0 {
		c.MaxNumSeqs = DefaultMaxNumSeqs
	}
	if c.DefaultOutputTokens == 0 {
		c.DefaultOutputTokens = DefaultOutputTokens
	}
	if c.HashSeed == "" {
		c.HashSeed = DefaultHashSeed
	}
	if c.Cost == (CostModel{}) {
		c.Cost = DefaultCostModel
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	ev := &c.KVEvents
	if ev.Publisher == "" {
		ev.Publisher = "null"
		if ev.EnableKVCacheEvents {
			ev.Publisher = "zmq"
		}
	}
	if ev.Endpoint == "" {
		ev.Endpoint = "tcp://*:5557"
	}
	if ev.BufferSteps == 0 {
		ev.BufferSteps = DefaultBufferSteps
	}
	if ev.HWM == 0 {
		ev.HWM = DefaultHWM
	}

	var errs []error
	if c.BlockSize < 1 || c.NumGPUBlocks < 2 || c.NumCPUBlocks < 0 || c.OffloadChunkBlocks < 0 || c.MaxNumBatchedTokens < 1 || c.MaxNumSeqs < 1 {
		errs = append(errs, fmt.Errorf("block size %d, GPU blocks %d (at least 2), CPU blocks %d, batched tokens %d, seqs %d: must be positive",
			c.BlockSize, c.NumGPUBlocks, c.NumCPUBlocks, c.MaxNumBatchedTokens, c.MaxNumSeqs))
	}
	capacity := (c.NumGPUBlocks - 1) * c.BlockSize
	switch {
	case c.MaxModelLen == 0:
		c.MaxModelLen = min(DefaultMaxModelLen, capacity)
	case c.MaxModelLen > capacity && c.BlockSize > 0:
		errs = append(errs, fmt.Errorf("max model len %d is larger than the %d tokens the KV cache holds", c.MaxModelLen, capacity))
	}
	if c.MaxModelLen < 2 {
		errs = append(errs, fmt.Errorf("max model len %d: need at least 2 tokens", c.MaxModelLen))
	}
	if c.TimeScale < 0 {
		errs = append(errs, fmt.Errorf("time scale %g is negative", c.TimeScale))
	}
	if err := c.Cost.validate(); err != nil {
		errs = append(errs, err)
	}
	if ev.Publisher != "zmq" && ev.Publisher != "null" {
		errs = append(errs, fmt.Errorf("kv events publisher %q: want zmq or null", ev.Publisher))
	}
	if ev.BufferSteps < 0 || ev.HWM < 0 {
		errs = append(errs, errors.New("kv events buffer_steps and hwm must not be negative"))
	}
	if _, ok := encodingNames[c.Encoding]; !ok {
		errs = append(errs, fmt.Errorf("unknown event encoding %d", int(c.Encoding)))
	}
	seen := map[string]bool{c.Model: true}
	for _, m := range c.LoRAModules {
		if m.Name == "" || seen[m.Name] {
			errs = append(errs, fmt.Errorf("lora module name %q is empty or repeated", m.Name))
		}
		seen[m.Name] = true
	}
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("vllmsim: config: %w", err)
	}
	return c, nil
}
