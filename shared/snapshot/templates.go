package snapshot

import (
	"bytes"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// ChatTemplate is the source of a chat template the engines of a model
// render with and kvroute has no name for (an endpoint whose Template is
// prompt.Custom), shipped so that gateways on chat_template auto render that
// model's requests as its engines do.
type ChatTemplate struct {
	Model  string // the served model name
	Source string // the Jinja source
	// Special holds the special token strings the template reads
	// (bos_token, eos_token, ...).
	Special map[string]string
}

// Bounds on the templates part. A chat template is a few KiB (the largest
// in llama.cpp's collection is 26 KiB); the bounds keep a hostile or broken
// cachesync from making every worker hold megabytes.
const (
	MaxChatTemplates   = 64
	MaxChatTemplateLen = 256 << 10
	maxSpecialTokens   = 16
	maxSpecialLen      = 255
)

func (t *ChatTemplate) validate() error {
	switch {
	case len(t.Model) == 0 || len(t.Model) > 255:
		return errors.New("snapshot: chat template's model name must have 1 to 255 bytes")
	case len(t.Source) == 0 || len(t.Source) > MaxChatTemplateLen:
		return errors.New("snapshot: chat template of " + t.Model + " must have 1 byte to 256 KiB")
	case len(t.Special) > maxSpecialTokens:
		return errors.New("snapshot: chat template of " + t.Model + " has too many special tokens")
	}
	for k, v := range t.Special {
		if len(k) == 0 || len(k) > maxSpecialLen || len(v) > maxSpecialLen {
			return errors.New("snapshot: chat template of " + t.Model + ": special token names and values must have at most 255 bytes")
		}
	}
	return nil
}

// SetChatTemplates replaces the chat templates the snapshot ships, at most
// one per model, in any order, and reports whether they changed: only then
// does the next Build write a new templates part.
func (b *Builder) SetChatTemplates(ts []ChatTemplate) (changed bool, err error) {
	if len(ts) > MaxChatTemplates {
		return false, errors.New("snapshot: more than " + strconv.Itoa(MaxChatTemplates) + " chat templates")
	}
	seen := map[string]bool{}
	for i := range ts {
		if err := ts[i].validate(); err != nil {
			return false, err
		}
		if seen[ts[i].Model] {
			return false, errors.New("snapshot: two chat templates for " + ts[i].Model)
		}
		seen[ts[i].Model] = true
	}
	sorted := slices.Clone(ts)
	slices.SortFunc(sorted, func(a, b ChatTemplate) int { return strings.Compare(a.Model, b.Model) })
	if slices.EqualFunc(sorted, b.templates, func(a, b ChatTemplate) bool {
		return a.Model == b.Model && a.Source == b.Source && maps.Equal(a.Special, b.Special)
	}) {
		return false, nil
	}
	b.templates, b.templatesChanged = sorted, true
	return true, nil
}

// appendTemplates encodes a templates part. Body:
//
//	24  4  template count N
//	28  4  reserved, 0
//	32  N  templates, each: the model name, the source, then a uint32
//	       count of special tokens and each token's name and value;
//	       every string a uint32 length and its bytes
//
// Special tokens are written sorted by name, so equal templates encode to
// equal bytes.
func appendTemplates(dst []byte, gen uint64, ts []ChatTemplate) []byte {
	start := len(dst)
	dst = appendHeader(dst, KindTemplates, gen)
	dst = le.AppendUint32(dst, uint32(len(ts)))
	dst = le.AppendUint32(dst, 0)
	str := func(s string) { dst = append(le.AppendUint32(dst, uint32(len(s))), s...) }
	for _, t := range ts {
		str(t.Model)
		str(t.Source)
		dst = le.AppendUint32(dst, uint32(len(t.Special)))
		for _, k := range slices.Sorted(maps.Keys(t.Special)) {
			str(k)
			str(t.Special[k])
		}
	}
	return finishPart(dst, start)
}

// templates is a checked templates part, read in place.
type templates struct {
	ref  ref
	body []byte // the entries
	n    int
}

// parseTemplates checks a templates part: framing, checksum and that every
// entry lies within it and keeps to the bounds SetChatTemplates enforces.
func parseTemplates(b []byte) (templates, error) {
	gen, err := checkPart(b, KindTemplates)
	if err != nil {
		return templates{}, err
	}
	if len(b) < headerSize+8+trailerSize {
		return templates{}, corrupt("templates: truncated")
	}
	n := le.Uint32(b[24:])
	if n > MaxChatTemplates || le.Uint32(b[28:]) != 0 {
		return templates{}, corrupt("templates: bad count or reserved bytes set")
	}
	t := templates{ref: partRef(b, int(n)), body: b[headerSize+8 : len(b)-trailerSize], n: int(n)}
	t.ref.gen = gen
	p := t.body
	var prev []byte
	for i := range t.n {
		var e templateEntry
		if p, e, err = nextTemplate(p); err != nil {
			return templates{}, err
		}
		if i > 0 && bytes.Compare(e.model, prev) <= 0 {
			return templates{}, corrupt("templates: models not sorted or repeated")
		}
		prev = e.model
	}
	if len(p) != 0 {
		return templates{}, corrupt("templates: bytes after the last template")
	}
	return t, nil
}

// templateEntry is one template as read from the part, in place: a
// refresh checks every entry without copying a source, and lookup copies
// only the one it returns.
type templateEntry struct {
	model, source []byte
	special       []byte // count, then name/value pairs, as encoded
	specials      int
}

func nextString(p []byte, limit int) (rest, s []byte, err error) {
	if len(p) < 4 {
		return nil, nil, corrupt("templates: truncated string")
	}
	n := le.Uint32(p)
	if uint64(n) > uint64(len(p)-4) || int(n) > limit {
		return nil, nil, corrupt("templates: string too long")
	}
	return p[4+n:], p[4 : 4+n], nil
}

func nextTemplate(p []byte) ([]byte, templateEntry, error) {
	var e templateEntry
	var err error
	if p, e.model, err = nextString(p, 255); err != nil {
		return nil, e, err
	}
	if p, e.source, err = nextString(p, MaxChatTemplateLen); err != nil {
		return nil, e, err
	}
	if len(e.model) == 0 || len(e.source) == 0 {
		return nil, e, corrupt("templates: empty model or source")
	}
	if len(p) < 4 {
		return nil, e, corrupt("templates: truncated special tokens")
	}
	e.specials = int(le.Uint32(p))
	if e.specials > maxSpecialTokens {
		return nil, e, corrupt("templates: too many special tokens")
	}
	start := p
	p = p[4:]
	for range e.specials {
		var k []byte
		if p, k, err = nextString(p, maxSpecialLen); err != nil {
			return nil, e, err
		}
		if len(k) == 0 {
			return nil, e, corrupt("templates: empty special token name")
		}
		if p, _, err = nextString(p, maxSpecialLen); err != nil {
			return nil, e, err
		}
	}
	e.special = start[:len(start)-len(p)]
	return p, e, nil
}

// lookup returns the template shipped for model.
func (t *templates) lookup(model string) (ChatTemplate, bool) {
	p := t.body
	for range t.n {
		var e templateEntry
		var err error
		if p, e, err = nextTemplate(p); err != nil {
			return ChatTemplate{}, false // checked when parsed; cannot happen
		}
		if string(e.model) != model {
			continue
		}
		ct := ChatTemplate{Model: model, Source: string(e.source), Special: make(map[string]string, e.specials)}
		q := e.special[4:]
		for range e.specials {
			var k, v []byte
			q, k, _ = nextString(q, maxSpecialLen)
			q, v, _ = nextString(q, maxSpecialLen)
			ct.Special[string(k)] = string(v)
		}
		return ct, true
	}
	return ChatTemplate{}, false
}

// ChatTemplate returns the chat template the snapshot ships for model, if
// any. It copies the template out of the view; a caller keeps what it
// builds from it (a parsed template) until TemplatesID changes.
func (v *View) ChatTemplate(model string) (ChatTemplate, bool) {
	if !v.loaded {
		return ChatTemplate{}, false
	}
	return v.tmpl.lookup(model)
}

// TemplatesID identifies the chat templates the view holds: it changes
// whenever they do. 0 when there are none.
func (v *View) TemplatesID() uint64 {
	if !v.loaded {
		return 0
	}
	return v.tmpl.ref.sum
}
