// Package prompt turns an OpenAI-style request body into the text an engine
// tokenizes, so that block hashes of that text line up with the engine's
// prefix cache.
//
// Chat requests ("messages") are rendered the way vLLM's chat endpoint renders
// them with a model's HuggingFace chat template: Render mirrors the template
// families of e2e/vllmsim/templates byte for byte, including the special
// strings the templates emit themselves (such as Llama 3's
// "<|begin_of_text|>") and add_generation_prompt=true, vLLM's default. Before
// a template sees the messages, vLLM normalises them, and so does Render:
//
//   - content given as an array of parts is joined with "\n" for the chatml,
//     llama3, mistral and plain families, whose templates expect a string; the
//     gemma template receives the parts themselves. Absent or null content is
//     "" (or no parts, for gemma).
//   - an image, audio or video part renders as "<|media:" + 16 lowercase hex
//     digits of XXH64 of its URL or data + "|>", so different media never
//     share a prefix. (The engine caches media by a hash of their own; no
//     placeholder text can match its tokens.)
//   - an assistant's tool call arguments, a JSON string, are parsed, so a
//     template's tojson prints them as Python's json.dumps would
//     (ensure_ascii=False); absent or empty arguments are {}.
//   - tools become {"type": "function", "function": {"name", "description",
//     "parameters", ...}, ...}, the order and nulls of vLLM's pydantic
//     model_dump.
//   - name is kept only when a string, tool_call_id only on tool messages,
//     tool_calls only on assistant messages.
//
// A request's "add_generation_prompt": false is honoured, and so is
// chat_template_kwargs.enable_thinking: false (Qwen3) and
// chat_template_kwargs.date_string (Llama 3); other
// chat_template_kwargs and continue_final_message are not. Python keeps the
// last of duplicate keys inside tool JSON; Render prints them all. Either
// only costs a cache hit, never a wrong answer.
//
// Completions requests ("prompt") take a string, an array of strings (each its
// own prompt; the first one is rendered), or token ids (an array of integers,
// or an array of such arrays). Text prompts are prefixed with the family's BOS
// string, as the engine's tokenizer adds the BOS token to them; token ids are
// rendered as 4-byte little-endian values, and Prompt.Tokens says so.
package prompt

import (
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/kvroute/shared/errdetail"
)

// Template names a chat-template family.
type Template uint8

// The chat-template families kvroute renders.
const (
	// Plain is a documented, template-free joining, for models whose template
	// kvroute does not know: optional "tools: " followed by each tool's JSON
	// (printed as Python's json.dumps prints it, so independent of the
	// body's whitespace), one per line; then, for each message, its role,
	// " (name)" when it has one, ": ", its content (parts joined with "\n")
	// and "\n"; then, for each tool call of an assistant message,
	// "tool_call: ", the function name, " ", the arguments (a string as is,
	// other JSON printed like tools) and "\n". Plain adds no generation
	// prompt, and text completions get no BOS.
	Plain Template = iota
	// ChatML is Qwen2.5-Instruct's template (<|im_start|>role ... <|im_end|>,
	// Qwen's default system prompt, <tools> and <tool_call> blocks).
	ChatML
	// Llama3 is the Llama 3.1/3.3 Instruct template.
	Llama3
	// Mistral is Mistral-Nemo-Instruct-2407's template.
	Mistral
	// Gemma is the Gemma 3 -it template.
	Gemma
	// Qwen3 is Qwen3's template (the hybrid thinking models): ChatML with
	// <think> blocks, honouring chat_template_kwargs.enable_thinking.
	Qwen3
	// Llama32 is the Llama 3.2 Instruct template: Llama3's, with today's
	// date (Renderer.Now, in UTC) where Llama3 prints 26 Jul 2024.
	Llama32

	// The families below are rendered by the general path (general.go)
	// from their real templates (templates/SOURCES.md).

	// DeepSeekV31 is DeepSeek-V3.1's template.
	DeepSeekV31
	// DeepSeekR1 is DeepSeek-R1's (as its Qwen and Llama distillations
	// ship it).
	DeepSeekR1
	// GptOss is gpt-oss's Jinja template (the harmony format).
	GptOss
	// MistralSmall32 is Mistral-Small-3.2-24B-Instruct-2506's template.
	MistralSmall32
	// Phi35 is Phi-3.5-mini-instruct's template.
	Phi35
	// Granite33 is IBM Granite 3.3 Instruct's template.
	Granite33
	// Hermes is Hermes 3 (Llama 3.1)'s tool-use template, the one vLLM's
	// tool_chat_template_hermes.jinja example is modelled on.
	Hermes
	// Custom is a template given as Jinja source (Renderer.Custom),
	// rendered by the general path.
	Custom
	// Harmony is gpt-oss as vLLM serves it: not with its Jinja template
	// (GptOss) but through openai-harmony, from a system message of its
	// own with today's date (Renderer.Now, in UTC) and
	// reasoning_effort (harmony.go).
	Harmony

	// vLLM's example chat templates (its examples/ directory), which
	// deployments pass as --chat-template for tool calling; rendered by
	// the general path.

	// VLLMLlama31JSON is tool_chat_template_llama3.1_json.jinja.
	VLLMLlama31JSON
	// VLLMLlama4JSON is tool_chat_template_llama4_json.jinja.
	VLLMLlama4JSON
	// VLLMLlama4Pythonic is tool_chat_template_llama4_pythonic.jinja.
	VLLMLlama4Pythonic
	// VLLMPhi4Mini is tool_chat_template_phi4_mini.jinja.
	VLLMPhi4Mini
	// VLLMHermes is tool_chat_template_hermes.jinja.
	VLLMHermes
	// VLLMChatML is template_chatml.jinja.
	VLLMChatML
)

// templateNames are in the order of the constants, whose values the
// snapshot carries: new templates go at the end.
var templateNames = [...]string{Plain: "plain", ChatML: "chatml", Llama3: "llama3", Mistral: "mistral", Gemma: "gemma", Qwen3: "qwen3", Llama32: "llama3.2",
	DeepSeekV31: "deepseek-v3.1", DeepSeekR1: "deepseek-r1", GptOss: "gpt-oss", MistralSmall32: "mistral-small-3.2", Phi35: "phi-3.5", Granite33: "granite-3.3", Hermes: "hermes", Custom: "custom", Harmony: "harmony",
	VLLMLlama31JSON: "vllm-llama3.1-json", VLLMLlama4JSON: "vllm-llama4-json", VLLMLlama4Pythonic: "vllm-llama4-pythonic",
	VLLMPhi4Mini: "vllm-phi4-mini", VLLMHermes: "vllm-hermes", VLLMChatML: "vllm-chatml"}

// ParseTemplate returns the template with the given configuration name.
func ParseTemplate(name string) (Template, error) {
	for t, n := range templateNames {
		if n == name {
			return Template(t), nil
		}
	}
	return 0, errors.New("prompt: unknown chat template " + strconv.Quote(name))
}

// Tally counts the templates endpoints render with, to choose one for
// their model. The filter and cachesync both choose by it, so that
// cachesync judges each engine against the template the filter will use.
type Tally [len(templateNames)]int

// Add counts one endpoint rendering with t; Plain (not known) counts for
// nothing.
func (y *Tally) Add(t Template) {
	if t != Plain && int(t) < len(y) {
		y[t]++
	}
}

// Winner returns the template most endpoints render with, the first in
// Templates order on a tie; Plain when none was counted.
func (y *Tally) Winner() Template {
	best := Plain
	for t := range y {
		if y[t] > y[best] {
			best = Template(t)
		}
	}
	return best
}

// Templates returns every template kvroute renders by name, Plain first:
// all but Custom, which needs its source.
func Templates() []Template {
	ts := make([]Template, 0, len(templateNames)-1)
	for i := range templateNames {
		if Template(i) != Custom {
			ts = append(ts, Template(i))
		}
	}
	return ts
}

// Known reports whether t is one of Templates.
func (t Template) Known() bool { return int(t) < len(templateNames) }

// String returns the template's configuration name.
func (t Template) String() string {
	if int(t) < len(templateNames) {
		return templateNames[t]
	}
	return "Template(" + strconv.Itoa(int(t)) + ")"
}

// BOS is the string a family's tokenizer adds before a text prompt, and
// its templates print first; "" for families without one.
func (t Template) BOS() string {
	switch t {
	case Llama3, Llama32, Hermes, VLLMLlama31JSON, VLLMLlama4JSON, VLLMLlama4Pythonic, VLLMHermes:
		return "<|begin_of_text|>"
	case Mistral, MistralSmall32, Phi35:
		return "<s>"
	case Gemma:
		return "<bos>"
	case DeepSeekV31, DeepSeekR1:
		return "<｜begin▁of▁sentence｜>"
	}
	return ""
}

// Prompt is a rendered request.
type Prompt struct {
	Model   string // the request's "model"
	Text    []byte // canonical text; shares storage with the dst passed to Render
	Tokens  bool   // Text holds token ids, 4 bytes little-endian each
	Prompts int    // prompts in the request; Text is the first one's
	// MaxTokens is the output the request allows (max_completion_tokens,
	// else max_tokens); 0 when it does not say, or says it oddly.
	MaxTokens int
	// CacheSalt is vLLM's cache_salt: the engine shares cached blocks only
	// between requests with the same salt (blockhash.Salted).
	CacheSalt string
	// Stream: the request asks for its answer streamed ("stream": true).
	Stream bool
}

// Errors Render returns; the filter turns each into a fallback. Errors that
// carry detail wrap ErrMalformed or ErrTemplate (test with errors.Is).
var (
	// ErrInvalidJSON means the body is not one JSON object.
	ErrInvalidJSON = errors.New("prompt: body is not a JSON object")
	// ErrNoPrompt means the body has neither messages nor a prompt, or they
	// are empty.
	ErrNoPrompt = errors.New("prompt: body has neither messages nor prompt")
	// ErrMalformed means a field the rendering needs has the wrong shape, or
	// the body nests deeper than any request does.
	ErrMalformed = errors.New("prompt: malformed request")
	// ErrTemplate means the chat template rejects the conversation (the
	// engine answers such a request with an error of its own).
	ErrTemplate = errors.New("prompt: chat template rejects the conversation")
	// ErrUnsupported means the request is valid but uses a form kvroute
	// does not reproduce (see ParseAPI).
	ErrUnsupported = errors.New("prompt: request form not rendered")
)

func malformed(detail string) error { return errdetail.New(ErrMalformed, detail) }
func rejected(detail string) error  { return errdetail.New(ErrTemplate, detail) }
func unsupported(detail string) error {
	return errdetail.New(ErrUnsupported, detail)
}

// A Renderer renders request bodies, reusing its scratch space from one call
// to the next. It is not safe for concurrent use.
type Renderer struct {
	// Now is the clock of templates that print today's date (Llama32);
	// nil means time.Now. The date is the UTC one: engines print their
	// process's local date, and an engine's container runs in UTC unless
	// its TZ says otherwise.
	Now func() time.Time
	// Custom is the template Custom renders with.
	Custom *Jinja

	s     scanner
	req   request
	msgs  []message
	parts []part
	tmp   []byte // scratch: decoded payloads, arguments, comparisons
	// scratch holds a message's content while a template inspects it
	// (tmp is taken by the arguments printed meanwhile).
	scratch []byte
	kv      []member
	err     error
	// model is the parsed body's model, once Model has decoded it.
	model    string
	hasModel bool

	// The chat request a Messages or Responses body converts to, and
	// the conversion's scratch space.
	conv, convParts, convCalls, convImages, convText []byte
	respMsgs                                         []responseMsg
	respCalls                                        []responseCall
	prev                                             string // previous_response_id
	reasoning                                        bool   // the conversion met reasoning it dropped
	converted                                        bool   // the body last parsed was a Messages or Responses request

	// harmony's scratch: which messages carry tool calls, and the
	// function name of each call id (harmonyCalls).
	withCalls []bool
	callNames map[uint64]str
}

var pool = sync.Pool{New: func() any { return new(Renderer) }}

// What a Renderer keeps of its scratch space from one request to the next
// (Trim): far more than a chat request needs, far less than a hostile one
// grows. One request of 100k messages grows a Renderer's scratch space to
// 13 MiB (measured natively), which a filter VM's Renderer kept for the
// VM's life.
const (
	keepItems = 1 << 12 // messages, parts, calls, members
	keepBytes = 1 << 20
)

// trimmed returns s, or nil when it has room for more than n.
func trimmed[S ~[]E, E any](s S, n int) S {
	if cap(s) > n {
		return nil
	}
	return s
}

// Trim ends a request: the Renderer forgets the body it parsed, and drops
// the scratch space the request grew past what ordinary requests need, so
// that one huge request does not hold its buffers in the heap for the
// Renderer's life (a Wasm VM's memory never shrinks, and a worker's
// Renderer lives as long as its VM). Model and PreviousResponse still
// answer for the request.
func (r *Renderer) Trim() {
	r.Model()
	r.s.b = nil
	r.msgs = trimmed(r.msgs, keepItems)
	r.parts = trimmed(r.parts, keepItems)
	r.kv = trimmed(r.kv, keepItems)
	r.respMsgs = trimmed(r.respMsgs, keepItems)
	r.respCalls = trimmed(r.respCalls, keepItems)
	r.withCalls = trimmed(r.withCalls, keepItems)
	if len(r.callNames) > keepItems {
		r.callNames = nil
	}
	for _, b := range []*[]byte{&r.s.arena, &r.tmp, &r.scratch, &r.conv, &r.convParts, &r.convCalls, &r.convImages, &r.convText} {
		*b = trimmed(*b, keepBytes)
	}
}

// Render appends the canonical text of body to dst[:0] using template t.
// It is Renderer.Render with a pooled Renderer.
func Render(dst []byte, body []byte, t Template) (Prompt, error) {
	r := pool.Get().(*Renderer)
	p, err := r.Render(dst, body, t)
	r.Trim()
	pool.Put(r)
	return p, err
}

// Render appends the canonical text of body to dst[:0] using template t.
func (r *Renderer) Render(dst []byte, body []byte, t Template) (Prompt, error) {
	if err := r.Parse(body); err != nil {
		return Prompt{}, err
	}
	return r.RenderParsed(dst, t)
}

// Parse reads body for RenderParsed, which may then render it under a
// template chosen by its Model. body must stay unchanged until then.
func (r *Renderer) Parse(body []byte) error { return r.ParseAPI(body, OpenAI) }

// Model returns the "model" of the body last parsed, "" when it has none.
func (r *Renderer) Model() string {
	if !r.hasModel && r.req.model.ok {
		r.tmp = r.s.appendStr(r.tmp[:0], r.req.model)
		r.model, r.hasModel = string(r.tmp), true
	}
	return r.model
}

// PreviousResponse returns the previous_response_id of the Responses
// request last parsed, "" for none, even when the request could not be
// rendered: the conversation so far is on the engine that served that
// response, and the rendered text is only what the request adds to it.
func (r *Renderer) PreviousResponse() string { return r.prev }

// RenderParsed appends the canonical text of the body last parsed to dst[:0]
// using template t.
func (r *Renderer) RenderParsed(dst []byte, t Template) (Prompt, error) {
	p := Prompt{Prompts: 1, MaxTokens: r.req.maxTokens, Model: r.Model(), Stream: r.req.stream}
	if r.req.maxCompletion > 0 {
		p.MaxTokens = r.req.maxCompletion
	}
	if r.req.salt.ok {
		r.tmp = r.s.appendStr(r.tmp[:0], r.req.salt)
		p.CacheSalt = string(r.tmp)
	}
	dst = dst[:0]
	var err error
	switch {
	case r.req.messages:
		if len(r.msgs) == 0 {
			return Prompt{}, ErrNoPrompt
		}
		dst, err = r.chat(dst, t)
	case r.req.prompt.ok:
		dst, err = r.completion(dst, t, &p)
	default:
		return Prompt{}, ErrNoPrompt
	}
	if err != nil {
		return Prompt{}, err
	}
	p.Text = dst
	return p, nil
}

func (r *Renderer) chat(dst []byte, t Template) ([]byte, error) {
	switch t {
	case ChatML:
		return r.chatml(dst)
	case Llama3:
		return r.llama3(dst, false)
	case Llama32:
		return r.llama3(dst, true)
	case Mistral:
		return r.mistral(dst)
	case Gemma:
		return r.gemma(dst)
	case Qwen3:
		if r.reasoning {
			return dst, unsupported("reasoning in a Messages or Responses request, which Qwen3 prints")
		}
		return r.qwen3(dst)
	case Plain:
		return r.plain(dst)
	case Harmony:
		return r.harmony(dst)
	}
	return r.generalChat(dst, t)
}

// completion renders a completions prompt.
func (r *Renderer) completion(dst []byte, t Template, p *Prompt) ([]byte, error) {
	s := scanner{b: r.s.b[:r.req.prompt.end], pos: int(r.req.prompt.off)}
	switch s.ws() {
	case '"':
		v, _ := s.str()
		dst = append(dst, t.BOS()...)
		return s.appendStr(dst, v), nil
	case '[':
	default:
		return dst, malformed("prompt is neither a string nor an array")
	}
	// An array: of strings, of token ids, or of arrays of token ids.
	n := 0
	var first byte
	err := s.array(1, func() error {
		c := s.ws()
		if n == 0 {
			first = c
		}
		n++
		switch {
		case first == '"' && c == '"':
			v, err := s.str()
			if n == 1 {
				dst = append(dst, t.BOS()...)
				dst = s.appendStr(dst, v)
			}
			return err
		case first == '[' && c == '[':
			m := 0
			err := s.array(2, func() error {
				m++
				if n == 1 {
					var err error
					dst, err = appendToken(dst, &s)
					return err
				}
				return skipToken(&s)
			})
			if err == nil && m == 0 {
				return malformed("prompt has an empty token array")
			}
			return err
		case first != '"' && first != '[' && c != '"' && c != '[':
			var err error
			dst, err = appendToken(dst, &s)
			return err
		}
		return malformed("prompt mixes strings, token ids and arrays")
	})
	if err != nil {
		return dst, err
	}
	if n == 0 {
		return dst, ErrNoPrompt
	}
	p.Tokens = first != '"'
	if first != '[' && first != '"' {
		n = 1 // one prompt of token ids
	}
	p.Prompts = n
	return dst, nil
}

func skipToken(s *scanner) error {
	_, err := appendToken(nil, s)
	return err
}

// appendToken appends the token id at s as 4 little-endian bytes.
func appendToken(dst []byte, s *scanner) ([]byte, error) {
	s.ws()
	start := s.pos
	isInt, err := s.number()
	if err != nil {
		if s.skip(2) == nil {
			return dst, malformed("a token id is not a number")
		}
		return dst, err
	}
	if !isInt || s.b[start] == '-' || s.pos-start > 10 {
		return dst, malformed("a token id is not a uint32")
	}
	var id uint64
	for _, c := range s.b[start:s.pos] {
		id = id*10 + uint64(c-'0')
	}
	if id > 1<<32-1 {
		return dst, malformed("a token id is not a uint32")
	}
	return append(dst, byte(id), byte(id>>8), byte(id>>16), byte(id>>24)), nil
}
