package vllmsim

import (
	"container/list"
	"fmt"
	"sync"

	"github.com/pkoukk/tiktoken-go"
	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"
)

// vocabSize is the number of ordinary tokens in cl100k_base (ids 0..100255);
// the special tokens above them are never produced by encode here.
const vocabSize = 100256

// The stand-in vocabulary is shared by every engine in the process: loading
// it takes a while and it is read-only afterwards.
var (
	cl100kOnce sync.Once
	cl100k     *tiktoken.Tiktoken
	cl100kErr  error
	filler     []int // the generated text, repeated: real tokens that decode to whole characters
)

const fillerText = " The quick brown fox jumps over the lazy dog."

// fillerToken returns the i-th generated token.
func fillerToken(i int) int { return filler[i%len(filler)] }

// tokenizer is the engine's BPE vocabulary: cl100k_base, loaded offline,
// standing in for whatever model is served. Chat-template special strings
// such as "<|im_start|>" are encoded as ordinary text, so decode(encode(s))
// is exactly s for every valid UTF-8 string s.
type tokenizer struct{ enc *tiktoken.Tiktoken }

// encodings remembers recent prompts' tokens, shared by every engine in the
// process. Tokenising costs the simulator real CPU that no simulated clock
// accounts for (about 200k tokens/s per core), and benchmark workloads send
// the same few hundred prompts again and again; a real engine's time for it
// is in the cost model's step, not here.
var encodings = newEncodingCache(1024)

type encodingCache struct {
	mu    sync.Mutex
	max   int
	byKey map[string]*list.Element
	lru   list.List // of *cachedEncoding, most recent first
}

type cachedEncoding struct {
	text string
	ids  []int
}

func newEncodingCache(max int) *encodingCache {
	return &encodingCache{max: max, byKey: map[string]*list.Element{}}
}

// encode returns the tokens of s, which the caller must not change.
func (c *encodingCache) encode(t tokenizer, s string) []int {
	if len(s) < 1024 {
		return t.enc.EncodeOrdinary(s) // cheap enough; keeps the cache for long prompts
	}
	c.mu.Lock()
	if el, ok := c.byKey[s]; ok {
		c.lru.MoveToFront(el)
		ids := el.Value.(*cachedEncoding).ids
		c.mu.Unlock()
		return ids
	}
	c.mu.Unlock()
	ids := t.enc.EncodeOrdinary(s)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byKey[s]; !ok {
		c.byKey[s] = c.lru.PushFront(&cachedEncoding{s, ids})
		if c.lru.Len() > c.max {
			old := c.lru.Remove(c.lru.Back()).(*cachedEncoding)
			delete(c.byKey, old.text)
		}
	}
	return ids
}

func loadTokenizer() (tokenizer, error) {
	cl100kOnce.Do(func() {
		tiktoken.SetBpeLoader(tiktokenloader.NewOfflineLoader())
		cl100k, cl100kErr = tiktoken.GetEncoding("cl100k_base")
		if cl100kErr == nil {
			filler = cl100k.EncodeOrdinary(fillerText)
		}
	})
	if cl100kErr != nil {
		return tokenizer{}, fmt.Errorf("vllmsim: load cl100k_base: %w", cl100kErr)
	}
	return tokenizer{cl100k}, nil
}

// encode returns the tokens of s. The slice may be shared: do not change it.
func (t tokenizer) encode(s string) []int { return encodings.encode(t, s) }

func (t tokenizer) decode(ids []int) string { return t.enc.Decode(ids) }

// validate reports the first id outside the ordinary vocabulary.
func (t tokenizer) validate(ids []int) error {
	for _, id := range ids {
		if id < 0 || id >= vocabSize {
			return fmt.Errorf("token id %d is out of vocabulary", id)
		}
	}
	return nil
}
