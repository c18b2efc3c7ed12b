package bridge

import (
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/kvroute/kvroute/cachesync/internal/kvevents"
	"github.com/kvroute/kvroute/cachesync/internal/vocab"
	"github.com/kvroute/kvroute/shared/blockhash"
	"github.com/kvroute/kvroute/shared/snapshot"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// tinyTokens is a small vocabulary in which one text has several
// tokenizations ("ab" or "a" "b"; "é" whole or as its two bytes).
var tinyTokens = []string{"a", "b", "ab", " ", "hello", "world", "\n", "xyz", "<|im_start|>", "é", "\xc3", "\xa9", "ba"}

func tinyVocab(t testing.TB) *vocab.Vocab {
	t.Helper()
	var b strings.Builder
	for i, s := range tinyTokens {
		fmt.Fprintf(&b, "%s %d\n", base64.StdEncoding.EncodeToString([]byte(s)), i)
	}
	v, err := vocab.ParseTiktoken("tiny", []byte(b.String()), nil)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func tinyText(ids []uint32) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(tinyTokens[id])
	}
	return b.String()
}

type tierHash struct {
	h    uint64
	tier snapshot.Tier
}

// setSink holds what an engine holds, and fails the test on an Add of what
// it holds or a Remove of what it does not: the bridge's reference counts
// must make both impossible.
type setSink struct {
	t      testing.TB
	set    map[tierHash]bool
	clears int
}

func newSetSink(t testing.TB) *setSink { return &setSink{t: t, set: map[tierHash]bool{}} }

func (s *setSink) Add(h uint64, t snapshot.Tier) {
	if s.set[tierHash{h, t}] {
		s.t.Errorf("Add(%x, %v) of a held block", h, t)
	}
	s.set[tierHash{h, t}] = true
}

func (s *setSink) Remove(h uint64, t snapshot.Tier) {
	if !s.set[tierHash{h, t}] {
		s.t.Errorf("Remove(%x, %v) of a block not held", h, t)
	}
	delete(s.set, tierHash{h, t})
}

func (s *setSink) Clear() {
	clear(s.set)
	s.clears++
}

func (s *setSink) tier(t snapshot.Tier) []uint64 {
	var out []uint64
	for k := range s.set {
		if k.tier == t {
			out = append(out, k.h)
		}
	}
	slices.Sort(out)
	return out
}

// model is a reference engine: blocks of tokens chained to parents, held
// in media, and the events it sends, by vLLM 0.33's rules: a GPU copy is
// held or not (reuse reports announce it again), a lower tier's copy counts
// its announcements (one per offloaded chunk holding it), and
// AllBlocksCleared clears the GPU only.
type model struct {
	blockSize int
	model     string
	blocks    map[uint64]*mblock
	events    []kvevents.Event
	epoch     int // AllBlocksCleared sent so far
}

type mblock struct {
	hash, parent uint64
	hasParent    bool
	tokens       []uint32
	lora         string
	media        map[string]int // announcements held, by medium; the GPU's is 0 or 1
	epoch        int            // of its last store: an engine offloads only blocks it had since its last clear
}

func newModel(blockSize int, name string) *model {
	return &model{blockSize: blockSize, model: name, blocks: map[uint64]*mblock{}}
}

// hashOf is the engine's chained hash of a block.
func hashOf(parent uint64, tokens []uint32, lora string) uint64 {
	var d xxhash.Digest
	fmt.Fprint(&d, parent, tokens, lora)
	return d.Sum64()
}

// store caches a chain of full blocks after parent (0: the root) in medium
// and returns their hashes; it sends one BlockStored for the blocks not
// yet held there, as vLLM does.
func (m *model) store(parent uint64, tokens []uint32, medium, lora string) []uint64 {
	ev := kvevents.Event{Kind: kvevents.BlockStored, BlockSize: m.blockSize, Medium: medium, LoRAName: lora}
	var hashes []uint64
	p := parent
	flush := func() {
		if len(ev.Hashes) > 0 {
			m.events = append(m.events, ev)
		}
		ev = kvevents.Event{Kind: kvevents.BlockStored, BlockSize: m.blockSize, Medium: medium, LoRAName: lora}
	}
	for i := 0; i+m.blockSize <= len(tokens); i += m.blockSize {
		tok := tokens[i : i+m.blockSize]
		h := hashOf(p, tok, lora)
		hashes = append(hashes, h)
		b := m.blocks[h]
		if b == nil {
			b = &mblock{hash: h, parent: p, hasParent: p != 0, tokens: tok, lora: lora, media: map[string]int{}}
			m.blocks[h] = b
		}
		if b.media[medium] > 0 {
			flush()
		} else {
			b.media[medium], b.epoch = 1, m.epoch
			if len(ev.Hashes) == 0 {
				ev.Parent, ev.HasParent = p, p != 0
			}
			ev.Hashes = append(ev.Hashes, h)
			ev.Tokens = append(ev.Tokens, tok...)
		}
		p = h
	}
	flush()
	return hashes
}

// offload announces a copy of a held block in a lower tier, as vLLM's
// offloading connector does once per chunk holding it: the hash, no
// tokens (its legacy payload). Each announcement is removed on its own.
func (m *model) offload(h uint64, medium string) {
	b := m.blocks[h]
	if b.epoch != m.epoch {
		return
	}
	b.media[medium]++
	m.events = append(m.events, kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{h}, BlockSize: m.blockSize, Medium: medium})
}

// reuse announces GPU blocks again as vLLM's block pool does for prefix
// hits: the state does not change.
func (m *model) reuse(h uint64) {
	b := m.blocks[h]
	if b == nil || b.media["GPU"] == 0 {
		return
	}
	m.events = append(m.events, kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{h}, Parent: b.parent, HasParent: b.hasParent,
		Tokens: b.tokens, BlockSize: m.blockSize, Medium: "GPU", LoRAName: b.lora})
}

// remove removes one copy (the GPU's) or one announcement (a lower tier's).
func (m *model) remove(h uint64, medium string) {
	if b := m.blocks[h]; b != nil && b.media[medium] > 0 {
		if b.media[medium]--; b.media[medium] == 0 {
			delete(b.media, medium)
		}
		m.events = append(m.events, kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []uint64{h}, Medium: medium})
	}
}

// clearGPU is vLLM's /reset_prefix_cache: the GPU pool's hashes go,
// offloaded copies stay.
func (m *model) clearGPU() {
	for _, b := range m.blocks {
		delete(b.media, "GPU")
	}
	m.epoch++
	m.events = append(m.events, kvevents.Event{Kind: kvevents.AllBlocksCleared})
}

// flush hands the queued events to the engine as one batch.
func (m *model) flush(e *Engine) {
	e.Batch(&kvevents.Batch{Events: m.events})
	m.events = nil
}

// tokensTo returns the tokens of the chain ending with h.
func (m *model) tokensTo(h uint64) []uint32 {
	var chain [][]uint32
	for b := m.blocks[h]; ; b = m.blocks[b.parent] {
		chain = append(chain, b.tokens)
		if !b.hasParent {
			break
		}
	}
	var out []uint32
	for i := len(chain) - 1; i >= 0; i-- {
		out = append(out, chain[i]...)
	}
	return out
}

// want returns, per tier, the text blocks the filter would find held:
// for every held block, the text blocks that end inside it, computed with
// blockhash.Append over the whole text of its chain.
func (m *model) want(decode func([]uint32) string, cfg blockhash.Config) map[snapshot.Tier][]uint64 {
	out := map[snapshot.Tier]map[uint64]bool{snapshot.TierGPU: {}, snapshot.TierCPU: {}}
	for h, b := range m.blocks {
		if len(b.media) == 0 {
			continue
		}
		name := m.model
		if b.lora != "" {
			name = b.lora
		}
		seed := blockhash.Seed(name, "")
		all := m.tokensTo(h)
		before := blockhash.Append(nil, seed, []byte(decode(all[:len(all)-len(b.tokens)])), cfg)
		through := blockhash.Append(nil, seed, []byte(decode(all)), cfg)
		for medium := range b.media {
			tier := snapshot.TierCPU
			if medium == "GPU" || medium == "" {
				tier = snapshot.TierGPU
			}
			for _, x := range through[len(before):] {
				out[tier][x] = true
			}
		}
	}
	res := map[snapshot.Tier][]uint64{}
	for tier, set := range out {
		for x := range set {
			res[tier] = append(res[tier], x)
		}
		slices.Sort(res[tier])
	}
	return res
}

// check compares the sink with what the model holds.
func check(t *testing.T, m *model, s *setSink, decode func([]uint32) string, cfg blockhash.Config) {
	t.Helper()
	want := m.want(decode, cfg)
	for _, tier := range []snapshot.Tier{snapshot.TierGPU, snapshot.TierCPU} {
		if got := s.tier(tier); !slices.Equal(got, want[tier]) {
			t.Fatalf("%v tier holds %d text blocks, want %d (%s)", tier, len(got), len(want[tier]), diff(got, want[tier]))
		}
	}
}

func newEngine(t testing.TB, cfg Config, s Sink) *Engine {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = discard()
	}
	e, err := New(cfg, s)
	if err != nil {
		t.Fatal(err)
	}
	return e
}
