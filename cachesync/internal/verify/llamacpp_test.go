//go:build realengine

package verify

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvroute/kvroute/e2e/llamacpp"
	"github.com/kvroute/kvroute/shared/prompt"
)

// TestLlamaCppJinjaAgrees renders the probe set with llama.cpp's own Jinja
// engine (llama-server --chat-template-file, POST /apply-template), a
// second implementation beside Python's Jinja2 that shared/prompt's
// reference renders come from, for every template file kvroute renders.
// Tool probes that llama.cpp cannot build a parser for (Mistral Nemo's and
// Gemma 3's templates) are refused, not compared.
func TestLlamaCppJinjaAgrees(t *testing.T) {
	in, err := llamacpp.Find()
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := filepath.Abs("../../../e2e/vllmsim/templates")
	for _, tmpl := range prompt.Templates() {
		if tmpl == prompt.Plain || tmpl > prompt.Llama32 {
			// The general path's templates print their own models'
			// tokens, and only a Gemma model is at hand; they are
			// checked against Jinja2 and the simulator instead.
			continue
		}
		t.Run(tmpl.String(), func(t *testing.T) {
			file := filepath.Join(dir, tmpl.String()+".jinja")
			if _, err := os.Stat(file); err != nil {
				t.Fatal(err)
			}
			s, err := llamacpp.Start(context.Background(), in, llamacpp.Config{Slots: 1, Context: 2048, ChatTemplateFile: file,
				// Close a final assistant message, as vLLM does, instead of
				// leaving it open to be continued (llama.cpp's default).
				Args: []string{"--no-prefill-assistant"}})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Stop()
			r, err := FetchApplied(context.Background(), http.DefaultClient, s.URL(), llamacpp.Model)
			if err != nil {
				t.Fatal(err)
			}
			// Only a Gemma model is at hand, so the templates of other
			// families print its tokens where they print the model's:
			// its EOS in Mistral's turns. And llama.cpp gives every
			// template today's date_string (common_chat_extra_context),
			// where Jinja2 leaves Llama 3.1's default, 26 Jul 2024.
			today := []byte(r.At.Format("02 Jan 2006"))
			for i, text := range r.Texts {
				if tmpl == prompt.Mistral {
					text = bytes.ReplaceAll(text, []byte("<eos>"), []byte("</s>"))
				}
				if tmpl == prompt.Llama3 {
					text = bytes.ReplaceAll(text, today, []byte("26 Jul 2024"))
				}
				r.Texts[i] = text
			}
			a := Compare(r, tmpl, nil)
			t.Logf("%v; refused: %q", a, r.Refused)
			if !a.Agrees() {
				t.Errorf("llama.cpp's render of %s disagrees with kvroute's: %v", file, a)
			}
		})
	}
}
