package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/shared/prompt"
)

func TestLoadTemplate(t *testing.T) {
	const src = "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor %}"
	body := []byte(`{"messages":[{"role":"user","content":"hi"}]}`)
	render := func(t *testing.T, j *prompt.Jinja) string {
		t.Helper()
		r := prompt.Renderer{Custom: j}
		p, err := r.Render(nil, body, prompt.Custom)
		if err != nil {
			t.Fatal(err)
		}
		return string(p.Text)
	}
	write := func(t *testing.T, dir, name, content string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name, file string
		files      map[string]string
		want       string // the render, or an error's substring after "error: "
	}{
		{"tokenizer_config with AddedTokens", "tokenizer_config.json", map[string]string{
			"tokenizer_config.json": `{"chat_template": ` + quote(src) + `, "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>"}`,
		}, "<s>user: hi</s>"},
		{"named templates", "tokenizer_config.json", map[string]string{
			"tokenizer_config.json": `{"chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": ` + quote(src) + `}], "bos_token": "<b>"}`,
		}, "<b>user: hi"},
		{"jinja beside a tokenizer_config", "chat_template.jinja", map[string]string{
			"chat_template.jinja":   src,
			"tokenizer_config.json": `{"eos_token": "<e>"}`,
		}, "user: hi<e>"},
		{"jinja alone", "t.jinja", map[string]string{"t.jinja": src}, "user: hi"},
		{"no template", "tokenizer_config.json", map[string]string{"tokenizer_config.json": `{"bos_token": "<s>"}`}, "error: no chat_template"},
		{"bad Jinja", "t.jinja", map[string]string{"t.jinja": "{% for %}"}, "error: t.jinja"},
		{"missing", "none.jinja", nil, "error: no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, content := range tt.files {
				write(t, dir, name, content)
			}
			j, err := loadTemplate(filepath.Join(dir, tt.file))
			if want, isErr := strings.CutPrefix(tt.want, "error: "); isErr {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("err = %v, want one containing %q", err, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := render(t, j); got != tt.want {
				t.Errorf("render = %q, want %q", got, tt.want)
			}
		})
	}
}

func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"` }

func TestBesideTokenizer(t *testing.T) {
	tests := []struct {
		name     string
		files    map[string]string
		tokenize string // -tokenizer, relative to the directory
		want     string // the file found, relative; "" for none
	}{
		{"template in tokenizer_config", map[string]string{"tokenizer.json": "{}", "tokenizer_config.json": `{"chat_template": "x"}`}, "tokenizer.json", "tokenizer_config.json"},
		{"the model directory", map[string]string{"tokenizer.json": "{}", "tokenizer_config.json": `{"chat_template": "x"}`}, ".", "tokenizer_config.json"},
		{"chat_template.jinja first", map[string]string{"tokenizer.json": "{}", "chat_template.jinja": "x", "tokenizer_config.json": `{"chat_template": "y"}`}, "tokenizer.json", "chat_template.jinja"},
		{"config without a template", map[string]string{"tokenizer.json": "{}", "tokenizer_config.json": `{"bos_token": "<s>", "chat_template": null}`}, "tokenizer.json", ""},
		{"no config", map[string]string{"tokenizer.json": "{}"}, "tokenizer.json", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, content := range tt.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			want := ""
			if tt.want != "" {
				want = filepath.Join(dir, tt.want)
			}
			if got := besideTokenizer(filepath.Join(dir, tt.tokenize)); got != want {
				t.Errorf("besideTokenizer = %q, want %q", got, want)
			}
		})
	}
	if got := besideTokenizer("cl100k_base"); got != "" {
		t.Errorf("a built-in encoding has a template beside it: %q", got)
	}
}
