// Package prompt turns an OpenAI-style request body into the text an engine
// tokenizes.
package prompt

import (
	"errors"
	"strconv"

	"github.com/tidwall/gjson"
)

// Template names a chat-template family.
type Template uint8

// The chat-template families kvroute renders.
const (
	Plain Template = iota
	ChatML
	Llama3
	Mistral
	Gemma
)

// ParseTemplate returns the template with the given configuration name.
func ParseTemplate(name string) (Template, error) {
	switch name {
	case "plain":
		return Plain, nil
	case "chatml":
		return ChatML, nil
	case "llama3":
		return Llama3, nil
	case "mistral":
		return Mistral, nil
	case "gemma":
		return Gemma, nil
	}
	return 0, errors.New("unknown chat template " + strconv.Quote(name))
}

// Prompt is a rendered request.
type Prompt struct {
	Model string // the request's "model"
	Text  []byte // canonical text; shares storage with the dst passed to Render
}

// Errors Render returns; the filter turns each into a fallback.
var (
	ErrInvalidJSON = errors.New("prompt: body is not a JSON object")
	ErrNoPrompt    = errors.New("prompt: body has neither messages nor prompt")
)

// Render appends the canonical text of body to dst[:0] using template t.
// Placeholder: joins roles and contents; replaced by the template renderers.
func Render(dst []byte, body []byte, t Template) (Prompt, error) {
	if !gjson.ValidBytes(body) {
		return Prompt{}, ErrInvalidJSON
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return Prompt{}, ErrInvalidJSON
	}
	p := Prompt{Model: root.Get("model").String()}
	dst = dst[:0]
	if msgs := root.Get("messages"); msgs.IsArray() {
		msgs.ForEach(func(_, m gjson.Result) bool {
			dst = append(dst, m.Get("role").String()...)
			dst = append(dst, '\n')
			dst = append(dst, m.Get("content").String()...)
			dst = append(dst, '\n')
			return true
		})
	} else if pr := root.Get("prompt"); pr.Type == gjson.String {
		dst = append(dst, pr.Str...)
	} else {
		return Prompt{}, ErrNoPrompt
	}
	p.Text = dst
	return p, nil
}
