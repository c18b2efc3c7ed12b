package prompt

import (
	"embed"
	"errors"
	"slices"
	"strconv"
	"sync"

	"github.com/cespare/xxhash/v2"
	"github.com/kvroute/kvroute/shared/jinja"
)

// The general path: a chat template as Jinja source, evaluated by
// shared/jinja on the conversation as vLLM hands it to the template. The
// fast renderers (render.go) follow their templates statement by statement
// on the body in place; this path builds the conversation as values first,
// and costs more (the README measures both), but renders any template the
// evaluator supports.

// templateFS holds the real templates of the families only the general
// path renders (templates/SOURCES.md).
//
//go:embed templates/*.jinja
var templateFS embed.FS

// Jinja is a chat template for the general path.
type Jinja struct {
	t    *jinja.Template
	src  string
	name string
	// special are the tokenizer's special token strings the template may
	// print (bos_token, eos_token, ...).
	special map[string]string
	// parts: the template loops over a message's content, so vLLM passes
	// content as a list of parts (its "openai" content format) instead of
	// one string.
	parts bool
}

// ParseJinja parses a chat template's source. special are the special
// token strings of the model's tokenizer_config.json that the template
// reads (bos_token, eos_token, ...).
func ParseJinja(src string, special map[string]string) (*Jinja, error) {
	t, err := jinja.Parse(src)
	if err != nil {
		return nil, err
	}
	h := xxhash.New()
	h.WriteString(src)
	keys := make([]string, 0, len(special))
	for k := range special {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		h.WriteString("\x00" + k + "\x00" + special[k])
	}
	hex := strconv.FormatUint(h.Sum64(), 16)
	name := CustomPrefix + "0000000000000000"[len(hex):] + hex
	return &Jinja{t: t, src: src, name: name, special: special, parts: t.LoopsOver("content")}, nil
}

// Source returns the template's source.
func (j *Jinja) Source() string { return j.src }

// Special returns the special token strings the template was parsed
// with; the caller must not change the map.
func (j *Jinja) Special() map[string]string { return j.special }

// CustomPrefix starts the name of a template given as source.
const CustomPrefix = "custom:"

// Name names the template by its source and special tokens: CustomPrefix
// and 16 hex digits of their XXH64, so that gateways and cachesync can
// tell whether they hold the same one.
func (j *Jinja) Name() string { return j.name }

// general describes a family the general path renders from an embedded
// template.
type general struct {
	file    string
	special map[string]string
	once    sync.Once
	j       *Jinja
	err     error
}

// generals are the embedded families, by Template; their special tokens
// are those of the model's tokenizer_config.json (templates/SOURCES.md).
var generals = map[Template]*general{
	DeepSeekV31:    {file: "deepseek-v3.1.jinja", special: map[string]string{"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}},
	DeepSeekR1:     {file: "deepseek-r1.jinja", special: map[string]string{"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}},
	GptOss:         {file: "gpt-oss.jinja", special: map[string]string{"bos_token": "<|startoftext|>", "eos_token": "<|return|>"}},
	MistralSmall32: {file: "mistral-small-3.2.jinja", special: map[string]string{"bos_token": "<s>", "eos_token": "</s>"}},
	Phi35:          {file: "phi-3.5.jinja", special: map[string]string{"bos_token": "<s>", "eos_token": "<|endoftext|>"}},
	Granite33:      {file: "granite-3.3.jinja", special: map[string]string{"bos_token": "<|end_of_text|>", "eos_token": "<|end_of_text|>"}},
	Hermes:         {file: "hermes.jinja", special: map[string]string{"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"}},
	// vLLM's examples, with the special tokens of the models they are
	// written for.
	VLLMLlama31JSON:    {file: "vllm-llama3.1-json.jinja", special: map[string]string{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}},
	VLLMLlama4JSON:     {file: "vllm-llama4-json.jinja", special: map[string]string{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot|>"}},
	VLLMLlama4Pythonic: {file: "vllm-llama4-pythonic.jinja", special: map[string]string{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot|>"}},
	VLLMPhi4Mini:       {file: "vllm-phi4-mini.jinja", special: map[string]string{"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}},
	VLLMHermes:         {file: "vllm-hermes.jinja", special: map[string]string{"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"}},
	VLLMChatML:         {file: "vllm-chatml.jinja", special: map[string]string{"eos_token": "<|im_end|>"}},
}

// maxSteps bounds a render's statements and loop passes. A real
// conversation takes a few dozen per message (a 10,000-message chat some
// 300,000); a body of tens of thousands of empty messages would otherwise
// hold a worker for seconds under Wasm (about 1.3 s per MiB with
// DeepSeek-V3.1's template), and is refused instead.
const maxSteps = 1 << 20

// template parses the embedded template once per process.
func (g *general) template() (*Jinja, error) {
	g.once.Do(func() {
		var src []byte
		if src, g.err = templateFS.ReadFile("templates/" + g.file); g.err == nil {
			g.j, g.err = ParseJinja(string(src), g.special)
		}
	})
	return g.j, g.err
}

func (r *Renderer) generalChat(dst []byte, t Template) ([]byte, error) {
	j := r.Custom
	switch {
	case t == Custom && j == nil:
		// A snapshot may name it for a model; this renderer has no source.
		return dst, unsupported("the custom template, for which this renderer has no source")
	case t != Custom:
		g, ok := generals[t]
		if !ok {
			return dst, errors.New("prompt: unknown template " + t.String())
		}
		var err error
		if j, err = g.template(); err != nil {
			return dst, errors.New("prompt: embedded template " + g.file + ": " + err.Error())
		}
	}
	vars, err := r.variables(j)
	if err != nil {
		return dst, err
	}
	out, err := j.t.Render(dst, vars, &jinja.Options{Now: r.Now, MaxSteps: maxSteps})
	if err != nil {
		var je *jinja.Error
		if errors.As(err, &je) {
			return dst, rejected(je.Error())
		}
		return dst, err
	}
	return out, nil
}

// variables builds what vLLM passes to the template: the conversation,
// the tools, add_generation_prompt, the special tokens and
// chat_template_kwargs, each prepared as vLLM prepares it.
func (r *Renderer) variables(j *Jinja) (*jinja.Dict, error) {
	vars := jinja.NewDict(8)
	msgs := jinja.NewList()
	for i := range r.msgs {
		m, err := r.messageValue(&r.msgs[i], i, j.parts)
		if err != nil {
			return nil, err
		}
		msgs.Items = append(msgs.Items, m)
	}
	vars.Set("messages", msgs)
	var tools jinja.Value
	if r.toolsSet() {
		l := jinja.NewList()
		err := r.eachTool(func(_ int, tool raw) error {
			v, err := r.toolValue(tool)
			l.Items = append(l.Items, v)
			return err
		})
		if err != nil {
			return nil, err
		}
		tools = l
	}
	vars.Set("tools", tools)
	vars.Set("documents", nil)
	vars.Set("add_generation_prompt", !r.req.noGen)
	for k, v := range j.special {
		vars.Set(k, v)
	}
	if r.req.kwargs.ok {
		kw, err := jsonValue(r.sub(r.req.kwargs), 1)
		if err != nil {
			return nil, err
		}
		if d, ok := kw.(*jinja.Dict); ok {
			d.Each(func(k string, v jinja.Value) { vars.Set(k, v) })
		}
	}
	return vars, nil
}

// messageValue is vLLM's message for the template: role, content (a
// string, or parts when the template loops over them), tool_calls with
// their arguments parsed, tool_call_id, name.
func (r *Renderer) messageValue(m *message, i int, parts bool) (jinja.Value, error) {
	d := jinja.NewDict(4)
	d.Set("role", string(r.s.appendStr(r.tmp[:0], m.roleName)))
	if !parts {
		d.Set("content", string(r.joined(r.tmp[:0], m)))
	} else {
		l := jinja.NewList()
		if m.kind == contentString {
			l.Items = append(l.Items, textPart(string(r.s.appendStr(r.tmp[:0], m.text))))
		}
		for k := m.p0; m.kind == contentParts && k < m.p1; k++ {
			p := &r.parts[k]
			if p.media && i == 0 && m.role == roleSystem {
				// Gemma-style templates read a leading system message's
				// first part's text; vLLM has none there for media.
				img := jinja.NewDict(1)
				img.Set("type", "image")
				l.Items = append(l.Items, img)
				continue
			}
			l.Items = append(l.Items, textPart(string(r.appendPart(r.tmp[:0], p))))
		}
		d.Set("content", l)
	}
	switch {
	case m.role == roleAssistant && m.calls.ok:
		calls, err := jsonValue(r.sub(m.calls), 3)
		if err != nil {
			return nil, err
		}
		if err := parseArguments(calls); err != nil {
			return nil, err
		}
		d.Set("tool_calls", calls)
	case m.role == roleTool && m.callIDSet:
		if !m.callID.ok {
			return nil, unsupported("a tool_call_id that is not a string")
		}
		d.Set("tool_call_id", string(r.s.appendStr(r.tmp[:0], m.callID)))
	}
	if m.name.ok {
		d.Set("name", string(r.s.appendStr(r.tmp[:0], m.name)))
	}
	return d, nil
}

func textPart(text string) *jinja.Dict {
	p := jinja.NewDict(2)
	p.Set("type", "text")
	p.Set("text", text)
	return p
}

// parseArguments does what vLLM does to each tool call's arguments: a
// JSON string becomes the value it holds, and empty arguments become {}.
func parseArguments(calls jinja.Value) error {
	l, ok := calls.(*jinja.List)
	if !ok {
		return malformed("tool_calls is not an array")
	}
	for _, c := range l.Items {
		call, ok := c.(*jinja.Dict)
		if !ok {
			return malformed("a tool call is not an object")
		}
		fv, _ := call.Get("function")
		fn, ok := fv.(*jinja.Dict)
		if !ok {
			return malformed("a tool call has no function object")
		}
		args, _ := fn.Get("arguments")
		switch a := args.(type) {
		case *jinja.Dict, *jinja.List:
			if jinja.Truthy(a) {
				continue
			}
		case string:
			if a != "" {
				v, err := parseJSONText(a)
				if err != nil {
					return malformed("a tool call's arguments are not JSON")
				}
				fn.Set("arguments", v)
				continue
			}
		default:
			if jinja.Truthy(a) {
				return malformed("a tool call's arguments are neither a string nor an object")
			}
		}
		fn.Set("arguments", jinja.NewDict(0))
	}
	return nil
}

// parseJSONText parses a JSON document held in a string.
func parseJSONText(text string) (jinja.Value, error) {
	s := &scanner{b: []byte(text)}
	v, err := jsonValue(s, 4)
	if err == nil && !s.atEnd() {
		err = ErrInvalidJSON
	}
	return v, err
}

// toolValue is vLLM's model_dump of a tool: type "function", then function
// with name, description and parameters first (None when absent), then the
// tool's other members.
func (r *Renderer) toolValue(tool raw) (jinja.Value, error) {
	v, err := jsonValue(r.sub(tool), 2)
	if err != nil {
		return nil, err
	}
	t, ok := v.(*jinja.Dict)
	if !ok {
		return nil, malformed("a tool is not an object")
	}
	fv, _ := t.Get("function")
	fn, ok := fv.(*jinja.Dict)
	if !ok {
		return nil, malformed("a tool has no function object")
	}
	if name, ok := fn.Get("name"); !ok || name == nil {
		return nil, malformed("a tool's function has no name")
	}
	nfn := jinja.NewDict(fn.Len() + 2)
	for _, k := range [...]string{"name", "description", "parameters"} {
		v, _ := fn.Get(k)
		nfn.Set(k, v)
	}
	fn.Each(func(k string, v jinja.Value) { nfn.Set(k, v) })
	nt := jinja.NewDict(t.Len())
	nt.Set("type", "function")
	nt.Set("function", nfn)
	t.Each(func(k string, v jinja.Value) {
		if k != "type" && k != "function" {
			nt.Set(k, v)
		}
	})
	return nt, nil
}

// jsonValue reads the JSON value at s as Python's json.loads would.
func jsonValue(s *scanner, depth int) (jinja.Value, error) {
	switch c := s.ws(); c {
	case '{':
		d := jinja.NewDict(4)
		err := s.object(depth, func(key str) error {
			k := string(s.appendStr(nil, key))
			v, err := jsonValue(s, depth+1)
			d.Set(k, v)
			return err
		})
		return d, err
	case '[':
		l := jinja.NewList()
		err := s.array(depth, func() error {
			v, err := jsonValue(s, depth+1)
			l.Items = append(l.Items, v)
			return err
		})
		return l, err
	case '"':
		v, err := s.str()
		return string(s.appendStr(nil, v)), err
	case 't':
		return true, s.literal("true")
	case 'f':
		return false, s.literal("false")
	case 'n':
		return nil, s.literal("null")
	}
	start := s.pos
	if _, err := s.number(); err != nil {
		return nil, err
	}
	return jinja.Number(string(s.b[start:s.pos]))
}
