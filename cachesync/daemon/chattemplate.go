package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kvroute/kvroute/shared/prompt"
)

// tokenizerConfig is what a model's tokenizer_config.json says about its
// chat template.
type tokenizerConfig struct {
	// ChatTemplate is a string, or a list of named templates of which
	// "default" is the one the chat endpoint uses.
	ChatTemplate json.RawMessage `json:"chat_template"`
	// Special token strings, each a string or an AddedToken object.
	BOS json.RawMessage `json:"bos_token"`
	EOS json.RawMessage `json:"eos_token"`
	UNK json.RawMessage `json:"unk_token"`
	PAD json.RawMessage `json:"pad_token"`
}

// loadTemplate reads the chat template of -chat-template-file: a
// tokenizer_config.json, or a .jinja file whose special tokens come from a
// tokenizer_config.json beside it, when there is one.
func loadTemplate(path string) (*prompt.Jinja, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	src := string(b)
	cfgPath := filepath.Join(filepath.Dir(path), "tokenizer_config.json")
	if strings.HasSuffix(path, ".json") {
		cfgPath, src = path, ""
	}
	special := map[string]string{}
	if cb, err := os.ReadFile(cfgPath); err == nil {
		var tc tokenizerConfig
		if err := json.Unmarshal(cb, &tc); err != nil {
			return nil, fmt.Errorf("%s: %w", cfgPath, err)
		}
		for name, raw := range map[string]json.RawMessage{"bos_token": tc.BOS, "eos_token": tc.EOS, "unk_token": tc.UNK, "pad_token": tc.PAD} {
			if tok := tokenString(raw); tok != "" {
				special[name] = tok
			}
		}
		if src == "" {
			if src, err = chatTemplate(tc.ChatTemplate); err != nil {
				return nil, fmt.Errorf("%s: %w", cfgPath, err)
			}
		}
	} else if src == "" {
		return nil, err
	}
	j, err := prompt.ParseJinja(src, special)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return j, nil
}

// besideTokenizer finds the chat template of the model whose vocabulary
// -tokenizer names (a tokenizer.json, or the model directory holding one):
// a chat_template.jinja there, else the chat_template of its
// tokenizer_config.json, as transformers loads them. "" when there is none.
func besideTokenizer(tokenizer string) string {
	dir := tokenizer
	if fi, err := os.Stat(tokenizer); err != nil {
		return "" // a built-in encoding's name
	} else if !fi.IsDir() {
		dir = filepath.Dir(tokenizer)
	}
	if p := filepath.Join(dir, "chat_template.jinja"); exists(p) {
		return p
	}
	p := filepath.Join(dir, "tokenizer_config.json")
	b, err := os.ReadFile(p)
	if err != nil {
		return ""
	}
	var tc tokenizerConfig
	if json.Unmarshal(b, &tc) != nil || len(tc.ChatTemplate) == 0 || string(tc.ChatTemplate) == "null" {
		return ""
	}
	return p
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// tokenString reads a special token: a string, or an AddedToken's content.
func tokenString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var added struct{ Content string }
	if json.Unmarshal(raw, &added) == nil {
		return added.Content
	}
	return ""
}

func chatTemplate(raw json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil && s != "" {
		return s, nil
	}
	var named []struct{ Name, Template string }
	if json.Unmarshal(raw, &named) == nil {
		for _, n := range named {
			if n.Name == "default" {
				return n.Template, nil
			}
		}
	}
	return "", errors.New("no chat_template (a string, or a list with a \"default\")")
}
