package bridge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pkoukk/tiktoken-go"
	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"

	"github.com/kvroute/kvroute/cachesync/internal/kvevents"
	"github.com/kvroute/kvroute/cachesync/internal/vocab"
	"github.com/kvroute/kvroute/e2e/vllmsim"
	"github.com/kvroute/kvroute/shared/blockhash"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// The tests below run the real engine simulator, which tokenizes with
// cl100k_base and publishes vLLM's events over ZeroMQ, and check the
// bridge's text blocks against two independent oracles: the filter's own
// hashing of the request (shared/prompt and shared/blockhash), and the
// engine's cache contents (Engine.CachedBlocks, decoded with tiktoken-go).

var (
	simVocabOnce sync.Once
	simVocab     *vocab.Vocab
	simTik       *tiktoken.Tiktoken
	simErr       error
)

func loadSimVocab(t testing.TB) (*vocab.Vocab, *tiktoken.Tiktoken) {
	t.Helper()
	simVocabOnce.Do(func() {
		if simVocab, simErr = vocab.Load("cl100k_base"); simErr != nil {
			return
		}
		tiktoken.SetBpeLoader(tiktokenloader.NewOfflineLoader())
		simTik, simErr = tiktoken.GetEncoding("cl100k_base")
	})
	if simErr != nil {
		t.Fatal(simErr)
	}
	return simVocab, simTik
}

// lockedSink is a setSink the subscriber's goroutine writes while the test
// reads it.
type lockedSink struct {
	mu sync.Mutex
	s  *setSink
}

func (l *lockedSink) Add(h uint64, t snapshot.Tier) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.s.Add(h, t)
}

func (l *lockedSink) Remove(h uint64, t snapshot.Tier) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.s.Remove(h, t)
}

func (l *lockedSink) Clear() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.s.Clear()
}

func (l *lockedSink) tier(t snapshot.Tier) []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s.tier(t)
}

// rankHandler passes batches on and notes the data-parallel rank.
type rankHandler struct {
	*Engine
	rank atomicInt
}

type atomicInt struct {
	mu sync.Mutex
	v  int
}

func (h *rankHandler) Batch(b *kvevents.Batch) {
	h.rank.mu.Lock()
	h.rank.v = b.DPRank
	h.rank.mu.Unlock()
	h.Engine.Batch(b)
}

// rig is a simulated engine followed by a subscriber and a bridge.
type rig struct {
	t       *testing.T
	eng     *vllmsim.Engine
	model   string
	tmpl    prompt.Template
	sink    *lockedSink
	bridge  *Engine
	handler *rankHandler
	sub     *kvevents.Subscriber
	stop    func()
	history map[uint64]vllmsim.Block // every block the engine was seen to cache
}

func startRig(t *testing.T, cfg vllmsim.Config, tmpl prompt.Template) *rig {
	t.Helper()
	loadSimVocab(t)
	cfg.KVEvents.EnableKVCacheEvents = true
	cfg.KVEvents.Topic = "kv@sim"
	cfg.Logger = discard()
	es, err := vllmsim.StartN(context.Background(), 1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, eng: es[0], model: es[0].Config().Model, tmpl: tmpl, history: map[uint64]vllmsim.Block{}}
	t.Cleanup(func() { r.eng.Close() })
	r.follow()
	t.Cleanup(func() { r.stop() })
	return r
}

// follow starts a new subscriber and bridge, as a (re)started cachesync.
func (r *rig) follow() {
	r.sink = &lockedSink{s: newSetSink(r.t)}
	r.bridge = newEngine(r.t, Config{Model: r.model, Vocab: simVocab, Capacity: r.eng.Config().NumGPUBlocks + r.eng.Config().NumCPUBlocks}, r.sink)
	r.handler = &rankHandler{Engine: r.bridge}
	r.resume()
}

// resume runs the current subscriber (a new one the first time).
func (r *rig) resume() {
	if r.sub == nil {
		sub, err := kvevents.New(kvevents.Config{Endpoint: r.eng.EventsEndpoint(), ReplayEndpoint: r.eng.ReplayEndpoint(),
			Topic: "kv@", Logger: discard()}, r.handler)
		if err != nil {
			r.t.Fatal(err)
		}
		r.sub = sub
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.sub.Run(ctx)
	}()
	r.stop = func() {
		cancel()
		<-done
	}
}

// chat sends one chat request to the engine and returns its body and the
// prompt tokens the engine counted.
func (r *rig) chat(model string, msgs []map[string]string, maxTokens int) ([]byte, int) {
	r.t.Helper()
	return r.chatWith(model, msgs, maxTokens, nil)
}

// chatWith is chat with more fields in the body.
func (r *rig) chatWith(model string, msgs []map[string]string, maxTokens int, extra map[string]any) ([]byte, int) {
	r.t.Helper()
	req := map[string]any{"model": model, "messages": msgs, "max_tokens": maxTokens}
	for k, v := range extra {
		req[k] = v
	}
	body, _ := json.Marshal(req)
	resp, err := http.Post(r.eng.URL()+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		r.t.Fatalf("chat: %d %v", resp.StatusCode, err)
	}
	r.observe()
	return body, out.Usage.PromptTokens
}

// observe records the blocks the engine caches now, so that the oracle
// knows the text before a block whose parent has since been evicted.
func (r *rig) observe() {
	for _, b := range r.eng.CachedBlocks() {
		r.history[b.Hash] = b
	}
}

// oracle returns, per tier, the text blocks completed by the blocks the
// engine caches now, from their tokens decoded by tiktoken-go.
func (r *rig) oracle(seedName string) map[snapshot.Tier][]uint64 {
	r.observe()
	seed := blockhash.Seed(seedName, "")
	out := map[snapshot.Tier]map[uint64]bool{snapshot.TierGPU: {}, snapshot.TierCPU: {}}
	for _, b := range r.eng.CachedBlocks() {
		var chain [][]int
		for c := b; ; c = r.history[c.Parent] {
			chain = append(chain, c.TokenIDs)
			if !c.HasParent {
				break
			}
		}
		var toks []int
		for i := len(chain) - 1; i >= 0; i-- {
			toks = append(toks, chain[i]...)
		}
		before := blockhash.Append(nil, seed, []byte(simTik.Decode(toks[:len(toks)-len(b.TokenIDs)])), blockhash.Config{})
		through := blockhash.Append(nil, seed, []byte(simTik.Decode(toks)), blockhash.Config{})
		tier := snapshot.TierGPU
		if b.Medium != "GPU" {
			tier = snapshot.TierCPU
		}
		for _, h := range through[len(before):] {
			out[tier][h] = true
		}
	}
	res := map[snapshot.Tier][]uint64{}
	for tier, set := range out {
		res[tier] = []uint64{}
		for h := range set {
			res[tier] = append(res[tier], h)
		}
		slices.Sort(res[tier])
	}
	return res
}

// settle waits until the sink holds want, per tier.
func (r *rig) settle(want map[snapshot.Tier][]uint64) {
	r.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		gpu, cpu := r.sink.tier(snapshot.TierGPU), r.sink.tier(snapshot.TierCPU)
		if slices.Equal(gpu, want[snapshot.TierGPU]) && slices.Equal(cpu, want[snapshot.TierCPU]) {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("the bridge holds %d GPU and %d CPU text blocks, want %d and %d (%s); subscriber %+v, bridge %+v",
				len(gpu), len(cpu), len(want[snapshot.TierGPU]), len(want[snapshot.TierCPU]),
				"GPU: "+diff(gpu, want[snapshot.TierGPU]), r.sub.Stats(), r.bridge.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func diff(got, want []uint64) string {
	missing, extra := 0, 0
	for _, h := range want {
		if _, ok := slices.BinarySearch(got, h); !ok {
			missing++
		}
	}
	for _, h := range got {
		if _, ok := slices.BinarySearch(want, h); !ok {
			extra++
		}
	}
	return fmt.Sprintf("%d missing, %d extra", missing, extra)
}

// filterHashes is what the filter computes for a request body.
func filterHashes(t *testing.T, body []byte, tmpl prompt.Template) (string, []uint64) {
	t.Helper()
	p, err := prompt.Render(nil, body, tmpl)
	if err != nil {
		t.Fatal(err)
	}
	return string(p.Text), blockhash.Append(nil, blockhash.Seed(p.Model, ""), p.Text, blockhash.Config{})
}

var conversation = []map[string]string{
	{"role": "system", "content": "You are a careful assistant for a logistics company. Answer in two sentences at most, and name your sources."},
	{"role": "user", "content": strings.Repeat("Our warehouse in Rotterdam ships 1,200 pallets a day to 37 customers; ", 6) + "which routes should we consolidate first?"},
}

// TestFilterHashes is the end-to-end contract: for requests sent straight
// to the engine, the text blocks the bridge derives from the engine's
// events are exactly the first text blocks the filter hashes for the same
// body, as many as the engine's cached token blocks cover.
//
// With max_tokens 1 the engine caches the prompt's full token blocks,
// floor(n/16) of n tokens: the partial last block is never cached, and the
// sampled token is never fed back, so no KV of it exists. (That vLLM
// leaves at least one prompt token to compute concerns hits: a later
// prompt of exactly 16k tokens recomputes its last block, which is then
// already cached and not stored again.) The cached blocks' text is the
// first L bytes of the prompt, L = len(decode(tokens[:16*floor(n/16)])),
// and a text block is known once the engine holds its last byte: the
// bridge must hold exactly the filter's first floor(L/64) hashes. The text
// block straddling the end of the last cached token block is not held,
// though the engine holds most of it.
func TestFilterHashes(t *testing.T) {
	_, tik := loadSimVocab(t)
	models := []struct {
		model string
		tmpl  prompt.Template
	}{
		{"Qwen/Qwen2.5-7B-Instruct", prompt.ChatML},
		{"meta-llama/Llama-3.1-8B-Instruct", prompt.Llama3},
		{"mistralai/Mistral-Nemo-Instruct-2407", prompt.Mistral},
		{"google/gemma-3-4b-it", prompt.Gemma},
	}
	straddled := 0 // prompts whose last cached token block ends inside a full text block
	for _, m := range models {
		t.Run(m.tmpl.String(), func(t *testing.T) {
			r := startRig(t, vllmsim.Config{Model: m.model, NumGPUBlocks: 512}, m.tmpl)
			want := map[uint64]bool{}
			msgs := slices.Clone(conversation)
			for turn := range 3 {
				body, n := r.chat(m.model, msgs, 1)
				text, hashes := filterHashes(t, body, m.tmpl)
				toks := tik.EncodeOrdinary(text)
				if len(toks) != n {
					t.Fatalf("turn %d: the filter's text has %d tokens, the engine counted %d: renders differ", turn, len(toks), n)
				}
				cached := n / 16 * 16
				covered := len(tik.Decode(toks[:cached])) / blockhash.DefaultBlockSize
				if covered > len(hashes) || covered == 0 {
					t.Fatalf("turn %d: %d tokens cover %d of %d text blocks", turn, cached, covered, len(hashes))
				}
				if covered < len(hashes) {
					straddled++
				}
				for _, h := range hashes[:covered] {
					want[h] = true
				}
				msgs = append(msgs, map[string]string{"role": "assistant", "content": "Consolidate the Antwerp and Hamburg routes first."},
					map[string]string{"role": "user", "content": fmt.Sprintf("And in week %d? Give the three busiest lanes with their volumes.", turn+1)})
			}
			gpu := []uint64{}
			for h := range want {
				gpu = append(gpu, h)
			}
			slices.Sort(gpu)
			r.settle(map[snapshot.Tier][]uint64{snapshot.TierGPU: gpu, snapshot.TierCPU: {}})
			// The same set, from the engine's own account of its cache.
			if o := r.oracle(m.model); !slices.Equal(o[snapshot.TierGPU], gpu) {
				t.Fatalf("the engine's cached blocks complete %d text blocks, the filter's hashes say %d", len(o[snapshot.TierGPU]), len(gpu))
			}
			if st := r.bridge.Stats(); st.Skipped != [numSkips]uint64{} {
				t.Fatalf("skipped %v", st.Skipped)
			}
		})
	}
	if straddled == 0 {
		t.Error("no prompt had a text block straddling its last cached token block: the test does not exercise it")
	}
}

// TestAdapter: a LoRA adapter's blocks are seeded with the adapter's name,
// which the filter takes from the request's "model".
func TestAdapter(t *testing.T) {
	_, tik := loadSimVocab(t)
	r := startRig(t, vllmsim.Config{Model: "Qwen/Qwen2.5-7B-Instruct", NumGPUBlocks: 256,
		LoRAModules: []vllmsim.LoRAModule{{Name: "sql-lora", Path: "/adapters/sql"}}}, prompt.ChatML)
	body, n := r.chat("sql-lora", conversation, 1)
	text, hashes := filterHashes(t, body, prompt.ChatML)
	covered := len(tik.Decode(tik.EncodeOrdinary(text)[:n/16*16])) / 64
	want := slices.Clone(hashes[:covered])
	slices.Sort(want)
	r.settle(map[snapshot.Tier][]uint64{snapshot.TierGPU: want, snapshot.TierCPU: {}})
}

// prompts returns n distinct prompts of about 150 tokens sharing a prefix.
func prompts(n int) [][]map[string]string {
	var out [][]map[string]string
	for i := range n {
		out = append(out, []map[string]string{
			{"role": "system", "content": "Shared system prompt for every request in this test, long enough to fill a block or two."},
			{"role": "user", "content": fmt.Sprintf("Request %d: ", i) + strings.Repeat(fmt.Sprintf("item %d costs %d euros; ", i, 10*i+3), 12)},
		})
	}
	return out
}

// TestEviction: with a small cache the engine evicts blocks, and the bridge
// drops exactly the text blocks they completed; a CPU tier receives the
// evicted blocks and the bridge moves them to the CPU tier.
//
// With chunked offloading (vLLM 0.33's connector) the prompts' shared
// system prompt ends inside a chunk, so its last hashes are announced by
// every prompt's chunk and removed with each: the bridge must count them.
func TestEviction(t *testing.T) {
	for _, tc := range []struct{ cpu, chunk int }{{0, 0}, {24, 0}, {24, 4}} {
		cpu := tc.cpu
		t.Run(fmt.Sprintf("cpu%d-chunk%d", tc.cpu, tc.chunk), func(t *testing.T) {
			r := startRig(t, vllmsim.Config{Model: "Qwen/Qwen2.5-7B-Instruct", NumGPUBlocks: 40, NumCPUBlocks: cpu,
				OffloadChunkBlocks: tc.chunk}, prompt.ChatML)
			for i, msgs := range prompts(8) {
				r.chat(r.model, msgs, 1+i%3*10)
				r.settle(r.oracle(r.model))
			}
			st := r.sub.Stats()
			if st.Removed == 0 {
				t.Fatalf("nothing was evicted: %+v", st)
			}
			if cpu > 0 && len(r.sink.tier(snapshot.TierCPU)) == 0 {
				t.Fatal("nothing reached the CPU tier")
			}
		})
	}
}

// TestResetKeepsOffloadedCopies: /reset_prefix_cache clears the GPU pool
// and sends AllBlocksCleared, but offloaded copies stay, and the bridge
// keeps them; ?reset_external=true removes those too, one by one.
func TestResetKeepsOffloadedCopies(t *testing.T) {
	for _, chunk := range []int{0, 4} {
		t.Run(fmt.Sprintf("chunk%d", chunk), func(t *testing.T) {
			r := startRig(t, vllmsim.Config{Model: "Qwen/Qwen2.5-7B-Instruct", NumGPUBlocks: 40, NumCPUBlocks: 64,
				OffloadChunkBlocks: chunk}, prompt.ChatML)
			for _, msgs := range prompts(8) { // more than the GPU holds: evictions fill the legacy tier
				r.chat(r.model, msgs, 1)
			}
			r.settle(r.oracle(r.model))
			if !r.eng.ResetPrefixCache(false) {
				t.Fatal("reset refused")
			}
			want := r.oracle(r.model)
			if len(want[snapshot.TierGPU]) != 0 || len(want[snapshot.TierCPU]) == 0 {
				t.Fatalf("after the reset the engine holds %d GPU and %d CPU text blocks; want only CPU ones",
					len(want[snapshot.TierGPU]), len(want[snapshot.TierCPU]))
			}
			r.settle(want)
			if !r.eng.ResetPrefixCache(true) {
				t.Fatal("external reset refused")
			}
			r.settle(map[snapshot.Tier][]uint64{snapshot.TierGPU: {}, snapshot.TierCPU: {}})
		})
	}
}

// TestReuseReports: with kv_cache_report_mode "full" the engine announces
// the prefix blocks a request reuses again; the bridge takes them as the
// copies it holds (a set sink fails on a second Add), and one removal
// still takes a block away.
func TestReuseReports(t *testing.T) {
	r := startRig(t, vllmsim.Config{Model: "Qwen/Qwen2.5-7B-Instruct", NumGPUBlocks: 40}, prompt.ChatML)
	full := map[string]any{"vllm_xargs": map[string]any{"kv_cache_report_mode": "full"}}
	for _, msgs := range prompts(6) {
		for range 2 {
			r.chatWith(r.model, msgs, 1, full)
		}
		r.settle(r.oracle(r.model))
	}
	if st := r.sub.Stats(); st.Stored <= st.Batches/2 || st.Removed == 0 {
		t.Fatalf("want reuse reports and evictions: %+v", st)
	}
}

// TestResetAndRestart: /reset_prefix_cache clears the engine's text
// blocks; a restarted engine (sequence numbers from 0, an empty cache, no
// event saying so) is noticed and cleared, then followed again.
func TestResetAndRestart(t *testing.T) {
	r := startRig(t, vllmsim.Config{Model: "Qwen/Qwen2.5-7B-Instruct", NumGPUBlocks: 256}, prompt.ChatML)
	ps := prompts(3)
	r.chat(r.model, ps[0], 1)
	r.settle(r.oracle(r.model))
	if !r.eng.ResetPrefixCache(false) {
		t.Fatal("reset refused")
	}
	r.settle(map[snapshot.Tier][]uint64{snapshot.TierGPU: {}, snapshot.TierCPU: {}})
	r.chat(r.model, ps[1], 1)
	r.settle(r.oracle(r.model))

	if err := r.eng.Restart(); err != nil {
		t.Fatal(err)
	}
	r.settle(map[snapshot.Tier][]uint64{snapshot.TierGPU: {}, snapshot.TierCPU: {}})
	r.chat(r.model, ps[2], 1)
	r.settle(r.oracle(r.model))
	if st := r.sub.Stats(); st.Resets[kvevents.Restart]+st.Resets[kvevents.Unverified] == 0 {
		t.Fatalf("no reset after the restart: %+v", st)
	}
}

// TestMissedBatches: batches sent while the subscriber was away come from
// the replay socket, whether the same subscriber resumes or a new cachesync
// starts; with a replay buffer too short, what is rebuilt is never wrong.
func TestMissedBatches(t *testing.T) {
	t.Run("resume", func(t *testing.T) {
		r := startRig(t, vllmsim.Config{Model: "Qwen/Qwen2.5-7B-Instruct", NumGPUBlocks: 64}, prompt.ChatML)
		ps := prompts(6)
		r.chat(r.model, ps[0], 1)
		r.settle(r.oracle(r.model))
		r.stop()
		for _, msgs := range ps[1:] {
			r.chat(r.model, msgs, 5)
		}
		r.resume()
		r.settle(r.oracle(r.model))
		if st := r.sub.Stats(); st.Replayed == 0 || st.Resets != [len(st.Resets)]uint64{} {
			t.Fatalf("stats %+v", st)
		}
	})
	t.Run("new cachesync", func(t *testing.T) {
		r := startRig(t, vllmsim.Config{Model: "Qwen/Qwen2.5-7B-Instruct", NumGPUBlocks: 64}, prompt.ChatML)
		r.stop()
		for _, msgs := range prompts(5) {
			r.chat(r.model, msgs, 5)
		}
		r.sub = nil
		r.follow()
		r.settle(r.oracle(r.model))
	})
	t.Run("short buffer", func(t *testing.T) {
		cfg := vllmsim.Config{Model: "Qwen/Qwen2.5-7B-Instruct", NumGPUBlocks: 64}
		cfg.KVEvents.BufferSteps = 2
		r := startRig(t, cfg, prompt.ChatML)
		r.stop()
		for _, msgs := range prompts(5) {
			r.chat(r.model, msgs, 20)
		}
		r.sub = nil
		r.follow()
		// Only the last batches can be had: their blocks whose parents came
		// earlier are skipped, and what is held is a subset of the truth.
		want := r.oracle(r.model)[snapshot.TierGPU]
		deadline := time.Now().Add(10 * time.Second)
		for r.bridge.Stats().Skipped[SkipUnknownParent] == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("nothing skipped: %+v", r.bridge.Stats())
			}
			time.Sleep(10 * time.Millisecond)
		}
		for _, h := range r.sink.tier(snapshot.TierGPU) {
			if _, ok := slices.BinarySearch(want, h); !ok {
				t.Fatalf("the bridge holds %x, which the engine does not", h)
			}
		}
		// New traffic is followed in full again.
		r.eng.ResetPrefixCache(false)
		r.chat(r.model, prompts(7)[6], 1)
		r.settle(r.oracle(r.model))
	})
}

// TestEncodings: every event encoding vLLM has shipped, with integer or
// byte hashes, leads to the same text blocks; the data-parallel rank comes
// through.
func TestEncodings(t *testing.T) {
	var first []uint64
	for _, tt := range []struct {
		name     string
		enc      vllmsim.Encoding
		batchMap bool
		bytes    bool
	}{
		{"map", vllmsim.EncodingMap, false, false},
		{"array", vllmsim.EncodingArray, false, false},
		{"array-legacy", vllmsim.EncodingArrayLegacy, false, false},
		{"batch-map", vllmsim.EncodingMap, true, false},
		{"map-bytes", vllmsim.EncodingMap, false, true},
		{"array-bytes", vllmsim.EncodingArray, false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := startRig(t, vllmsim.Config{Model: "Qwen/Qwen2.5-7B-Instruct", NumGPUBlocks: 40, Encoding: tt.enc, BatchAsMap: tt.batchMap,
				BytesHashes: tt.bytes, ReplayWithoutTopic: tt.enc != vllmsim.EncodingMap, DataParallelRank: 3}, prompt.ChatML)
			for _, msgs := range prompts(4) {
				r.chat(r.model, msgs, 3)
			}
			want := r.oracle(r.model)
			r.settle(want)
			if first == nil {
				first = want[snapshot.TierGPU]
			} else if !slices.Equal(first, want[snapshot.TierGPU]) {
				t.Fatal("the same requests left other text blocks")
			}
			r.handler.rank.mu.Lock()
			rank := r.handler.rank.v
			r.handler.rank.mu.Unlock()
			if rank != 3 {
				t.Fatalf("data-parallel rank %d, want 3", rank)
			}
		})
	}
}

// complete sends a completions request of token ids and waits for it.
func (r *rig) complete(tokens []int) {
	r.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": r.model, "prompt": tokens, "max_tokens": 1})
	resp, err := http.Post(r.eng.URL()+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		r.t.Fatalf("completion: %s", resp.Status)
	}
	r.observe()
}

// TestSharedChunkHashes: vLLM 0.33's offloading connector announces the
// hashes of a shared prefix that ends inside a chunk once per chunk that
// holds them, and an evicted chunk removes them once: the copies another
// chunk still holds stay in the index.
func TestSharedChunkHashes(t *testing.T) {
	// 16-token blocks, 4-block chunks, room for 3 chunks in the CPU tier.
	r := startRig(t, vllmsim.Config{Model: "Qwen/Qwen2.5-7B-Instruct", NumGPUBlocks: 256, NumCPUBlocks: 12,
		OffloadChunkBlocks: 4}, prompt.ChatML)
	ids := func(from, n int) []int {
		var out []int
		for i := range n {
			out = append(out, 1000+from+i)
		}
		return out
	}
	shared := ids(0, 6*16) // six blocks: chunk 0 and half of chunk 1
	a := append(append([]int{}, shared...), ids(5000, 2*16)...)
	b := append(append([]int{}, shared...), ids(7000, 2*16)...)
	r.complete(a) // chunks a0, a1
	r.complete(b) // b0 = a0; b1 announces shared blocks 4 and 5 again
	r.settle(r.oracle(r.model))
	r.complete(ids(9000, 4*16)) // a fourth chunk evicts a1, the least recently used
	want := r.oracle(r.model)
	r.settle(want)
	if st := r.sub.Stats(); st.Removed == 0 {
		t.Fatalf("no chunk was evicted: %+v", st)
	}
}
