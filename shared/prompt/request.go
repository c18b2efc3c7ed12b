package prompt

import (
	"github.com/cespare/xxhash/v2"
)

// role is a message's role; roleOther covers any other string, which
// templates either print as given or reject.
type role uint8

const (
	roleOther role = iota
	roleSystem
	roleDeveloper
	roleUser
	roleAssistant
	roleTool
)

// contentKind says what a message's content was.
type contentKind uint8

const (
	contentNone   contentKind = iota // absent or null
	contentString                    // a string: text
	contentParts                     // an array of parts: parts[p0:p1]
)

// part is one element of a content array: text, or a media digest.
type part struct {
	text   str
	media  bool
	digest uint64 // of the media's URL or data
	// bare: a string rather than an object; refusal: a refusal part,
	// whose text is its "refusal". Templates see both as text; vLLM's
	// harmony conversion does not.
	bare, refusal bool
}

// message is one entry of messages, as offsets into the body.
type message struct {
	role      role
	roleName  str
	kind      contentKind
	text      str   // contentString
	p0, p1    int32 // contentParts
	name      str   // present only when a string, as vLLM keeps it
	calls     raw   // tool_calls: present only when not null
	callID    str   // tool_call_id
	callIDSet bool  // tool_call_id present, whatever its type
	reasoning str   // an assistant's reasoning, when a string
}

// raw is a JSON value's bytes in the body.
type raw struct {
	off, end int32
	ok       bool
}

// request is what a body holds, as offsets into it.
type request struct {
	model    str
	messages bool // messages present (an array)
	tools    raw  // tools: present only when not null
	noGen    bool // add_generation_prompt: false
	// noThinking: chat_template_kwargs.enable_thinking is false (Jinja's
	// "is false": the boolean only).
	noThinking bool
	// date is chat_template_kwargs.date_string (Llama 3's "Today Date");
	// dateSet when given, and then a string unless dateBad.
	date             str
	dateSet, dateBad bool
	kwargs           raw // chat_template_kwargs, when an object
	// effort is reasoning_effort (gpt-oss's harmony system message);
	// effortSet when present and not null, then a string unless effortBad.
	effort               str
	effortSet, effortBad bool

	prompt raw // completions prompt
	// max_tokens and max_completion_tokens, when positive integers
	maxTokens, maxCompletion int
	salt                     str // cache_salt, when a string
	stream                   bool
}

// parse reads body into r's request, messages and parts in one pass.
func (r *Renderer) parse(body []byte) error {
	r.s = scanner{b: body, arena: r.s.arena[:0]}
	r.req = request{}
	r.msgs = r.msgs[:0]
	r.parts = r.parts[:0]
	s := &r.s
	if s.ws() != '{' {
		return ErrInvalidJSON
	}
	err := s.object(0, func(key str) error {
		switch {
		case s.equalStr(key, "model"):
			if s.ws() != '"' {
				r.req.model = str{}
				return s.skip(1)
			}
			v, err := s.str()
			r.req.model = v
			return err
		case s.equalStr(key, "messages"):
			if c := s.ws(); c != '[' {
				r.req.messages = false
				if err := s.skip(1); err != nil || c == 'n' {
					return err
				}
				return malformed("messages is not an array")
			}
			r.req.messages = true
			r.msgs = r.msgs[:0]
			r.parts = r.parts[:0]
			return s.array(1, r.parseMessage)
		case s.equalStr(key, "prompt"):
			r.req.prompt = r.rawValue(1)
		case s.equalStr(key, "tools"):
			r.req.tools = r.valueAt(s, 1)
		case s.equalStr(key, "chat_template_kwargs"):
			if s.ws() != '{' {
				return s.skip(1)
			}
			r.req.kwargs = raw{off: int32(s.pos), ok: true}
			defer func() { r.req.kwargs.end = int32(s.pos) }()
			return s.object(1, func(key str) error {
				switch {
				case s.equalStr(key, "enable_thinking"):
					r.req.noThinking = s.ws() == 'f'
				case s.equalStr(key, "date_string"):
					r.req.dateSet = true
					if r.req.dateBad = s.ws() != '"'; !r.req.dateBad {
						var err error
						r.req.date, err = s.str()
						return err
					}
				}
				return s.skip(2)
			})
		case s.equalStr(key, "reasoning_effort"):
			switch s.ws() {
			case 'n':
				return s.skip(1)
			case '"':
				r.req.effortSet = true
				r.req.effort, r.err = s.str()
				return r.err
			}
			r.req.effortSet, r.req.effortBad = true, true
			return s.skip(1)
		case s.equalStr(key, "add_generation_prompt"):
			r.req.noGen = s.ws() == 'f'
			return s.skip(1)
		case s.equalStr(key, "max_tokens"):
			r.req.maxTokens, r.err = s.count()
		case s.equalStr(key, "max_completion_tokens"):
			r.req.maxCompletion, r.err = s.count()
		case s.equalStr(key, "stream"):
			r.req.stream = s.ws() == 't'
			return s.skip(1)
		case s.equalStr(key, "cache_salt"):
			if s.ws() != '"' {
				r.req.salt = str{}
				return s.skip(1)
			}
			r.req.salt, r.err = s.str()
		default:
			return s.skip(1)
		}
		return r.err
	})
	if err != nil {
		return err
	}
	if !s.atEnd() {
		return ErrInvalidJSON
	}
	return nil
}

// rawValue skips a value and returns its extent; a failure is left in r.err.
func (r *Renderer) rawValue(depth int) raw {
	s := &r.s
	s.ws()
	v := raw{off: int32(s.pos), ok: true}
	r.err = s.skip(depth)
	v.end = int32(s.pos)
	return v
}

func (r *Renderer) parseMessage() error {
	s := &r.s
	if s.ws() != '{' {
		if err := s.skip(2); err != nil {
			return err
		}
		return malformed("a message is not an object")
	}
	var m message
	haveRole := false
	err := s.object(2, func(key str) error {
		switch {
		case s.equalStr(key, "role"):
			if s.ws() != '"' {
				return malformed("a message's role is not a string")
			}
			v, err := s.str()
			m.roleName, haveRole = v, true
			return err
		case s.equalStr(key, "content"):
			return r.parseContent(&m)
		case s.equalStr(key, "name"):
			if s.ws() != '"' {
				m.name = str{}
				return s.skip(3)
			}
			v, err := s.str()
			m.name = v
			return err
		case s.equalStr(key, "tool_calls"):
			m.calls = r.valueAt(s, 3)
			return r.err
		case s.equalStr(key, "reasoning"):
			if s.ws() != '"' {
				return s.skip(3)
			}
			v, err := s.text()
			m.reasoning = v
			return err
		case s.equalStr(key, "tool_call_id"):
			m.callIDSet = true
			if s.ws() != '"' {
				m.callID = str{}
				return s.skip(3)
			}
			v, err := s.str()
			m.callID = v
			return err
		}
		return s.skip(3)
	})
	if err != nil {
		return err
	}
	if !haveRole {
		return malformed("a message has no role")
	}
	m.role = r.roleOf(m.roleName)
	r.msgs = append(r.msgs, m)
	return nil
}

func (r *Renderer) roleOf(v str) role {
	s := &r.s
	switch {
	case s.equalStr(v, "user"):
		return roleUser
	case s.equalStr(v, "assistant"):
		return roleAssistant
	case s.equalStr(v, "system"):
		return roleSystem
	case s.equalStr(v, "tool"):
		return roleTool
	case s.equalStr(v, "developer"):
		return roleDeveloper
	}
	return roleOther
}

func (r *Renderer) parseContent(m *message) error {
	s := &r.s
	switch s.ws() {
	case '"':
		v, err := s.text()
		m.kind, m.text = contentString, v
		return err
	case 'n':
		m.kind = contentNone
		return s.literal("null")
	case '[':
		m.kind = contentParts
		m.p0 = int32(len(r.parts))
		err := s.array(3, r.parsePart)
		m.p1 = int32(len(r.parts))
		return err
	}
	if err := s.skip(3); err != nil {
		return err
	}
	return malformed("a message's content is neither a string, an array nor null")
}

// mediaTypes are the part types whose payload is hashed into a digest.
var mediaTypes = [...]string{"image_url", "input_audio", "audio_url", "video_url", "image", "audio", "video", "input_image", "image_embeds", "audio_embeds", "image_pil", "file"}

// parsePart reads one element of a content array. Text parts are "text" (also
// "input_text", "output_text") with a "text" string, or "refusal" with a
// "refusal" string; a bare string is text too. Media parts contribute a
// digest of their payload: the "url" or "data" string inside the member named
// by their type (or that member itself when it is a string), else the part's
// whole JSON.
func (r *Renderer) parsePart() error {
	s := &r.s
	if s.ws() == '"' {
		v, err := s.text()
		r.parts = append(r.parts, part{text: v, bare: true})
		return err
	}
	if s.ws() != '{' {
		if err := s.skip(4); err != nil {
			return err
		}
		return malformed("a content part is neither an object nor a string")
	}
	start := s.pos
	var typ, text, refusal str
	var media [4]raw // members named like a media type
	nmedia := 0
	err := s.object(4, func(key str) error {
		switch {
		case s.equalStr(key, "type"):
			if s.ws() != '"' {
				return malformed("a content part's type is not a string")
			}
			v, err := s.str()
			typ = v
			return err
		case s.equalStr(key, "text"):
			if s.ws() != '"' {
				return malformed("a text part's text is not a string")
			}
			v, err := s.text()
			text = v
			return err
		case s.equalStr(key, "refusal"):
			if s.ws() != '"' {
				return s.skip(5)
			}
			v, err := s.text()
			refusal = v
			return err
		}
		for _, t := range mediaTypes {
			if s.equalStr(key, t) && nmedia < len(media) {
				v := r.rawValue(5)
				v.off = key.off - 1 // from the key, to find it again
				media[nmedia] = v
				nmedia++
				return r.err
			}
		}
		return s.skip(5)
	})
	if err != nil {
		return err
	}
	end := s.pos
	switch {
	case typ.ok && (s.equalStr(typ, "text") || s.equalStr(typ, "input_text") || s.equalStr(typ, "output_text")):
		if !text.ok {
			return malformed("a text part has no text")
		}
		r.parts = append(r.parts, part{text: text})
		return nil
	case typ.ok && s.equalStr(typ, "refusal"):
		if !refusal.ok {
			return malformed("a refusal part has no refusal")
		}
		r.parts = append(r.parts, part{text: refusal, refusal: true})
		return nil
	case typ.ok && !isMediaType(s, typ):
		return malformed("unknown content part type")
	case !typ.ok && nmedia == 0:
		return malformed("a content part has no type")
	}
	r.parts = append(r.parts, part{media: true, digest: r.mediaDigest(typ, media[:nmedia], start, end)})
	return nil
}

func isMediaType(s *scanner, typ str) bool {
	for _, t := range mediaTypes {
		if s.equalStr(typ, t) {
			return true
		}
	}
	return false
}

// mediaDigest hashes a media part's payload. members are the part's members
// named like media types, each from its key to the end of its value.
func (r *Renderer) mediaDigest(typ str, members []raw, start, end int) uint64 {
	s := &r.s
	for _, mem := range members {
		sub := scanner{b: s.b[:mem.end], pos: int(mem.off)}
		key, _ := sub.str()
		if typ.ok && !equalDecoded(s, key, typ) {
			continue
		}
		sub.expect(':')
		if sub.ws() == '"' {
			v, _ := sub.str()
			return r.digest(v)
		}
		var payload str
		sub.object(5, func(k str) error {
			if sub.equalStr(k, "url") || sub.equalStr(k, "data") {
				if sub.ws() == '"' && !payload.ok {
					v, err := sub.str()
					payload = v
					return err
				}
			}
			return sub.skip(6)
		})
		if payload.ok {
			return r.digest(payload)
		}
	}
	return xxhash.Sum64(s.b[start:end])
}

func equalDecoded(s *scanner, a, b str) bool {
	if !a.esc && !b.esc {
		return string(s.b[a.off:a.end]) == string(s.b[b.off:b.end])
	}
	var x, y [64]byte
	return string(s.appendStr(x[:0], a)) == string(s.appendStr(y[:0], b))
}

// digest is XXH64 of a string's decoded contents.
func (r *Renderer) digest(v str) uint64 {
	if !v.esc {
		return xxhash.Sum64(r.s.b[v.off:v.end])
	}
	r.tmp = r.s.appendStr(r.tmp[:0], v)
	return xxhash.Sum64(r.tmp)
}
