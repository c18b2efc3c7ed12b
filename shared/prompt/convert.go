package prompt

import (
	"bytes"
	"strconv"
	"strings"
)

// API is the request format a body is in, told by the path it was sent to.
type API uint8

const (
	// OpenAI is chat completions ("messages") or completions ("prompt");
	// the body tells which.
	OpenAI API = iota
	// Responses is OpenAI's Responses API (POST /v1/responses).
	Responses
	// Messages is Anthropic's Messages API (POST /v1/messages).
	Messages
)

// APIOf tells a request's format by the last segment of its path (the
// query ignored), so that a gateway may serve the APIs under any prefix.
func APIOf(path string) API {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	switch {
	case strings.HasSuffix(path, "/responses"):
		return Responses
	case strings.HasSuffix(path, "/messages"):
		return Messages
	}
	return OpenAI
}

// ParseAPI is Parse for a body in the given format. vLLM serves the
// Responses and Messages APIs by converting each request into a chat
// completions request and rendering that, so ParseAPI converts the body
// the same way (into the Renderer's own buffer) and parses the result:
// the canonical text of a Messages or Responses request is that of the
// chat request vLLM makes of it. The conversions follow vLLM's
// (vllm/entrypoints/anthropic/serving.py and
// vllm/entrypoints/openai/responses/utils.py, as of November 2026):
//
//   - Messages: the system prompt (a string, or its text blocks joined,
//     Claude Code's per-request "x-anthropic-billing-header" blocks left
//     out, and the text of any "system" messages after it) becomes one
//     system message; a text block a text part, an image an image_url
//     (its URL, or a data: URI of its base64 data), a tool_use a tool
//     call, a user's tool_result a tool message before the user's own,
//     an assistant's a "Tool result: " text part; a message of one text
//     part is a string; a user message left with nothing is dropped. Tools
//     become functions whose parameters are the input schema (with "type":
//     "object" added when it has none).
//   - Responses: instructions become the system message, an input string
//     a user message; input items pass through as messages, except that
//     an assistant's output message, a function call and a reasoning item
//     join the assistant message before them when it lacks that part, a
//     function call output becomes a tool message. Function tools become
//     chat tools; other tools (built-in ones) render nothing.
//
// What kvroute cannot reproduce ends in ErrUnsupported: a Responses
// request's previous_response_id (the history lives on the engine that
// served it: PreviousResponse names it, and the rest of the request is
// still rendered), reasoning under a template that prints it
// (Qwen3), tool results given as lists to an assistant (vLLM prints
// Python's repr of them), tool references, namespaced tools.
func (r *Renderer) ParseAPI(body []byte, api API) error {
	r.err, r.model, r.hasModel = nil, "", false
	r.prev, r.reasoning = "", false
	r.converted = api != OpenAI
	var err error
	switch api {
	case Messages:
		err = r.fromMessages(body)
	case Responses:
		err = r.fromResponses(body)
	default:
		return r.parse(body)
	}
	if err != nil {
		return err
	}
	return r.parse(r.conv)
}

// conversion writes the chat request a Messages or Responses body stands
// for into r.conv, copying the body's JSON values verbatim wherever vLLM
// passes them on unchanged.
type conversion struct {
	r   *Renderer
	in  scanner
	out []byte
	n   int // messages written
}

// span is a value of the converted body's source, quotes and brackets
// included; ok false when absent or null.
type span struct {
	off, end int32
	ok       bool
}

func (c *conversion) value(depth int) (span, error) {
	s := &c.in
	ch := s.ws()
	v := span{off: int32(s.pos), ok: ch != 'n'}
	err := s.skip(depth)
	v.end = int32(s.pos)
	return v, err
}

func (c *conversion) raw(v span) []byte { return c.in.b[v.off:v.end] }

// isString reports whether v is a string, and nonEmpty whether it is one
// with contents (Python's truthiness of a str).
func (c *conversion) isString(v span) bool { return v.ok && c.in.b[v.off] == '"' }
func (c *conversion) nonEmpty(v span) bool { return c.isString(v) && v.end-v.off > 2 }

// text decodes the string v.
func (c *conversion) text(dst []byte, v span) []byte {
	if !c.isString(v) {
		return dst
	}
	return appendUnescaped(dst, c.in.b[v.off+1:v.end-1])
}

// equal reports whether v is the string lit.
func (c *conversion) equal(v span, lit string) bool {
	if !c.isString(v) {
		return false
	}
	var buf [32]byte
	if int(v.end-v.off) > len(buf)+2+5*len(lit) {
		return false
	}
	return string(c.text(buf[:0], v)) == lit
}

// message opens a message object in the output with the given role.
func (c *conversion) message(role string) {
	if c.n > 0 {
		c.out = append(c.out, ',')
	}
	c.n++
	c.out = append(c.out, `{"role":"`...)
	c.out = append(c.out, role...)
	c.out = append(c.out, '"')
}

// member appends ,"key": and then the value.
func (c *conversion) member(key string) {
	c.out = append(c.out, `,"`...)
	c.out = append(c.out, key...)
	c.out = append(c.out, `":`...)
}

// appendQuoted appends s as a JSON string.
func appendQuoted(dst, s []byte) []byte {
	dst = append(dst, '"')
	start := 0
	for i, b := range s {
		if b >= 0x20 && b != '"' && b != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch b {
		case '"', '\\':
			dst = append(dst, '\\', b)
		case '\n':
			dst = append(dst, '\\', 'n')
		default:
			dst = append(dst, `\u00`...)
			dst = append(dst, "0123456789abcdef"[b>>4], "0123456789abcdef"[b&15])
		}
		start = i + 1
	}
	return append(append(dst, s[start:]...), '"')
}

// fields reads the object at the input's position, calling f with each
// key and the span of its value.
func (c *conversion) fields(depth int, f func(key str, v span) error) error {
	s := &c.in
	if s.ws() != '{' {
		if err := s.skip(depth); err != nil {
			return err
		}
		return malformed("an object was expected")
	}
	return s.object(depth, func(key str) error {
		v, err := c.value(depth + 1)
		if err != nil {
			return err
		}
		return f(key, v)
	})
}

// at moves the input to v, for reading inside it; restore with the
// returned position.
func (c *conversion) at(v span) int {
	pos := c.in.pos
	c.in.pos = int(v.off)
	return pos
}

// each calls f with each element of the array v.
func (c *conversion) each(v span, depth int, f func(elem span) error) error {
	if !v.ok || c.in.b[v.off] != '[' {
		return malformed("an array was expected")
	}
	defer func(pos int) { c.in.pos = pos }(c.at(v))
	return c.in.array(depth, func() error {
		e, err := c.value(depth + 1)
		if err != nil {
			return err
		}
		return f(e)
	})
}

// object reads the object v's members into f.
func (c *conversion) object(v span, depth int, f func(key str, v span) error) error {
	if !v.ok || c.in.b[v.off] != '{' {
		return malformed("an object was expected")
	}
	defer func(pos int) { c.in.pos = pos }(c.at(v))
	return c.fields(depth, f)
}

func (c *conversion) key(k str, lit string) bool { return c.in.equalStr(k, lit) }

// begin starts the converted request with the members copied as they are.
func (c *conversion) begin(r *Renderer, body []byte) {
	c.r, c.in, c.out = r, scanner{b: body}, r.conv[:0]
	c.out = append(c.out, '{')
}

func (c *conversion) end() {
	c.r.conv = append(c.out, '}')
}

// copied appends "key":value for each present value, the first without a
// leading comma.
func (c *conversion) copied(first bool, key string, v span) bool {
	if !v.ok {
		return first
	}
	if !first {
		c.out = append(c.out, ',')
	}
	c.out = append(c.out, '"')
	c.out = append(c.out, key...)
	c.out = append(c.out, `":`...)
	c.out = append(c.out, c.raw(v)...)
	return false
}

// messages opens the messages array, the request's first member if first.
func (c *conversion) messages(first bool) {
	if !first {
		c.out = append(c.out, ',')
	}
	c.out = append(c.out, `"messages":[`...)
}

func (r *Renderer) fromMessages(body []byte) error {
	c := &conversion{}
	c.begin(r, body)
	var model, maxTokens, stream, system, messages, tools, kwargs span
	if c.in.ws() != '{' {
		return ErrInvalidJSON
	}
	err := c.fields(0, func(k str, v span) error {
		switch {
		case c.key(k, "model"):
			model = v
		case c.key(k, "max_tokens"):
			maxTokens = v
		case c.key(k, "stream"):
			stream = v
		case c.key(k, "system"):
			system = v
		case c.key(k, "messages"):
			messages = v
		case c.key(k, "tools"):
			tools = v
		case c.key(k, "chat_template_kwargs"):
			kwargs = v
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !c.in.atEnd() {
		return ErrInvalidJSON
	}
	if !messages.ok {
		return ErrNoPrompt
	}
	first := c.copied(true, "model", model)
	first = c.copied(first, "max_tokens", maxTokens)
	first = c.copied(first, "stream", stream)
	c.messages(c.copied(first, "chat_template_kwargs", kwargs))
	if err := c.anthropicSystem(system, messages); err != nil {
		return err
	}
	if err := c.each(messages, 1, c.anthropicMessage); err != nil {
		return err
	}
	c.out = append(c.out, ']')
	if tools.ok {
		c.out = append(c.out, `,"tools":[`...)
		i := 0
		err := c.each(tools, 1, func(t span) error {
			if i > 0 {
				c.out = append(c.out, ',')
			}
			i++
			return c.anthropicTool(t)
		})
		if err != nil {
			return err
		}
		c.out = append(c.out, ']')
	}
	c.end()
	return nil
}

// billingHeader starts the system block Claude Code sends with a hash of
// each request, which vLLM leaves out so as not to defeat prefix caching.
const billingHeader = "x-anthropic-billing-header"

// anthropicSystem writes the one system message the request's system
// prompt and its system messages make, if any.
func (c *conversion) anthropicSystem(system, messages span) error {
	r := c.r
	text, any := r.tmp[:0], false
	blocks := func(v span) error {
		return c.each(v, 2, func(b span) error {
			var typ, t span
			err := c.object(b, 3, func(k str, v span) error {
				switch {
				case c.key(k, "type"):
					typ = v
				case c.key(k, "text"):
					t = v
				}
				return nil
			})
			if err != nil || !c.equal(typ, "text") || !c.nonEmpty(t) {
				return err
			}
			n := len(text)
			text = c.text(text, t)
			if strings.HasPrefix(string(text[n:]), billingHeader) {
				text = text[:n]
				return nil
			}
			any = true
			return nil
		})
	}
	switch {
	case c.nonEmpty(system):
		text, any = c.text(text, system), true
	case system.ok && c.raw(system)[0] == '[':
		if err := blocks(system); err != nil {
			return err
		}
	case system.ok && !c.isString(system):
		return malformed("system is neither a string nor an array")
	}
	err := c.each(messages, 1, func(m span) error {
		var role, content span
		err := c.object(m, 2, func(k str, v span) error {
			switch {
			case c.key(k, "role"):
				role = v
			case c.key(k, "content"):
				content = v
			}
			return nil
		})
		if err != nil || !c.equal(role, "system") {
			return err
		}
		if c.isString(content) {
			text, any = c.text(text, content), true
			return nil
		}
		return blocks(content)
	})
	if err != nil {
		return err
	}
	if any {
		c.message("system")
		c.member("content")
		c.out = appendQuoted(c.out, text)
		c.out = append(c.out, '}')
	}
	r.tmp = text
	return nil
}

// anthropicMessage writes one message of the request's messages, and the
// tool messages its tool results make before it.
func (c *conversion) anthropicMessage(m span) error {
	r := c.r
	var role, content span
	err := c.object(m, 2, func(k str, v span) error {
		switch {
		case c.key(k, "role"):
			role = v
		case c.key(k, "content"):
			content = v
		}
		return nil
	})
	if err != nil {
		return err
	}
	var name string
	switch {
	case c.equal(role, "user"), c.equal(role, "ctx"), c.equal(role, "msg"):
		name = "user"
	case c.equal(role, "assistant"):
		name = "assistant"
	case c.equal(role, "system"):
		return nil // joined into the system message
	default:
		return malformed("a message's role is not user, assistant or system")
	}
	if c.isString(content) {
		c.message(name)
		c.member("content")
		c.out = append(c.out, c.raw(content)...)
		c.out = append(c.out, '}')
		return nil
	}
	if !content.ok || c.raw(content)[0] != '[' || content.end-content.off <= 2 {
		return malformed("a message's content is neither a string nor blocks")
	}
	// Parts and tool calls are collected apart, since tool results write
	// their messages first.
	parts, calls := r.convParts[:0], r.convCalls[:0]
	nparts, ncalls := 0, 0
	var single span // the one text part's text, when it is one
	err = c.each(content, 2, func(b span) error {
		var typ, text, source, id, bname, input, result, useID, thinking span
		err := c.object(b, 3, func(k str, v span) error {
			switch {
			case c.key(k, "type"):
				typ = v
			case c.key(k, "text"):
				text = v
			case c.key(k, "source"):
				source = v
			case c.key(k, "id"):
				id = v
			case c.key(k, "name"):
				bname = v
			case c.key(k, "input"):
				input = v
			case c.key(k, "content"):
				result = v
			case c.key(k, "tool_use_id"):
				useID = v
			case c.key(k, "thinking"):
				thinking = v
			}
			return nil
		})
		if err != nil {
			return err
		}
		switch {
		case c.equal(typ, "text"):
			if !c.nonEmpty(text) {
				return nil
			}
			if nparts > 0 {
				parts = append(parts, ',')
			}
			nparts++
			single = text
			parts = append(parts, `{"type":"text","text":`...)
			parts = append(append(parts, c.raw(text)...), '}')
		case c.equal(typ, "image"):
			if !source.ok || source.end-source.off <= 2 {
				return nil
			}
			if nparts > 0 {
				parts = append(parts, ',')
			}
			nparts++
			single = span{}
			parts = append(parts, `{"type":"image_url","image_url":{"url":`...)
			var err error
			if parts, err = c.imageURL(parts, source); err != nil {
				return err
			}
			parts = append(parts, "}}"...)
		case c.equal(typ, "thinking"):
			if thinking.ok {
				r.reasoning = true
			}
		case c.equal(typ, "tool_use"):
			if ncalls > 0 {
				calls = append(calls, ',')
			}
			ncalls++
			calls = append(calls, `{"id":`...)
			if c.nonEmpty(id) {
				calls = append(calls, c.raw(id)...)
			} else {
				calls = appendQuoted(calls, strconv.AppendInt(append(r.tmp[:0], "call_"...), r.now().Unix(), 10))
			}
			calls = append(calls, `,"type":"function","function":{"name":`...)
			if c.nonEmpty(bname) {
				calls = append(calls, c.raw(bname)...)
			} else {
				calls = append(calls, `""`...)
			}
			calls = append(calls, `,"arguments":`...)
			switch {
			case !input.ok:
				calls = append(calls, "{}"...)
			case c.raw(input)[0] == '{':
				calls = append(calls, c.raw(input)...)
			default:
				return malformed("a tool_use's input is not an object")
			}
			calls = append(calls, "}}"...)
		case c.equal(typ, "tool_result"):
			if name == "user" {
				return c.toolResult(result, useID)
			}
			if result.ok && !c.isString(result) {
				return unsupported("an assistant's tool_result given as a list")
			}
			if nparts > 0 {
				parts = append(parts, ',')
			}
			nparts++
			single = span{}
			r.tmp = append(r.tmp[:0], "Tool result: "...)
			r.tmp = c.text(r.tmp, result)
			parts = append(parts, `{"type":"text","text":`...)
			parts = append(appendQuoted(parts, r.tmp), '}')
		case c.equal(typ, "redacted_thinking"), c.equal(typ, "tool_reference"):
		case c.isString(typ):
			return malformed("unknown content block type")
		default:
			return malformed("a content block has no type")
		}
		return nil
	})
	r.convParts, r.convCalls = parts, calls
	if err != nil {
		return err
	}
	if nparts == 0 && ncalls == 0 && name == "user" {
		return nil // vLLM drops a user message left with nothing
	}
	c.message(name)
	if ncalls > 0 {
		c.member("tool_calls")
		c.out = append(append(append(c.out, '['), calls...), ']')
	}
	switch {
	case nparts == 1 && single.ok:
		c.member("content")
		c.out = append(c.out, c.raw(single)...)
	case nparts > 0:
		c.member("content")
		c.out = append(append(append(c.out, '['), parts...), ']')
	}
	c.out = append(c.out, '}')
	return nil
}

// imageURL appends an image source's URL as a JSON string: the URL of a
// "url" source, else a data: URI of the base64 data.
func (c *conversion) imageURL(dst []byte, source span) ([]byte, error) {
	var typ, url, media, data span
	haveMedia := false
	err := c.object(source, 4, func(k str, v span) error {
		switch {
		case c.key(k, "type"):
			typ = v
		case c.key(k, "url"):
			url = v
		case c.key(k, "media_type"):
			media, haveMedia = v, true
		case c.key(k, "data"):
			data = v
		}
		return nil
	})
	if err != nil {
		return dst, err
	}
	if c.equal(typ, "url") {
		if c.isString(url) {
			return append(dst, c.raw(url)...), nil
		}
		return append(dst, `""`...), nil
	}
	if (media.ok && !c.isString(media)) || (data.ok && !c.isString(data)) {
		return dst, unsupported("an image source's media type or data is not a string")
	}
	t := append(c.r.tmp[:0], "data:"...)
	switch {
	case c.isString(media):
		t = c.text(t, media)
	case haveMedia:
		t = append(t, "None"...) // an f-string prints a null
	default:
		t = append(t, "image/jpeg"...)
	}
	t = append(t, ";base64,"...)
	t = c.text(t, data)
	c.r.tmp = t
	return appendQuoted(dst, t), nil
}

// toolResult writes a user's tool_result as the tool message vLLM makes
// of it, and the user message of its images after it.
func (c *conversion) toolResult(result, useID span) error {
	r := c.r
	text := r.tmp[:0]
	images := r.convImages[:0]
	nimages := 0
	switch {
	case c.isString(result):
		text = c.text(text, result)
	case result.ok && c.raw(result)[0] == '[':
		n := 0
		err := c.each(result, 4, func(item span) error {
			if c.raw(item)[0] != '{' {
				return nil
			}
			var typ, t, source, toolName, name span
			err := c.object(item, 5, func(k str, v span) error {
				switch {
				case c.key(k, "type"):
					typ = v
				case c.key(k, "text"):
					t = v
				case c.key(k, "source"):
					source = v
				case c.key(k, "tool_name"):
					toolName = v
				case c.key(k, "name"):
					name = v
				}
				return nil
			})
			if err != nil {
				return err
			}
			switch {
			case c.equal(typ, "text"):
				if t.ok && !c.isString(t) {
					return unsupported("a tool_result's text is not a string")
				}
				if n > 0 {
					text = append(text, '\n')
				}
				n++
				text = c.text(text, t)
			case c.equal(typ, "image"):
				if nimages > 0 {
					images = append(images, ',')
				}
				nimages++
				images = append(images, `{"type":"image_url","image_url":{"url":`...)
				if !source.ok {
					source = span{}
				}
				var err error
				if source.ok {
					// imageURL writes through r.tmp: keep the text apart.
					saved := append(r.convText[:0], text...)
					images, err = c.imageURL(images, source)
					text = append(r.tmp[:0], saved...)
					r.convText = saved
				} else {
					images = append(images, `"data:image/jpeg;base64,"`...)
				}
				if err != nil {
					return err
				}
				images = append(images, "}}"...)
			case c.equal(typ, "tool_reference"):
				if c.nonEmpty(toolName) || c.nonEmpty(name) {
					return unsupported("a tool_result holds a tool reference")
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	case result.ok:
		return malformed("a tool_result's content is neither a string nor a list")
	}
	c.message("tool")
	c.member("tool_call_id")
	if c.isString(useID) {
		c.out = append(c.out, c.raw(useID)...)
	} else {
		c.out = append(c.out, `""`...)
	}
	c.member("content")
	c.out = append(appendQuoted(c.out, text), '}')
	if nimages > 0 {
		c.message("user")
		c.member("content")
		c.out = append(append(append(append(c.out, '['), images...), ']'), '}')
	}
	r.tmp, r.convImages = text, images
	return nil
}

// anthropicTool writes one tool as the function vLLM makes of it.
func (c *conversion) anthropicTool(t span) error {
	var name, desc, schema, deferLoading span
	err := c.object(t, 2, func(k str, v span) error {
		switch {
		case c.key(k, "name"):
			name = v
		case c.key(k, "description"):
			desc = v
		case c.key(k, "input_schema"):
			schema = v
		case c.key(k, "defer_loading"):
			deferLoading = v
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !c.isString(name) {
		return malformed("a tool has no name")
	}
	if !schema.ok || c.raw(schema)[0] != '{' {
		return malformed("a tool's input_schema is not an object")
	}
	c.out = append(c.out, `{"type":"function","function":{"name":`...)
	c.out = append(c.out, c.raw(name)...)
	c.out = append(c.out, `,"description":`...)
	if desc.ok {
		c.out = append(c.out, c.raw(desc)...)
	} else {
		c.out = append(c.out, "null"...)
	}
	c.out = append(c.out, `,"parameters":`...)
	hasType := false
	if err := c.object(schema, 3, func(k str, v span) error {
		hasType = hasType || c.key(k, "type")
		return nil
	}); err != nil {
		return err
	}
	raw := c.raw(schema)
	if hasType {
		c.out = append(c.out, raw...)
	} else {
		// pydantic's validator adds the type last.
		body := bytes.TrimRight(raw[:len(raw)-1], " \t\r\n")
		c.out = append(c.out, body...)
		if len(body) > 1 {
			c.out = append(c.out, ',')
		}
		c.out = append(c.out, `"type":"object"}`...)
	}
	c.out = append(c.out, `,"defer_loading":`...)
	if deferLoading.ok {
		c.out = append(c.out, c.raw(deferLoading)...)
	} else {
		c.out = append(c.out, "null"...)
	}
	c.out = append(c.out, "}}"...)
	return nil
}

// responseMsg is one message a Responses input makes, before it is
// written: an item passed through, or an assistant or tool message built
// from items.
type responseMsg struct {
	item      span // passed through as it is, when ok
	tool      bool // a tool message: content is the output, id the call's
	content   span // the assistant's text, when set
	text      bool // content was set (a later output message may fill it otherwise)
	reasoning bool // the assistant's reasoning was set
	id        span // the tool message's call id
	c0, c1    int  // the assistant's tool calls, in Renderer.respCalls
}

// responseCall is a function call item's part of an assistant message.
type responseCall struct{ id, name, args span }

func (r *Renderer) fromResponses(body []byte) error {
	c := &conversion{}
	c.begin(r, body)
	var model, maxTokens, stream, instructions, input, tools, prev span
	if c.in.ws() != '{' {
		return ErrInvalidJSON
	}
	err := c.fields(0, func(k str, v span) error {
		switch {
		case c.key(k, "model"):
			model = v
		case c.key(k, "max_output_tokens"):
			maxTokens = v
		case c.key(k, "stream"):
			stream = v
		case c.key(k, "instructions"):
			instructions = v
		case c.key(k, "input"):
			input = v
		case c.key(k, "tools"):
			tools = v
		case c.key(k, "previous_response_id"):
			prev = v
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !c.in.atEnd() {
		return ErrInvalidJSON
	}
	if c.isString(prev) {
		r.prev = string(c.text(r.tmp[:0], prev))
	}
	if !input.ok {
		return ErrNoPrompt
	}
	first := c.copied(true, "model", model)
	first = c.copied(first, "max_tokens", maxTokens)
	c.messages(c.copied(first, "stream", stream))
	if c.nonEmpty(instructions) {
		c.message("system")
		c.member("content")
		c.out = append(append(c.out, c.raw(instructions)...), '}')
	}
	switch {
	case c.isString(input):
		c.message("user")
		c.member("content")
		c.out = append(append(c.out, c.raw(input)...), '}')
	case c.raw(input)[0] == '[':
		if err := c.responseItems(input); err != nil {
			return err
		}
	default:
		return malformed("input is neither a string nor an array")
	}
	c.out = append(c.out, ']')
	if tools.ok {
		c.out = append(c.out, `,"tools":[`...)
		i := 0
		err := c.each(tools, 1, func(t span) error {
			return c.responseTool(t, &i)
		})
		if err != nil {
			return err
		}
		c.out = append(c.out, ']')
	}
	c.end()
	return nil
}

// responseItems converts the input items into messages, then writes them.
func (c *conversion) responseItems(input span) error {
	r := c.r
	msgs, calls := r.respMsgs[:0], r.respCalls[:0]
	// assistant returns the last message if it is an assistant's built
	// from items, which the next item may join.
	assistant := func() *responseMsg {
		if n := len(msgs); n > 0 && !msgs[n-1].item.ok && !msgs[n-1].tool {
			return &msgs[n-1]
		}
		return nil
	}
	err := c.each(input, 1, func(item span) error {
		var typ, role, content, callID, name, args, output, namespace span
		err := c.object(item, 2, func(k str, v span) error {
			switch {
			case c.key(k, "type"):
				typ = v
			case c.key(k, "role"):
				role = v
			case c.key(k, "content"):
				content = v
			case c.key(k, "call_id"):
				callID = v
			case c.key(k, "name"):
				name = v
			case c.key(k, "arguments"):
				args = v
			case c.key(k, "output"):
				output = v
			case c.key(k, "namespace"):
				namespace = v
			}
			return nil
		})
		if err != nil {
			return err
		}
		switch {
		case c.equal(typ, "function_call"):
			if namespace.ok {
				return unsupported("a namespaced function call")
			}
			if !c.isString(callID) || !c.isString(name) || !c.isString(args) {
				return malformed("a function_call lacks its call_id, name or arguments")
			}
			calls = append(calls, responseCall{id: callID, name: name, args: args})
			if a := assistant(); a != nil && (a.c1 == len(calls)-1) {
				a.c1++
				return nil
			}
			msgs = append(msgs, responseMsg{c0: len(calls) - 1, c1: len(calls)})
		case c.equal(typ, "function_call_output"):
			msgs = append(msgs, responseMsg{tool: true, content: output, id: callID})
		case c.equal(typ, "reasoning"):
			r.reasoning = true
			if a := assistant(); a != nil && !a.reasoning {
				a.reasoning = true
				return nil
			}
			msgs = append(msgs, responseMsg{reasoning: true, c0: len(calls), c1: len(calls)})
		case c.equal(role, "assistant"):
			text, err := c.firstText(content)
			if err != nil {
				return err
			}
			if a := assistant(); a != nil && !a.text {
				a.content, a.text = text, true
				return nil
			}
			msgs = append(msgs, responseMsg{content: text, text: true, c0: len(calls), c1: len(calls)})
		case c.isString(role):
			msgs = append(msgs, responseMsg{item: item})
		default:
			return unsupported("an input item kvroute does not render")
		}
		return nil
	})
	r.respMsgs, r.respCalls = msgs, calls
	if err != nil {
		return err
	}
	for i := range msgs {
		m := &msgs[i]
		switch {
		case m.item.ok:
			if c.n > 0 {
				c.out = append(c.out, ',')
			}
			c.n++
			c.out = append(c.out, c.raw(m.item)...)
		case m.tool:
			c.message("tool")
			c.member("content")
			c.out = append(c.out, c.orNull(m.content)...)
			c.member("tool_call_id")
			c.out = append(append(c.out, c.orNull(m.id)...), '}')
		default:
			c.message("assistant")
			if m.text {
				c.member("content")
				c.out = append(c.out, c.orEmpty(m.content)...)
			}
			if m.c1 > m.c0 {
				c.member("tool_calls")
				c.out = append(c.out, '[')
				for j, call := range calls[m.c0:m.c1] {
					if j > 0 {
						c.out = append(c.out, ',')
					}
					c.out = append(c.out, `{"id":`...)
					c.out = append(c.out, c.raw(call.id)...)
					c.out = append(c.out, `,"function":{"name":`...)
					c.out = append(c.out, c.raw(call.name)...)
					c.out = append(c.out, `,"arguments":`...)
					c.out = append(c.out, c.raw(call.args)...)
					c.out = append(c.out, `},"type":"function"}`...)
				}
				c.out = append(c.out, ']')
			}
			c.out = append(c.out, '}')
		}
	}
	return nil
}

func (c *conversion) orNull(v span) []byte {
	if !v.ok {
		return []byte("null")
	}
	return c.raw(v)
}

func (c *conversion) orEmpty(v span) []byte {
	if !v.ok {
		return []byte(`""`)
	}
	return c.raw(v)
}

// firstText is an assistant item's text as vLLM takes it: a string
// content, else its first part's text ("" when there is none).
func (c *conversion) firstText(content span) (span, error) {
	switch {
	case c.isString(content):
		return content, nil
	case !content.ok:
		return span{}, nil
	case c.raw(content)[0] != '[':
		return span{}, malformed("an assistant item's content is neither a string nor an array")
	}
	var text span
	i := 0
	err := c.each(content, 3, func(p span) error {
		i++
		if i > 1 {
			return nil
		}
		if c.isString(p) {
			text = p
			return nil
		}
		return c.object(p, 4, func(k str, v span) error {
			if c.key(k, "text") {
				if v.ok && !c.isString(v) {
					return malformed("an output text is not a string")
				}
				text = v
			}
			return nil
		})
	})
	return text, err
}

// responseTool writes a function tool as the chat tool vLLM renders it
// with; other tools (web search, MCP and the like) render nothing.
func (c *conversion) responseTool(t span, i *int) error {
	var typ span
	var members int
	err := c.object(t, 2, func(k str, v span) error {
		if c.key(k, "type") {
			typ = v
		}
		return nil
	})
	if err != nil {
		return err
	}
	switch {
	case c.equal(typ, "namespace"):
		return unsupported("a namespace of tools")
	case !c.equal(typ, "function"):
		return nil
	}
	if *i > 0 {
		c.out = append(c.out, ',')
	}
	*i++
	c.out = append(c.out, `{"type":"function","function":{`...)
	err = c.object(t, 2, func(k str, v span) error {
		if c.key(k, "type") {
			return nil
		}
		if members > 0 {
			c.out = append(c.out, ',')
		}
		members++
		c.out = append(c.out, c.in.b[k.off-1:k.end+1]...)
		c.out = append(append(c.out, ':'), c.orNull(v)...)
		return nil
	})
	c.out = append(c.out, "}}"...)
	return err
}
