package prompt

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/shared/blockhash"
	"github.com/tidwall/gjson"
)

// chatBody returns a chat request of about size bytes: a system message and
// alternating user and assistant turns of about 1 KiB each. With escaped,
// every content carries quotes, newlines and a \u escape.
func chatBody(size int, escaped bool) []byte {
	unit := "The quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. "
	if escaped {
		unit = `The \"quick\" brown fox jumps over the lazy dog,\npack my box with five dozen caf\u00e9 jugs. `
	}
	content := strings.Repeat(unit, 1024/len(unit))
	var b strings.Builder
	b.WriteString(`{"model":"Qwen/Qwen2.5-7B-Instruct","stream":true,"messages":[{"role":"system","content":"You are a helpful assistant."}`)
	for i := 0; b.Len() < size; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		b.WriteString(`,{"role":"` + role + `","content":"` + content + `"}`)
	}
	b.WriteString(`],"max_tokens":256,"temperature":0.7}`)
	return []byte(b.String())
}

// benchmarkRender measures what the filter does with a body: render it and
// hash its blocks.
func benchmarkRender(b *testing.B, t Template, escaped bool) {
	body := chatBody(512<<10, escaped)
	var r Renderer
	text := make([]byte, 0, len(body))
	hashes := make([]uint64, 0, len(body)/64)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		p, err := r.Render(text, body, t)
		if err != nil {
			b.Fatal(err)
		}
		hashes = blockhash.Append(hashes[:0], blockhash.Seed(p.Model, ""), p.Text, blockhash.Config{})
		text = p.Text // keep the grown buffer, as the filter does
	}
}

func BenchmarkRenderAppendChatML512KiB(b *testing.B)         { benchmarkRender(b, ChatML, false) }
func BenchmarkRenderAppendChatML512KiBEscaped(b *testing.B)  { benchmarkRender(b, ChatML, true) }
func BenchmarkRenderAppendLlama3512KiB(b *testing.B)         { benchmarkRender(b, Llama3, false) }
func BenchmarkRenderAppendLlama3512KiBEscaped(b *testing.B)  { benchmarkRender(b, Llama3, true) }
func BenchmarkRenderAppendGemma512KiBEscaped(b *testing.B)   { benchmarkRender(b, Gemma, true) }
func BenchmarkRenderAppendMistral512KiBEscaped(b *testing.B) { benchmarkRender(b, Mistral, true) }
func BenchmarkRenderAppendQwen3512KiB(b *testing.B)          { benchmarkRender(b, Qwen3, false) }
func BenchmarkRenderAppendQwen3512KiBEscaped(b *testing.B)   { benchmarkRender(b, Qwen3, true) }

// BenchmarkRender512KiB is Render alone, through the package-level pool.
func BenchmarkRender512KiB(b *testing.B) {
	body := chatBody(512<<10, false)
	text := make([]byte, 0, len(body))
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		p, err := Render(text, body, ChatML)
		if err != nil {
			b.Fatal(err)
		}
		text = p.Text
	}
}

// benchmarkGJSON is the baseline the README's ratios refer to: validate with
// gjson, then ForEach over messages with Get per field and .Str contents.
func benchmarkGJSON(b *testing.B, escaped bool) {
	body := chatBody(512<<10, escaped)
	text := make([]byte, 0, len(body))
	hashes := make([]uint64, 0, len(body)/64)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if !gjson.ValidBytes(body) {
			b.Fatal("invalid")
		}
		root := gjson.ParseBytes(body)
		text = text[:0]
		root.Get("messages").ForEach(func(_, m gjson.Result) bool {
			text = append(text, "<|im_start|>"...)
			text = append(text, m.Get("role").Str...)
			text = append(text, '\n')
			text = append(text, m.Get("content").Str...)
			text = append(text, "<|im_end|>\n"...)
			return true
		})
		hashes = blockhash.Append(hashes[:0], blockhash.Seed(root.Get("model").Str, ""), text, blockhash.Config{})
	}
}

func BenchmarkGJSONBaseline512KiB(b *testing.B)        { benchmarkGJSON(b, false) }
func BenchmarkGJSONBaseline512KiBEscaped(b *testing.B) { benchmarkGJSON(b, true) }

func TestRenderDoesNotAllocate(t *testing.T) {
	bodies := map[string][]byte{"long escaped chat": chatBody(64<<10, true)}
	for _, c := range loadReference(t).Cases {
		if c.Name == "tool_flow" || c.Name == "parts" || c.Name == "arguments_numbers" {
			bodies[c.Name] = []byte(c.Body)
		}
	}
	for name, body := range bodies {
		for _, tmpl := range Templates() {
			if generals[tmpl] != nil || (tmpl == Harmony && bytes.Contains(body, []byte(`"tools"`))) {
				// The general path builds values (BenchmarkRender), and
				// so does harmony's tool section, for its schemas.
				continue
			}
			var r Renderer
			text := make([]byte, 0, 2*len(body))
			if _, err := r.Render(text, body, tmpl); err != nil { // warm the scratch space
				continue // a template that rejects the conversation
			}
			n := testing.AllocsPerRun(5, func() { r.Render(text, body, tmpl) })
			// Prompt.Model is the one allocation: a string copied out of the body.
			if n > 1 {
				t.Errorf("%s/%s: Render allocates %v times per call", name, tmpl, n)
			}
		}
	}
}

// BenchmarkRenderPath compares the general path (DeepSeek-V3.1's and
// gpt-oss's real templates under shared/jinja) with a fast renderer on the
// same bodies: 16 KiB, a typical chat, and 512 KiB.
func BenchmarkRenderPath(b *testing.B) {
	for _, size := range []int{16 << 10, 512 << 10} {
		for _, t := range []Template{ChatML, DeepSeekV31, GptOss, Harmony} {
			b.Run(t.String()+"/"+strconv.Itoa(size>>10)+"KiB", func(b *testing.B) {
				body := chatBody(size, true)
				r := Renderer{Now: func() time.Time { return time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC) }}
				text := make([]byte, 0, 2*len(body))
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					p, err := r.Render(text, body, t)
					if err != nil {
						b.Fatal(err)
					}
					text = p.Text
				}
			})
		}
	}
}
