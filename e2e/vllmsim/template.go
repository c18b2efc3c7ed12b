package vllmsim

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"

	"github.com/kvroute/kvroute/shared/prompt"
)

// The chat templates are real HuggingFace templates (templates/SOURCES.md).
//
//go:embed templates/*.jinja
var templateFS embed.FS

// family is what a template family needs besides its source: the special
// token strings its tokenizer_config.json defines, and whether the
// tokenizer prepends BOS to a completions prompt.
type family struct {
	bos, eos string
	addBOS   bool
}

var families = map[string]family{
	"chatml":   {bos: "", eos: "<|im_end|>"},
	"llama3":   {bos: "<|begin_of_text|>", eos: "<|eot_id|>", addBOS: true},
	"mistral":  {bos: "<s>", eos: "</s>", addBOS: true},
	"gemma":    {bos: "<bos>", eos: "<eos>", addBOS: true},
	"qwen3":    {bos: "", eos: "<|im_end|>"},
	"llama3.2": {bos: "<|begin_of_text|>", eos: "<|eot_id|>", addBOS: true},
	// Families an engine renders when started with their template's
	// source (shared/prompt/templates): their special tokens.
	"deepseek-v3.1":     {bos: "<｜begin▁of▁sentence｜>", eos: "<｜end▁of▁sentence｜>", addBOS: true},
	"deepseek-r1":       {bos: "<｜begin▁of▁sentence｜>", eos: "<｜end▁of▁sentence｜>", addBOS: true},
	"gpt-oss":           {bos: "<|startoftext|>", eos: "<|return|>"},
	"mistral-small-3.2": {bos: "<s>", eos: "</s>", addBOS: true},
	"phi-3.5":           {bos: "<s>", eos: "<|endoftext|>", addBOS: true},
	"granite-3.3":       {bos: "<|end_of_text|>", eos: "<|end_of_text|>"},
	"hermes":            {bos: "<|begin_of_text|>", eos: "<|im_end|>", addBOS: true},
	// Models served here only with a template given as source (vLLM's
	// examples): their tokenizers' special tokens.
	"llama4":    {bos: "<|begin_of_text|>", eos: "<|eot|>", addBOS: true},
	"phi4-mini": {bos: "<|endoftext|>", eos: "<|endoftext|>"},
}

// models maps served model names, by lower-case prefix, to the family
// whose template they ship.
var models = []struct{ prefix, family string }{
	{"qwen/qwen2.5-", "chatml"},
	{"qwen/qwen3-", "qwen3"}, // the hybrid thinking models (not -Coder, -2507)
	{"meta-llama/llama-3.1-", "llama3"},
	{"meta-llama/llama-3.3-", "llama3"},
	{"meta-llama/llama-3.2-", "llama3.2"},
	{"meta-llama/meta-llama-3.1-", "llama3"},
	{"mistralai/mistral-nemo-instruct-2407", "mistral"},
	{"google/gemma-3-", "gemma"},
	{"deepseek-ai/deepseek-v3.1", "deepseek-v3.1"},
	{"deepseek-ai/deepseek-r1", "deepseek-r1"},
	{"openai/gpt-oss-", "gpt-oss"},
	{"mistralai/mistral-small-3.2-", "mistral-small-3.2"},
	{"microsoft/phi-3.5-", "phi-3.5"},
	{"ibm-granite/granite-3.3-", "granite-3.3"},
	{"nousresearch/hermes-3-", "hermes"},
	{"meta-llama/llama-4-", "llama4"},
	{"microsoft/phi-4-mini-", "phi4-mini"},
}

// familyOf returns the template family of a served model name, or "".
func familyOf(model string) string {
	m := strings.ToLower(model)
	for _, e := range models {
		if strings.HasPrefix(m, e.prefix) {
			return e.family
		}
	}
	return ""
}

// chatTemplate renders chat requests the way vLLM's chat endpoint does
// (transformers' apply_chat_template): Jinja with the model's template,
// messages, add_generation_prompt, tools, bos_token and eos_token.
type chatTemplate struct {
	tmpl *jinja.Template
	fam  family
	// listContent: the template iterates over message content, so content
	// parts are passed as a list (vLLM's "openai" content format) rather
	// than joined into one string.
	listContent bool
}

// iteratesContent is the test vLLM's content-format detection applies:
// does the template loop over a message's content?
var iteratesContent = regexp.MustCompile(`for\s+\w+\s+in\s+message(\[\s*['"]content['"]\s*\]|\.content)`)

// newChatTemplate compiles the template named by spec (an embedded family
// name) or spec itself as Jinja source; with spec empty, the model's
// family. It returns nil, nil when the model has no known template.
func newChatTemplate(spec, model string) (*chatTemplate, error) {
	fam, src := familyOf(model), spec
	switch {
	case spec == "" && fam == "":
		return nil, nil
	case spec == "":
		src = fam
	case !strings.Contains(spec, "{"):
		if _, ok := families[spec]; !ok {
			return nil, fmt.Errorf("vllmsim: unknown chat template %q (want chatml, llama3, llama3.2, mistral, gemma, qwen3 or Jinja source)", spec)
		}
	}
	if _, ok := families[src]; ok {
		fam = src
		b, err := templateFS.ReadFile("templates/" + src + ".jinja")
		if err != nil {
			return nil, fmt.Errorf("vllmsim: read template %s: %w", src, err)
		}
		src = string(b)
	}
	t, err := jinja.Compile(withPyToJSON(src))
	if err != nil {
		return nil, fmt.Errorf("vllmsim: compile chat template: %w", err)
	}
	return &chatTemplate{tmpl: t, fam: families[fam], listContent: iteratesContent.MatchString(src)}, nil
}

// chatRender is what a chat request puts into the template.
type chatRender struct {
	messages            json.RawMessage
	tools               json.RawMessage // null or absent: not passed
	addGenerationPrompt bool
	continueFinal       bool
	kwargs              json.RawMessage // chat_template_kwargs
	// now is the clock strftime_now reads; zero means time.Now.
	now time.Time
}

// render returns the prompt text of a chat request, or an error that
// describes the bad request.
func (c *chatTemplate) render(in chatRender) (text string, err error) {
	raw, err := jsonValue(in.messages)
	if err != nil {
		return "", fmt.Errorf("messages: %w", err)
	}
	msgs, err := conversation(raw, c.content)
	if err != nil {
		return "", err
	}
	items := msgs.AsList().Items
	last, _ := items[len(items)-1].AsDict().Get("content")
	finalContent := contentText(last)
	vars := map[string]jinja.Value{
		"messages":              msgs,
		"add_generation_prompt": jinja.NewBool(in.addGenerationPrompt),
		"bos_token":             jinja.NewString(c.fam.bos),
		"eos_token":             jinja.NewString(c.fam.eos),
		pyFilter:                pyToJSON,
		"strftime_now":          strftimeNow(in.now),
	}
	if len(in.tools) > 0 && !bytes.Equal(bytes.TrimSpace(in.tools), []byte("null")) {
		tools, err := jsonValue(in.tools)
		if err == nil {
			tools, err = dumpTools(tools)
		}
		if err != nil {
			return "", err
		}
		vars["tools"] = tools
	}
	if len(in.kwargs) > 0 && !bytes.Equal(bytes.TrimSpace(in.kwargs), []byte("null")) {
		kw, err := jsonValue(in.kwargs)
		if err != nil || !kw.IsDict() {
			return "", errors.New("chat_template_kwargs must be an object")
		}
		for _, k := range kw.AsDict().OrderedKeys() {
			vars[k], _ = kw.AsDict().Get(k)
		}
	}
	text, err = c.exec(vars)
	if err != nil {
		return "", err
	}
	if in.continueFinal {
		// As vLLM does: cut the text after the final message's content so
		// that generation continues it.
		i := strings.LastIndex(text, finalContent)
		if finalContent == "" || i < 0 {
			return "", errors.New("continue_final_message: the final message's content is not in the rendered prompt")
		}
		text = text[:i+len(finalContent)]
	}
	return text, nil
}

// exec renders, turning a panic inside the template engine into an error:
// request data must never crash the engine.
func (c *chatTemplate) exec(vars map[string]jinja.Value) (text string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("chat template failed: %v", r)
		}
	}()
	text, err = c.tmpl.RenderValues(vars)
	if err != nil {
		return "", fmt.Errorf("chat template: %w", err)
	}
	return text, nil
}

// content normalises one message's content: a string stays; a list of text
// parts, or null (no parts), becomes their texts joined by newlines (vLLM's
// "string" content format) or a list of {type: text, text} parts ("openai"
// format).
func (c *chatTemplate) content(v jinja.Value) (jinja.Value, error) {
	if v.IsString() {
		return v, nil
	}
	if v.IsNone() || v.IsUndefined() {
		v = jinja.NewList(nil)
	}
	if !v.IsList() {
		return v, errors.New("must be a string, null or a list of parts")
	}
	var texts []string
	for _, p := range v.AsList().Items {
		if !p.IsDict() {
			return v, errors.New("content parts must be objects")
		}
		typ, _ := p.AsDict().Get("type")
		txt, ok := p.AsDict().Get("text")
		if !typ.IsString() || typ.AsString() != "text" || !ok || !txt.IsString() {
			return v, errors.New("only text content parts are supported")
		}
		texts = append(texts, txt.AsString())
	}
	if !c.listContent {
		return jinja.NewString(strings.Join(texts, "\n")), nil
	}
	parts := make([]jinja.Value, len(texts))
	for i, t := range texts {
		d := jinja.NewDict()
		d.AsDict().Set("type", jinja.NewString("text"))
		d.AsDict().Set("text", jinja.NewString(t))
		parts[i] = d
	}
	return jinja.NewList(parts), nil
}

func contentText(v jinja.Value) string {
	if v.IsString() {
		return v.AsString()
	}
	if !v.IsList() {
		return ""
	}
	var b strings.Builder
	for _, p := range v.AsList().Items {
		t, _ := p.AsDict().Get("text")
		b.WriteString(t.AsString())
	}
	return b.String()
}

// jsonValue converts JSON to a template value, keeping object key order
// (Python dicts keep insertion order, and tojson shows it) and integers
// apart from floats.
func jsonValue(raw json.RawMessage) (jinja.Value, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	v, err := decodeValue(d)
	if err != nil {
		return v, err
	}
	if _, err := d.Token(); err == nil {
		return v, errors.New("trailing data after JSON value")
	}
	return v, nil
}

func decodeValue(d *json.Decoder) (jinja.Value, error) {
	t, err := d.Token()
	if err != nil {
		return jinja.Value{}, err
	}
	switch t := t.(type) {
	case json.Delim:
		switch t {
		case '{':
			v := jinja.NewDict()
			for d.More() {
				k, err := d.Token()
				if err != nil {
					return v, err
				}
				x, err := decodeValue(d)
				if err != nil {
					return v, err
				}
				v.AsDict().Set(k.(string), x)
			}
			_, err := d.Token()
			return v, err
		case '[':
			var items []jinja.Value
			for d.More() {
				x, err := decodeValue(d)
				if err != nil {
					return x, err
				}
				items = append(items, x)
			}
			_, err := d.Token()
			return jinja.NewList(items), err
		}
		return jinja.Value{}, fmt.Errorf("unexpected %v", t)
	case json.Number:
		return jinja.FromGoValue(t), nil
	case string:
		return jinja.NewString(t), nil
	case bool:
		return jinja.NewBool(t), nil
	case nil:
		return jinja.None(), nil
	}
	return jinja.Value{}, fmt.Errorf("unexpected JSON token %v", t)
}

// harmony reports whether the engine renders chat completions through
// openai-harmony instead of its chat template, as vLLM does for every
// gpt-oss model (use_harmony, by model type) whatever --chat-template
// says. Its /tokenize still applies the template.
func (e *Engine) harmony() bool { return familyOf(e.cfg.Model) == "gpt-oss" }

// harmonyPrompt renders a chat request as vLLM's harmony path does, with
// shared/prompt's Harmony renderer: its cases are pinned to the real
// openai-harmony encoder (shared/prompt/testdata/harmony.json), which the
// simulator cannot run.
func harmonyPrompt(req *genRequest) (string, error) {
	body, err := json.Marshal(struct {
		Messages        json.RawMessage `json:"messages"`
		Tools           json.RawMessage `json:"tools,omitempty"`
		ReasoningEffort json.RawMessage `json:"reasoning_effort,omitempty"`
	}{req.Messages, req.Tools, req.ReasoningEffort})
	if err != nil {
		return "", err
	}
	p, err := prompt.Render(nil, body, prompt.Harmony)
	if err != nil {
		return "", err
	}
	return string(p.Text), nil
}
