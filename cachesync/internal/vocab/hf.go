package vocab

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// ErrUnsupported reports a tokenizer.json whose model or decoder kvroute
// cannot invert exactly.
var ErrUnsupported = errors.New("vocab: unsupported tokenizer")

// hfFile is the part of a HuggingFace tokenizer.json that decoding needs.
type hfFile struct {
	AddedTokens []struct {
		ID         uint32 `json:"id"`
		Content    string `json:"content"`
		Special    bool   `json:"special"`
		Normalized *bool  `json:"normalized"`
	} `json:"added_tokens"`
	Normalizer   *hfComponent `json:"normalizer"`
	PreTokenizer *hfComponent `json:"pre_tokenizer"`
	Decoder      *hfComponent `json:"decoder"`
	Model        struct {
		Type  string          `json:"type"`
		Vocab json.RawMessage `json:"vocab"`
	} `json:"model"`
}

// hfComponent is one normalizer, pre-tokenizer or decoder, or a Sequence of
// them; fields of the types kvroute reads.
type hfComponent struct {
	Type          string         `json:"type"`
	Decoders      []*hfComponent `json:"decoders"`
	Normalizers   []*hfComponent `json:"normalizers"`
	Pretokenizers []*hfComponent `json:"pretokenizers"`
	Pattern       struct {
		String *string `json:"String"`
		Regex  *string `json:"Regex"`
	} `json:"pattern"`
	Content        string  `json:"content"`
	Prepend        string  `json:"prepend"`
	Replacement    *string `json:"replacement"`
	PrependScheme  string  `json:"prepend_scheme"`
	AddPrefixSpace *bool   `json:"add_prefix_space"`
	Start          int     `json:"start"`
	Stop           int     `json:"stop"`
}

// ParseTokenizerJSON loads the vocabulary of a HuggingFace tokenizer.json.
// name labels it in errors and logs.
func ParseTokenizerJSON(name string, data []byte) (*Vocab, error) {
	var f hfFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("vocab %s: tokenizer.json: %w", name, err)
	}
	dec, err := newDecoder(f.Decoder)
	if err != nil {
		return nil, fmt.Errorf("vocab %s: %w", name, err)
	}
	b := &builder{name: name}
	switch f.Model.Type {
	case "BPE", "":
		var m map[string]uint32
		if err := json.Unmarshal(f.Model.Vocab, &m); err != nil {
			return nil, fmt.Errorf("vocab %s: model.vocab of a BPE model: %w", name, err)
		}
		for tok, id := range m {
			if err := b.set(id, dec.token(tok), false); err != nil {
				return nil, err
			}
		}
	case "Unigram":
		var pieces [][2]json.RawMessage
		if err := json.Unmarshal(f.Model.Vocab, &pieces); err != nil {
			return nil, fmt.Errorf("vocab %s: model.vocab of a Unigram model: %w", name, err)
		}
		for id, p := range pieces {
			var tok string
			if err := json.Unmarshal(p[0], &tok); err != nil {
				return nil, fmt.Errorf("vocab %s: Unigram piece %d: %w", name, id, err)
			}
			if err := b.set(uint32(id), dec.token(tok), false); err != nil {
				return nil, err
			}
		}
	default:
		return nil, fmt.Errorf("vocab %s: %w: model type %q (want BPE or Unigram)", name, ErrUnsupported, f.Model.Type)
	}
	for _, t := range f.AddedTokens {
		// An added token matched before normalization (the default for
		// special tokens) stands in the text literally and splits it into
		// segments; one matched after it is written in normalized form and
		// decodes like any token.
		normalized := !t.Special
		if t.Normalized != nil {
			normalized = *t.Normalized
		}
		tok := []byte(t.Content)
		if normalized {
			tok = dec.token(t.Content)
		}
		if err := b.set(t.ID, tok, !normalized); err != nil {
			return nil, err
		}
	}
	start, segment, err := prefixSpaces(&f, dec)
	if err != nil {
		return nil, fmt.Errorf("vocab %s: %w", name, err)
	}
	return b.build(start, segment)
}

// decoder turns one token string into its bytes: the per-token steps of a
// tokenizer.json decoder pipeline. Fuse is implicit (bytes are
// concatenated); Strip at the start of the text is kept in strip.
type decoder struct {
	steps []func([]byte) []byte
	strip int // leading spaces the decoder drops at the start of a text
	space string
}

// newDecoder reads a decoder pipeline, rejecting what cannot be inverted.
func newDecoder(c *hfComponent) (*decoder, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: no decoder, so the text of tokens is unknown", ErrUnsupported)
	}
	d := &decoder{}
	fused := false
	var walk func(c *hfComponent) error
	walk = func(c *hfComponent) error {
		if c == nil {
			return fmt.Errorf("%w: null decoder step", ErrUnsupported)
		}
		switch c.Type {
		case "Sequence":
			for _, s := range c.Decoders {
				if err := walk(s); err != nil {
					return err
				}
			}
		case "ByteLevel":
			d.steps = append(d.steps, byteLevel)
		case "ByteFallback":
			d.steps = append(d.steps, byteFallback)
		case "Fuse":
			fused = true
		case "Replace":
			if c.Pattern.String == nil {
				return fmt.Errorf("%w: Replace decoder with a regex pattern", ErrUnsupported)
			}
			old, nw := []byte(*c.Pattern.String), []byte(c.Content)
			if len(old) == 0 {
				return fmt.Errorf("%w: Replace decoder with an empty pattern", ErrUnsupported)
			}
			if c.Content == " " {
				d.space = *c.Pattern.String
			}
			d.steps = append(d.steps, func(b []byte) []byte { return bytes.ReplaceAll(b, old, nw) })
		case "Metaspace":
			rep := replacement(c)
			d.space = rep
			old := []byte(rep)
			d.steps = append(d.steps, func(b []byte) []byte { return bytes.ReplaceAll(b, old, []byte{' '}) })
			if prepends(c) != "never" {
				d.strip = 1
			}
		case "Strip":
			// Strip cuts characters off every token it sees; after Fuse
			// there is one token, the whole text, so it only touches the
			// start of the text, which is what kvroute can reproduce.
			if !fused {
				return fmt.Errorf("%w: Strip decoder before Fuse (strips every token)", ErrUnsupported)
			}
			if c.Content != " " || c.Stop != 0 || c.Start < 0 {
				return fmt.Errorf("%w: Strip decoder (content %q, start %d, stop %d): only leading spaces", ErrUnsupported, c.Content, c.Start, c.Stop)
			}
			d.strip = c.Start
		default:
			return fmt.Errorf("%w: decoder %q", ErrUnsupported, c.Type)
		}
		return nil
	}
	if err := walk(c); err != nil {
		return nil, err
	}
	return d, nil
}

// token returns the bytes of one token string.
func (d *decoder) token(s string) []byte {
	b := []byte(s)
	for _, f := range d.steps {
		b = f(b)
	}
	return b
}

// replacement returns a Metaspace component's space character.
func replacement(c *hfComponent) string {
	if c.Replacement != nil {
		return *c.Replacement
	}
	return "▁"
}

// prepends returns where a Metaspace component adds its replacement:
// "always", "first" or "never". Files written before prepend_scheme have
// add_prefix_space, which meant always.
func prepends(c *hfComponent) string {
	switch {
	case c.PrependScheme != "":
		return c.PrependScheme
	case c.AddPrefixSpace != nil && !*c.AddPrefixSpace:
		return "never"
	}
	return "always"
}

// prefixSpaces works out the dummy-prefix spaces decoding must drop: at the
// start of a text (the decoder's own Strip, or a Metaspace decoder) and at
// the start of each segment after a splitting added token, where a Prepend
// normalizer, a Metaspace pre-tokenizer that prepends always, or a ByteLevel
// pre-tokenizer with add_prefix_space puts one.
func prefixSpaces(f *hfFile, d *decoder) (start, segment State, err error) {
	per := 0
	var normalizers func(c *hfComponent)
	normalizers = func(c *hfComponent) {
		if c == nil {
			return
		}
		for _, s := range c.Normalizers {
			normalizers(s)
		}
		if c.Type == "Prepend" && c.Prepend != "" && (c.Prepend == d.space || c.Prepend == " ") {
			per = 1
		}
	}
	normalizers(f.Normalizer)
	var pre func(c *hfComponent)
	pre = func(c *hfComponent) {
		if c == nil {
			return
		}
		for _, s := range c.Pretokenizers {
			pre(s)
		}
		switch c.Type {
		case "Metaspace":
			switch prepends(c) {
			case "always":
				per = 1
			case "first":
				d.strip = max(d.strip, 1)
			}
		case "ByteLevel":
			if c.AddPrefixSpace != nil && *c.AddPrefixSpace {
				per = 1
			}
		}
	}
	pre(f.PreTokenizer)
	if d.strip > int(MaxState) {
		return 0, 0, fmt.Errorf("%w: Strip decoder drops %d leading spaces", ErrUnsupported, d.strip)
	}
	return State(max(d.strip, per)), State(per), nil
}

// byteLevel maps a GPT-2 byte-level token string back to bytes. A token with
// a character outside the map (an added token written as plain text) stays
// as it is, as HuggingFace's ByteLevel decoder does.
func byteLevel(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for s := b; len(s) > 0; {
		r, n := utf8.DecodeRune(s)
		if int(r) >= len(unicodeToByte) || unicodeToByte[r] < 0 {
			return b
		}
		out = append(out, byte(unicodeToByte[r]))
		s = s[n:]
	}
	return out
}

// unicodeToByte inverts GPT-2's bytes_to_unicode: printable Latin-1 bytes
// stand for themselves, the other 68 bytes for U+0100 onwards in order.
var unicodeToByte = func() [324]int16 {
	var m [324]int16
	for i := range m {
		m[i] = -1
	}
	n := 0
	for b := 0; b < 256; b++ {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE {
			m[b] = int16(b)
			continue
		}
		m[256+n] = int16(b)
		n++
	}
	return m
}()

// byteFallback turns a <0xNN> token into its byte.
func byteFallback(b []byte) []byte {
	if len(b) != 6 || b[0] != '<' || b[1] != '0' || b[2] != 'x' || b[5] != '>' {
		return b
	}
	hi, ok1 := hexDigit(b[3])
	lo, ok2 := hexDigit(b[4])
	if !ok1 || !ok2 {
		return b
	}
	return []byte{hi<<4 | lo}
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}
