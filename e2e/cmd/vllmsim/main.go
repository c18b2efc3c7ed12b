// Command vllmsim serves one simulated vLLM engine (see package vllmsim).
// Flags carry vLLM's names where vLLM has them:
//
//	vllmsim --model Qwen/Qwen2.5-32B-Instruct --port 8000 \
//	  --kv-events-config '{"enable_kv_cache_events":true,"endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}'
//
// As with `vllm serve`, the model may also be given as the first argument,
// after an optional "serve".
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/kvroute/kvroute/e2e/vllmsim"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, err)
		}
		os.Exit(2)
	}
}

type loraFlag []vllmsim.LoRAModule

func (l *loraFlag) String() string { return fmt.Sprint(*l) }

func (l *loraFlag) Set(s string) error {
	m, err := vllmsim.ParseLoRAModule(s)
	if err == nil {
		*l = append(*l, m)
	}
	return err
}

func run(args []string) error {
	var (
		cfg        vllmsim.Config
		model      string
		served     string
		template   string
		eventsJSON string
		encoding   string
		noCaching  bool
		caching    = true
		loras      loraFlag
		logLevel   slog.Level
	)
	c := vllmsim.DefaultCostModel
	fs := flag.NewFlagSet("vllmsim", flag.ContinueOnError)
	fs.StringVar(&cfg.Host, "host", "0.0.0.0", "HTTP listen host")
	fs.IntVar(&cfg.Port, "port", 8000, "HTTP listen port")
	fs.StringVar(&model, "model", vllmsim.DefaultModel, "model name")
	fs.StringVar(&served, "served-model-name", "", "name the API serves the model under (default: --model)")
	fs.StringVar(&template, "chat-template", "", "chat template: chatml, llama3, mistral, gemma, a file, or Jinja source (default: by model name)")
	fs.Var(&loras, "lora-modules", "LoRA adapter as name=path (repeatable)")
	fs.IntVar(&cfg.BlockSize, "block-size", vllmsim.DefaultBlockSize, "tokens per KV block")
	fs.IntVar(&cfg.NumGPUBlocks, "num-gpu-blocks-override", vllmsim.DefaultNumGPUBlocks, "GPU KV blocks, vLLM's null block included")
	fs.IntVar(&cfg.MaxNumBatchedTokens, "max-num-batched-tokens", vllmsim.DefaultMaxNumBatchedTokens, "token budget per engine step")
	fs.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", vllmsim.DefaultMaxNumSeqs, "running sequences at most")
	fs.IntVar(&cfg.MaxModelLen, "max-model-len", 0, "context length (default: min(32768, KV cache capacity))")
	fs.BoolVar(&caching, "enable-prefix-caching", true, "reuse cached prefix blocks")
	fs.BoolVar(&noCaching, "no-enable-prefix-caching", false, "disable prefix caching")
	fs.BoolVar(&cfg.EnablePromptTokensDetails, "enable-prompt-tokens-details", false, "report usage.prompt_tokens_details.cached_tokens")
	fs.StringVar(&eventsJSON, "kv-events-config", "", "KV events configuration, vLLM's JSON (enable_kv_cache_events, publisher, endpoint, replay_endpoint, buffer_steps, hwm, topic)")
	fs.IntVar(&cfg.DataParallelRank, "data-parallel-rank", 0, "data_parallel_rank written into event batches")

	fs.IntVar(&cfg.NumCPUBlocks, "num-cpu-blocks", 0, "simulator: CPU offload tier capacity in blocks (0: no CPU tier)")
	fs.IntVar(&cfg.OffloadChunkBlocks, "offload-chunk-blocks", 0, "simulator: offload requests' blocks to the CPU tier in chunks of N with self-describing events (vLLM 0.33); 0: block by block on GPU eviction")
	fs.StringVar(&encoding, "kv-events-encoding", "map", "simulator: event layout: map (vLLM >= 0.26), array, array-legacy")
	fs.BoolVar(&cfg.BatchAsMap, "kv-events-batch-map", false, "simulator: encode the outer event batch as a map")
	fs.BoolVar(&cfg.BytesHashes, "kv-events-bytes-hashes", os.Getenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES") == "0", "simulator: publish 32-byte block hashes instead of 64-bit integers")
	fs.BoolVar(&cfg.ReplayWithoutTopic, "kv-events-replay-without-topic", false, "simulator: replay replies without the topic frame (vLLM < 0.26)")
	fs.StringVar(&cfg.HashSeed, "hash-seed", envOr("PYTHONHASHSEED", vllmsim.DefaultHashSeed), "simulator: NONE_HASH seed, as PYTHONHASHSEED")
	fs.IntVar(&cfg.DefaultOutputTokens, "default-output-tokens", vllmsim.DefaultOutputTokens, "simulator: tokens a chat request without max_tokens generates")
	fs.Float64Var(&cfg.TimeScale, "time-scale", 1, "simulator: wall seconds per simulated second (0.1: ten times faster; 0: no pacing)")
	fs.Func("accelerator", "simulator: h100 (default) or a100, the cost model the -cost-* flags then adjust; give it first", func(s string) error {
		m, err := vllmsim.CostModelFor(s)
		c = m
		return err
	})
	fs.Float64Var(&c.Step, "cost-step", c.Step, "simulator: fixed seconds per engine step")
	fs.Float64Var(&c.PrefillToken, "cost-prefill-token", c.PrefillToken, "simulator: seconds per prefill token")
	fs.Float64Var(&c.PrefillAttention, "cost-prefill-attention", c.PrefillAttention, "simulator: seconds per (prefill token, earlier token) pair")
	fs.Float64Var(&c.DecodeSeq, "cost-decode-seq", c.DecodeSeq, "simulator: seconds per decoding sequence")
	fs.Float64Var(&c.DecodeContext, "cost-decode-context", c.DecodeContext, "simulator: seconds per decoding sequence per context token")
	fs.Float64Var(&c.CPULoadToken, "cost-cpu-load-token", c.CPULoadToken, "simulator: seconds per token loaded from the CPU tier")
	fs.TextVar(&logLevel, "log-level", slog.LevelInfo, "log level: debug, info, warn, error")
	hfDir := fs.String("write-hf-tokenizer", "", "simulator: write the vocabulary (cl100k_base) as a HuggingFace tokenizer directory and exit")

	if len(args) > 0 && args[0] == "serve" {
		args = args[1:]
	}
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		model, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *hfDir != "" {
		return vllmsim.WriteHFTokenizer(*hfDir)
	}
	cfg.Model = model
	if served != "" {
		cfg.Model = served
	}
	cfg.LoRAModules = loras
	cfg.Cost = c
	cfg.DisablePrefixCaching = noCaching || !caching
	enc, err := vllmsim.ParseEncoding(encoding)
	if err != nil {
		return err
	}
	cfg.Encoding = enc
	if eventsJSON != "" {
		if err := json.Unmarshal([]byte(eventsJSON), &cfg.KVEvents); err != nil {
			return fmt.Errorf("--kv-events-config: %w", err)
		}
	}
	cfg.ChatTemplate = template
	if template != "" && !strings.Contains(template, "{") {
		// A file, as vLLM takes it; otherwise a template name.
		if b, err := os.ReadFile(template); err == nil {
			cfg.ChatTemplate = string(b)
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("--chat-template: %w", err)
		}
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel}))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	e, err := vllmsim.Start(ctx, cfg)
	if err != nil {
		return err
	}
	<-ctx.Done()
	return e.Close()
}

func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}
