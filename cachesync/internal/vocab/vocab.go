// Package vocab maps a model's token ids back to the exact bytes of the text
// they were cut from.
//
// cachesync learns from engine events which token blocks an engine caches,
// while the filter hashes text. Decoding the tokens with the model's own
// vocabulary gives back the text the engine tokenized, and so the filter's
// text-block hashes. What is wanted is that original text, not what a
// tokenizer's decode prints: bytes are never replaced by U+FFFD (a block may
// end inside a character), special tokens decode to their literal content
// (chat templates write them as text), and the space a SentencePiece
// tokenizer puts before the text, or before each segment between special
// tokens, is taken off again (see State).
//
// Vocabularies come from a HuggingFace tokenizer.json (byte-level BPE as in
// GPT-2, Llama 3 and Qwen; SentencePiece-style BPE or Unigram with '▁' for
// space and <0xNN> byte-fallback tokens as in Llama 2, Mistral and Gemma),
// from a tiktoken file, or built in (cl100k_base, o200k_base, p50k_base,
// r50k_base, from github.com/pkoukk/tiktoken-go-loader, offline).
package vocab

import (
	"errors"
	"fmt"
	"math"
	"strconv"
)

// ErrUnknownToken reports a token id the vocabulary does not have: the
// engine serves another model than the vocabulary was loaded for.
var ErrUnknownToken = errors.New("vocab: unknown token id")

// State is what decoding the next token depends on from the tokens before
// it: how many leading spaces of its text the tokenizer inserted and
// decoding must drop. It is always below 16. The zero State is the middle
// of a text after an ordinary token.
type State uint8

// MaxState bounds every State a Vocab returns.
const MaxState State = 15

const (
	flagKnown = 1 << iota
	flagSplit // an added token that starts a new segment (it is matched before normalization)
)

// Vocab is a loaded vocabulary. It is immutable and safe for concurrent use.
type Vocab struct {
	name  string
	data  []byte   // the bytes of every token, back to back
	off   []uint32 // token id's bytes are data[off[id]:off[id+1]]
	flags []uint8  // per id

	// start is the State at the beginning of a text: the dummy-prefix
	// spaces the tokenizer adds there. segment is the State after an
	// added token that splits the text, when the tokenizer adds the prefix
	// to every segment.
	start, segment State
}

// Name returns the name the vocabulary was loaded under.
func (v *Vocab) Name() string { return v.name }

// Len returns one more than the largest token id.
func (v *Vocab) Len() int { return len(v.flags) }

// Start returns the State at the beginning of a text.
func (v *Vocab) Start() State { return v.start }

// Token returns the bytes of one token, and false for an unknown id. The
// slice aliases the vocabulary and must not be modified.
func (v *Vocab) Token(id uint32) ([]byte, bool) {
	if int64(id) >= int64(len(v.flags)) || v.flags[id]&flagKnown == 0 {
		return nil, false
	}
	return v.data[v.off[id]:v.off[id+1]:v.off[id+1]], true
}

// AppendBytes appends the text of ids to dst as in the middle of a text, and
// returns the extended slice. It does not allocate when dst has room. On
// error dst holds the text of the tokens before the unknown one.
func (v *Vocab) AppendBytes(dst []byte, ids []uint32) ([]byte, error) {
	dst, _, err := v.Append(dst, 0, ids)
	return dst, err
}

// Append appends the text of ids to dst, decoding from state st (Start() at
// the beginning of a text), and returns the extended slice and the State
// after the last token, which decoding the tokens that follow takes.
func (v *Vocab) Append(dst []byte, st State, ids []uint32) ([]byte, State, error) {
	data, off, flags := v.data, v.off, v.flags
	for _, id := range ids {
		if int64(id) >= int64(len(flags)) || flags[id]&flagKnown == 0 {
			return dst, st, fmt.Errorf("%w %d (vocabulary %s has %d ids)", ErrUnknownToken, id, v.name, len(flags))
		}
		b := data[off[id]:off[id+1]]
		for st > 0 && len(b) > 0 {
			if b[0] != ' ' {
				st = 0
				break
			}
			b = b[1:]
			st--
		}
		dst = append(dst, b...)
		if flags[id]&flagSplit != 0 {
			st = v.segment
		}
	}
	return dst, st, nil
}

// builder collects tokens by id.
type builder struct {
	name   string
	tokens [][]byte // nil: unknown id
	split  []bool
}

func (b *builder) set(id uint32, tok []byte, split bool) error {
	if id >= math.MaxInt32 {
		return fmt.Errorf("vocab %s: token id %d is too large", b.name, id)
	}
	for int(id) >= len(b.tokens) {
		b.tokens = append(b.tokens, nil)
		b.split = append(b.split, false)
	}
	if tok == nil {
		tok = []byte{}
	}
	b.tokens[id], b.split[id] = tok, split
	return nil
}

func (b *builder) build(start, segment State) (*Vocab, error) {
	if len(b.tokens) == 0 {
		return nil, fmt.Errorf("vocab %s: no tokens", b.name)
	}
	if start > MaxState || segment > MaxState {
		return nil, fmt.Errorf("vocab %s: strips %d leading spaces, at most %d supported", b.name, max(start, segment), MaxState)
	}
	n := 0
	for _, t := range b.tokens {
		n += len(t)
	}
	if n > math.MaxUint32 {
		return nil, fmt.Errorf("vocab %s: %d bytes of tokens", b.name, n)
	}
	v := &Vocab{
		name:    b.name,
		data:    make([]byte, 0, n),
		off:     make([]uint32, len(b.tokens)+1),
		flags:   make([]uint8, len(b.tokens)),
		start:   start,
		segment: segment,
	}
	for id, t := range b.tokens {
		if t != nil {
			v.flags[id] |= flagKnown
		}
		if b.split[id] {
			v.flags[id] |= flagSplit
		}
		v.data = append(v.data, t...)
		v.off[id+1] = uint32(len(v.data))
	}
	return v, nil
}

// String describes the vocabulary for logs.
func (v *Vocab) String() string {
	return "vocab " + strconv.Quote(v.name) + " (" + strconv.Itoa(len(v.flags)) + " ids)"
}
