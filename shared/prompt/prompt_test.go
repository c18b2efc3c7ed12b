package prompt

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

func TestParseTemplate(t *testing.T) {
	tests := []struct {
		name    string
		want    Template
		wantErr bool
	}{
		{"plain", Plain, false},
		{"chatml", ChatML, false},
		{"llama3", Llama3, false},
		{"mistral", Mistral, false},
		{"gemma", Gemma, false},
		{"ChatML", 0, true},
		{"", 0, true},
		{"qwen", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseTemplate(tt.name)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseTemplate(%q) = %v, %v", tt.name, got, err)
		}
		if err == nil && got.String() != tt.name {
			t.Errorf("%v.String() = %q", got, got.String())
		}
	}
}

func TestRenderErrors(t *testing.T) {
	deep := strings.Repeat(`[`, 200) + strings.Repeat(`]`, 200)
	tests := []struct {
		name string
		body string
		want error
	}{
		{"empty", ``, ErrInvalidJSON},
		{"not an object", `[{"role":"user","content":"x"}]`, ErrInvalidJSON},
		{"null", `null`, ErrInvalidJSON},
		{"truncated", `{"messages":[{"role":"user","content":"x"}]`, ErrInvalidJSON},
		{"trailing garbage", `{"prompt":"x"} {}`, ErrInvalidJSON},
		{"trailing comma", `{"prompt":"x",}`, ErrInvalidJSON},
		{"single quotes", `{'prompt':'x'}`, ErrInvalidJSON},
		{"raw newline in string", "{\"prompt\":\"a\nb\"}", ErrInvalidJSON},
		{"bad escape", `{"prompt":"a\x"}`, ErrInvalidJSON},
		{"short unicode escape", `{"prompt":"a\u12"}`, ErrInvalidJSON},
		{"bad unicode escape in text", `{"messages":[{"role":"user","content":"a\u12G4"}]}`, ErrInvalidJSON},
		{"leading zero", `{"max_tokens":01,"prompt":"x"}`, ErrInvalidJSON},
		{"bare minus", `{"max_tokens":-,"prompt":"x"}`, ErrInvalidJSON},
		{"bad literal", `{"stream":tru,"prompt":"x"}`, ErrInvalidJSON},
		{"unterminated string", `{"prompt":"abc`, ErrInvalidJSON},
		{"no prompt", `{"model":"m"}`, ErrNoPrompt},
		{"empty object", `{}`, ErrNoPrompt},
		{"empty messages", `{"messages":[]}`, ErrNoPrompt},
		{"null messages", `{"messages":null}`, ErrNoPrompt},
		{"empty prompt array", `{"prompt":[]}`, ErrNoPrompt},
		{"messages not an array", `{"messages":{"role":"user"}}`, ErrMalformed},
		{"message not an object", `{"messages":["hi"]}`, ErrMalformed},
		{"no role", `{"messages":[{"content":"hi"}]}`, ErrMalformed},
		{"role not a string", `{"messages":[{"role":1,"content":"hi"}]}`, ErrMalformed},
		{"content a number", `{"messages":[{"role":"user","content":5}]}`, ErrMalformed},
		{"part a number", `{"messages":[{"role":"user","content":[5]}]}`, ErrMalformed},
		{"part without type", `{"messages":[{"role":"user","content":[{"text":"x"}]}]}`, ErrMalformed},
		{"text part without text", `{"messages":[{"role":"user","content":[{"type":"text"}]}]}`, ErrMalformed},
		{"unknown part type", `{"messages":[{"role":"user","content":[{"type":"hologram","hologram":{}}]}]}`, ErrMalformed},
		{"tool call without function", `{"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"a"}]}]}`, ErrMalformed},
		{"arguments not JSON", `{"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f","arguments":"{oops"}}]}]}`, ErrMalformed},
		{"tools not an array", `{"tools":{},"messages":[{"role":"user","content":"x"}]}`, ErrMalformed},
		{"tool without name", `{"tools":[{"type":"function","function":{}}],"messages":[{"role":"user","content":"x"}]}`, ErrMalformed},
		{"prompt a number", `{"prompt":5}`, ErrMalformed},
		{"negative token", `{"prompt":[1,-2]}`, ErrMalformed},
		{"fractional token", `{"prompt":[1.5]}`, ErrMalformed},
		{"token beyond uint32", `{"prompt":[4294967296]}`, ErrMalformed},
		{"mixed prompt array", `{"prompt":["a",1]}`, ErrMalformed},
		{"empty token array", `{"prompt":[[]]}`, ErrMalformed},
		{"too deep", `{"x":` + deep + `,"prompt":"a"}`, ErrMalformed},
		{"too deep in content", `{"messages":[{"role":"user","content":"a","x":` + deep + `}]}`, ErrMalformed},
	}
	// Plain prints tools and arguments without vLLM's checks.
	templated := map[string]bool{"arguments not JSON": true, "tool without name": true}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, tmpl := range []Template{ChatML, Llama3, Plain} {
				if tmpl == Plain && templated[tt.name] {
					continue
				}
				_, err := Render(nil, []byte(tt.body), tmpl)
				if !errors.Is(err, tt.want) {
					t.Errorf("%s: err = %v, want %v", tmpl, err, tt.want)
				}
			}
		})
	}
}

func TestTemplateRejections(t *testing.T) {
	tests := []struct {
		name string
		tmpl Template
		body string
	}{
		{"gemma alternation", Gemma, `{"messages":[{"role":"assistant","content":"a"}]}`},
		{"gemma system without text", Gemma, `{"messages":[{"role":"system","content":null},{"role":"user","content":"a"}]}`},
		{"gemma system starting with an image", Gemma, `{"messages":[{"role":"system","content":[{"type":"image_url","image_url":{"url":"u"}}]},{"role":"user","content":"a"}]}`},
		{"mistral alternation", Mistral, `{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}`},
		{"mistral short call id", Mistral, `{"messages":[{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"id":"short","function":{"name":"f","arguments":"{}"}}]}]}`},
		{"mistral tool result without id", Mistral, `{"messages":[{"role":"user","content":"a"},{"role":"tool","content":"r"}]}`},
		{"mistral unknown role", Mistral, `{"messages":[{"role":"user","content":"a"},{"role":"critic","content":"b"}]}`},
		{"llama3 two tool calls", Llama3, `{"messages":[{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"function":{"name":"f"}},{"function":{"name":"g"}}]}]}`},
		{"llama3 tools without messages after system", Llama3, `{"tools":[],"messages":[{"role":"system","content":"s"}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Render(nil, []byte(tt.body), tt.tmpl); !errors.Is(err, ErrTemplate) {
				t.Errorf("err = %v, want ErrTemplate", err)
			}
		})
	}
}

func TestCompletions(t *testing.T) {
	tests := []struct {
		name    string
		tmpl    Template
		body    string
		text    string
		tokens  bool
		prompts int
	}{
		{"string, llama3 BOS", Llama3, `{"model":"m","prompt":"Once upon"}`, "<|begin_of_text|>Once upon", false, 1},
		{"string, chatml has no BOS", ChatML, `{"prompt":"Once upon"}`, "Once upon", false, 1},
		{"string, mistral BOS", Mistral, `{"prompt":"x"}`, "<s>x", false, 1},
		{"string, gemma BOS", Gemma, `{"prompt":"x"}`, "<bos>x", false, 1},
		{"string, plain", Plain, `{"prompt":"x"}`, "x", false, 1},
		{"escapes", ChatML, `{"prompt":"caf\u00e9 \"q\"\n\ud83d\ude00\/"}`, "café \"q\"\n😀/", false, 1},
		{"empty string", Llama3, `{"prompt":""}`, "<|begin_of_text|>", false, 1},
		{"array of strings routes by the first", ChatML, `{"prompt":["first","second","third"]}`, "first", false, 3},
		{"token ids", Llama3, `{"prompt":[1, 258, 4294967295, 0]}`, "\x01\x00\x00\x00\x02\x01\x00\x00\xff\xff\xff\xff\x00\x00\x00\x00", true, 1},
		{"arrays of token ids", ChatML, `{"prompt":[[7,8],[9]]}`, "\x07\x00\x00\x00\x08\x00\x00\x00", true, 2},
		{"prompt after messages is ignored", ChatML, `{"messages":[{"role":"user","content":"hi"}],"prompt":"p"}`,
			"<|im_start|>system\n" + qwenSystem + "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Render(nil, []byte(tt.body), tt.tmpl)
			if err != nil {
				t.Fatal(err)
			}
			if string(p.Text) != tt.text || p.Tokens != tt.tokens || p.Prompts != tt.prompts {
				t.Errorf("got %q tokens=%v prompts=%d, want %q tokens=%v prompts=%d", p.Text, p.Tokens, p.Prompts, tt.text, tt.tokens, tt.prompts)
			}
		})
	}
}

func TestModel(t *testing.T) {
	tests := []struct{ body, want string }{
		{`{"model":"Qwen/Qwen2.5-7B-Instruct","prompt":"x"}`, "Qwen/Qwen2.5-7B-Instruct"},
		{`{"prompt":"x","model":"sql\u002dlora"}`, "sql-lora"},
		{`{"prompt":"x"}`, ""},
		{`{"model":7,"prompt":"x"}`, ""},
		{`{"model":"a","model":"b","prompt":"x"}`, "b"}, // the last duplicate wins, as in Python
	}
	for _, tt := range tests {
		p, err := Render(nil, []byte(tt.body), Plain)
		if err != nil || p.Model != tt.want {
			t.Errorf("%s: Model = %q, %v; want %q", tt.body, p.Model, err, tt.want)
		}
	}
}

func TestPlain(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"roles and names", `{"messages":[{"role":"system","content":"s"},{"role":"user","name":"ann","content":"hi"},{"role":"assistant","content":null}]}`,
			"system: s\nuser (ann): hi\nassistant: \n"},
		{"parts", `{"messages":[{"role":"user","content":["a",{"type":"text","text":"b\nc"}]}]}`, "user: a\nb\nc\n"},
		{"tools and calls", `{"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"messages":[{"role":"user","content":"go"},` +
			`{"role":"assistant","content":"","tool_calls":[{"id":"1","function":{"name":"f","arguments":"{\"x\": 1}"}},{"id":"2","function":{"name":"g","arguments":{"y":[1,2]}}}]}]}`,
			"tools: {\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}\nuser: go\nassistant: \ntool_call: f {\"x\": 1}\ntool_call: g {\"y\": [1, 2]}\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Render(nil, []byte(tt.body), Plain)
			if err != nil {
				t.Fatal(err)
			}
			if string(p.Text) != tt.want {
				t.Errorf("got  %q\nwant %q", p.Text, tt.want)
			}
		})
	}
}

func marker(payload string) string {
	return string(appendMarker(nil, xxhash.Sum64String(payload)))
}

func TestMediaParts(t *testing.T) {
	render := func(part string) string {
		p, err := Render(nil, []byte(`{"messages":[{"role":"user","content":[`+part+`]}]}`), Plain)
		if err != nil {
			t.Fatalf("%s: %v", part, err)
		}
		return strings.TrimSuffix(strings.TrimPrefix(string(p.Text), "user: "), "\n")
	}
	tests := []struct {
		name, part, want string
	}{
		{"image url", `{"type":"image_url","image_url":{"url":"https://x/a.png","detail":"low"}}`, marker("https://x/a.png")},
		{"image url escaped the same", `{"image_url":{"detail":"low","url":"https:\/\/x\/a.png"},"type":"image_url"}`, marker("https://x/a.png")},
		{"image url as a string", `{"type":"image_url","image_url":"data:image/png;base64,AAAA"}`, marker("data:image/png;base64,AAAA")},
		{"audio data", `{"type":"input_audio","input_audio":{"format":"wav","data":"UklGRg=="}}`, marker("UklGRg==")},
		{"video without type", `{"video_url":{"url":"v.mp4"}}`, marker("v.mp4")},
		{"no payload: the part's JSON", `{"type":"image","uuid":"u1"}`, marker(`{"type":"image","uuid":"u1"}`)},
	}
	for _, tt := range tests {
		if got := render(tt.part); got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
	}
	if render(`{"type":"image_url","image_url":{"url":"a"}}`) == render(`{"type":"image_url","image_url":{"url":"b"}}`) {
		t.Error("different images render the same")
	}
}

// Decoding agrees with encoding/json on every string it marshals, whatever
// the bytes, and on escapes it does not produce itself.
func TestDecodeMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	alphabet := []string{"a", " ", "\"", "\\", "/", "\n", "\t", "\x00", "\x1f", "\x7f", "é", "😀", "\u2028", "<", "&", "\xff", "\xe2\x82"}
	var inputs []string
	for i := 0; i < 500; i++ {
		var b strings.Builder
		for j := r.IntN(40); j > 0; j-- {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		enc, _ := json.Marshal(b.String())
		inputs = append(inputs, string(enc))
	}
	inputs = append(inputs, `"\ud83d\ude00"`, `"\ud800"`, `"\udc00\ud800x"`, `"\ud83d\u0041"`, `"\u00E9\u00e9"`, `"tail\\"`)
	for _, in := range inputs {
		var want string
		if err := json.Unmarshal([]byte(in), &want); err != nil {
			t.Fatal(err)
		}
		s := scanner{b: []byte(in)}
		v, err := s.text()
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if got := string(s.appendStr(nil, v)); got != want {
			t.Errorf("text(%s) = %q, want %q", in, got, want)
		}
		lazy := scanner{b: []byte(in)}
		v, _ = lazy.str()
		if got := string(lazy.appendStr(nil, v)); got != want {
			t.Errorf("str(%s) = %q, want %q", in, got, want)
		}
	}
}

// The expected outputs were printed by Python 3's json.dumps(json.loads(in),
// ensure_ascii=False) and with indent=4.
func TestPyJSON(t *testing.T) {
	tests := []struct {
		in, want, indented string
	}{
		{`{"a":1.50,"b":[1e2,-0,2.5e-7,12345678901234567890,1E+20,0.0001,1e16,1e15,0.00001,-1.5e-300,5e-324,1.7976931348623157e308,123.456e1]}`,
			`{"a": 1.5, "b": [100.0, 0, 2.5e-07, 12345678901234567890, 1e+20, 0.0001, 1e+16, 1000000000000000.0, 1e-05, -1.5e-300, 5e-324, 1.7976931348623157e+308, 1234.56]}`,
			"{\n    \"a\": 1.5,\n    \"b\": [\n        100.0,\n        0,\n        2.5e-07,\n        12345678901234567890,\n        1e+20,\n        0.0001,\n        1e+16,\n        1000000000000000.0,\n        1e-05,\n        -1.5e-300,\n        5e-324,\n        1.7976931348623157e+308,\n        1234.56\n    ]\n}"},
		{`"caf\u00e9 \ud83d\ude00 \/ \" \\ \n\t\r\b\f \u0001\u001f\u007f \u2028"`,
			"\"café 😀 / \\\" \\\\ \\n\\t\\r\\b\\f \\u0001\\u001f\u007f \u2028\"",
			"\"café 😀 / \\\" \\\\ \\n\\t\\r\\b\\f \\u0001\\u001f\u007f \u2028\""},
		{`{"k\u00e9y": {"nested": [true, false, null, {}, [], ""]}}`,
			`{"kéy": {"nested": [true, false, null, {}, [], ""]}}`,
			"{\n    \"kéy\": {\n        \"nested\": [\n            true,\n            false,\n            null,\n            {},\n            [],\n            \"\"\n        ]\n    }\n}"},
		{`[]`, `[]`, `[]`},
		{`{}`, `{}`, `{}`},
		{`-12`, `-12`, `-12`},
		{`[[[]]]`, `[[[]]]`, "[\n    [\n        []\n    ]\n]"},
	}
	for _, tt := range tests {
		for _, indent := range []int{0, 4} {
			s := scanner{b: []byte(tt.in)}
			got, err := appendPyJSON(nil, &s, indent, 0, 0)
			want := tt.want
			if indent > 0 {
				want = tt.indented
			}
			if err != nil || string(got) != want {
				t.Errorf("appendPyJSON(%s, indent=%d) = %s, %v\nwant %s", tt.in, indent, got, err, want)
			}
		}
	}
}

func TestTrim(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"  a b  ", "a b"},
		{"\t\n\v\f\r\x1c\x1d\x1e\x1f a \u0085\u00a0\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000", "a"},
		{"\u200b a \u200b", "\u200b a \u200b"}, // zero-width space is not whitespace in Python
		{"   ", ""},
		{"é", "é"},
	}
	for _, tt := range tests {
		got := trimFrom([]byte("keep"+tt.in), 4)
		if string(got) != "keep"+tt.want {
			t.Errorf("trim(%q) = %q, want %q", tt.in, got[4:], tt.want)
		}
	}
	for c := rune(0); c < 0x3100; c++ {
		if isPySpace(c) != strings.ContainsRune(pyWhitespace, c) {
			t.Errorf("isPySpace(%U) = %v", c, isPySpace(c))
		}
	}
}

// pyWhitespace is every character for which Python's str.isspace() holds
// (printed with ”.join(chr(c) for c in range(0x110000) if chr(c).isspace())).
const pyWhitespace = "\t\n\v\f\r\x1c\x1d\x1e\x1f \u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"

// Rendering one body, then another, then the first again gives the same
// text: nothing of one request leaks into the next through a Renderer.
func TestRendererReuse(t *testing.T) {
	ref := loadReference(t)
	var r Renderer
	for _, tmpl := range []Template{ChatML, Llama3, Mistral, Gemma, Plain} {
		first := map[string]string{}
		for _, c := range ref.Cases {
			p, err := r.Render(nil, []byte(c.Body), tmpl)
			if err == nil {
				first[c.Name] = string(p.Text)
			}
		}
		for i := len(ref.Cases) - 1; i >= 0; i-- {
			c := ref.Cases[i]
			p, err := r.Render(make([]byte, 0, 16), []byte(c.Body), tmpl)
			if want, ok := first[c.Name]; ok && (err != nil || string(p.Text) != want) {
				t.Errorf("%s/%s: second render differs", c.Name, tmpl)
			}
		}
	}
}

func FuzzRender(f *testing.F) {
	for _, c := range loadReference(f).Cases {
		f.Add([]byte(c.Body))
	}
	for _, c := range loadRenders(f, "testdata/harmony.json").Cases {
		f.Add([]byte(c.Body))
	}
	for _, s := range []string{
		`{"messages":[{"role":"assistant","content":[]}]}`,
		``, `{}`, `{"prompt":[1,2,3]}`, `{"prompt":[["a"]]}`, `{"messages":[{"role":"user","content":"\ud800"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":5}}]}]}`,
		`{"messages":[{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":"[1,{\"a\":\"\\u00e9\"}]"}}]}],"tools":[{"function":{"name":"f","x":[1]}}]}`,
		`{"messages":[{"role":"user","content":"a\"b\\` + "\x00" + `"}]}`,
		`{"messages":[{"role":"system","content":[]}]}`,
		`{"prompt":"` + strings.Repeat(`\u00e9`, 100) + `"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var r Renderer
		for _, tmpl := range []Template{Plain, ChatML, Llama3, Mistral, Gemma, Qwen3, Llama32, Harmony} {
			p, err := r.Render(nil, body, tmpl)
			valid := json.Valid(body)
			if !valid && err == nil {
				t.Fatalf("%s: invalid JSON rendered: %q", tmpl, p.Text)
			}
			if valid && errors.Is(err, ErrInvalidJSON) && strings.HasPrefix(strings.TrimLeft(string(body), " \t\r\n"), "{") {
				t.Fatalf("%s: valid JSON object reported invalid", tmpl)
			}
			if err == nil && !p.Tokens && utf8.Valid(body) && !utf8.Valid(p.Text) {
				t.Fatalf("%s: valid UTF-8 in, invalid UTF-8 out: %q", tmpl, p.Text)
			}
			again, err2 := r.Render(nil, body, tmpl)
			if (err == nil) != (err2 == nil) || string(again.Text) != string(p.Text) {
				t.Fatalf("%s: rendering twice differs", tmpl)
			}
		}
	})
}

func TestMaxTokens(t *testing.T) {
	for _, tc := range []struct {
		fields string
		want   int
	}{
		{``, 0},
		{`,"max_tokens":128`, 128},
		{`,"max_tokens":128,"max_completion_tokens":64`, 64},
		{`,"max_completion_tokens":64,"max_tokens":128`, 64},
		{`,"max_tokens":null`, 0},
		{`,"max_tokens":"12"`, 0},
		{`,"max_tokens":1.5`, 0},
		{`,"max_tokens":-3`, 0},
		{`,"max_tokens":12345678901`, 0},
		{`,"max_tokens":0`, 0},
	} {
		body := `{"model":"m","prompt":"hello"` + tc.fields + `}`
		p, err := Render(nil, []byte(body), ChatML)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if p.MaxTokens != tc.want {
			t.Errorf("%s: MaxTokens %d, want %d", body, p.MaxTokens, tc.want)
		}
	}
	if _, err := Render(nil, []byte(`{"model":"m","prompt":"x","max_tokens":12x}`), ChatML); err == nil {
		t.Error("invalid JSON after max_tokens accepted")
	}
}

// TestStream: whether the answer will be streamed, in each API's request.
// The filter reads the first token's time from a stream's first event
// only, and holds a non-streamed request's prefill as load until the
// predicted first token.
func TestStream(t *testing.T) {
	for _, tc := range []struct {
		api  API
		body string
		want bool
	}{
		{OpenAI, `{"model":"m","prompt":"hi"}`, false},
		{OpenAI, `{"model":"m","prompt":"hi","stream":true}`, true},
		{OpenAI, `{"stream":true,"model":"m","messages":[{"role":"user","content":"hi"}]}`, true},
		{OpenAI, `{"model":"m","prompt":"hi","stream":false}`, false},
		{OpenAI, `{"model":"m","prompt":"hi","stream":null}`, false},
		{OpenAI, `{"model":"m","prompt":"hi","stream":"true"}`, false},
		{Messages, `{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, true},
		{Messages, `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`, false},
		{Responses, `{"model":"m","input":"hi","stream":true}`, true},
		{Responses, `{"model":"m","input":"hi","stream":false}`, false},
	} {
		var r Renderer
		if err := r.ParseAPI([]byte(tc.body), tc.api); err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		p, err := r.RenderParsed(nil, ChatML)
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		if p.Stream != tc.want {
			t.Errorf("%s: Stream %v, want %v", tc.body, p.Stream, tc.want)
		}
	}
}

func TestCacheSalt(t *testing.T) {
	for _, tc := range []struct{ fields, want string }{
		{``, ""},
		{`,"cache_salt":"tenant-a"`, "tenant-a"},
		{`,"cache_salt":"t\u00e9nant"`, "ténant"},
		{`,"cache_salt":null`, ""},
		{`,"cache_salt":42`, ""},
		{`,"cache_salt":{"a":1}`, ""},
	} {
		body := `{"model":"m","prompt":"hello"` + tc.fields + `}`
		p, err := Render(nil, []byte(body), ChatML)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if p.CacheSalt != tc.want {
			t.Errorf("%s: CacheSalt %q, want %q", body, p.CacheSalt, tc.want)
		}
	}
	if _, err := Render(nil, []byte(`{"model":"m","prompt":"x","cache_salt":"unterminated}`), ChatML); err == nil {
		t.Error("an unterminated cache_salt accepted")
	}
}

// TestParseThenRender: the filter on auto reads the model before it picks
// the template; parsing once and rendering the parse must equal Render.
func TestParseThenRender(t *testing.T) {
	body := []byte(`{"messages":[{"role":"user","content":"hi"}],"model":"Qwen\/Qwen2.5-7B-Instruct","max_tokens":3}`)
	var r Renderer
	if err := r.Parse(body); err != nil {
		t.Fatal(err)
	}
	if got := r.Model(); got != "Qwen/Qwen2.5-7B-Instruct" {
		t.Fatalf("Model = %q", got)
	}
	for _, tmpl := range Templates() {
		got, err := r.RenderParsed(nil, tmpl)
		want, wantErr := Render(nil, body, tmpl)
		if err != nil || wantErr != nil {
			// Hermes's tool-use template requires tools.
			if err == nil || wantErr == nil || err.Error() != wantErr.Error() {
				t.Errorf("%v: RenderParsed: %v, Render: %v", tmpl, err, wantErr)
			}
			continue
		}
		if string(got.Text) != string(want.Text) || got.Model != want.Model || got.MaxTokens != 3 {
			t.Errorf("%v: RenderParsed %q (%q), Render %q", tmpl, got.Text, got.Model, want.Text)
		}
	}
	if err := r.Parse([]byte(`{"prompt":"x"}`)); err != nil || r.Model() != "" {
		t.Errorf("a body without a model: %v, model %q", err, r.Model())
	}
}

// TestTodayDate: Llama 3.2's date is the UTC day of the clock, as an engine
// in a container without TZ prints it, and it turns at UTC midnight.
func TestTodayDate(t *testing.T) {
	body := []byte(`{"messages":[{"role":"user","content":"hi"}]}`)
	tests := []struct {
		at   time.Time
		want string
	}{
		{time.Date(2026, 12, 31, 23, 59, 59, 999999999, time.UTC), "Today Date: 31 Dec 2026\n"},
		{time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), "Today Date: 01 Jan 2027\n"},
		// 20:00 in New York on 31 Dec is 01:00 UTC on 1 Jan.
		{time.Date(2026, 12, 31, 20, 0, 0, 0, time.FixedZone("EST", -5*3600)), "Today Date: 01 Jan 2027\n"},
		{time.Date(2026, 3, 9, 12, 0, 0, 0, time.UTC), "Today Date: 09 Mar 2026\n"},
	}
	for _, tt := range tests {
		r := Renderer{Now: func() time.Time { return tt.at }}
		p, err := r.Render(nil, body, Llama32)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(p.Text), tt.want) {
			t.Errorf("at %v: %q lacks %q", tt.at, p.Text, tt.want)
		}
		if p31, _ := r.Render(nil, body, Llama3); !strings.Contains(string(p31.Text), "Today Date: 26 Jul 2024\n") {
			t.Errorf("llama3 (3.1) prints a date of its own: %q", p31.Text)
		}
	}
}

// TestTrailingBytes: only whitespace may follow the body, and only
// whitespace may follow a tool call's JSON arguments; a NUL is not the end.
func TestTrailingBytes(t *testing.T) {
	for _, body := range []string{
		`{"messages":[{"role":"user","content":"hi"}]}` + "\x00",
		`{"messages":[{"role":"user","content":"hi"}]} x`,
	} {
		if _, err := Render(nil, []byte(body), ChatML); !errors.Is(err, ErrInvalidJSON) {
			t.Errorf("%q: %v, want ErrInvalidJSON", body, err)
		}
	}
	call := `{"messages":[{"role":"user","content":"go"},{"role":"assistant","tool_calls":[{"id":"abcdefghi","type":"function","function":{"name":"f","arguments":"{}\u0000"}}]}]}`
	if _, err := Render(nil, []byte(call), ChatML); !errors.Is(err, ErrMalformed) {
		t.Errorf("arguments with a NUL after the JSON: %v, want ErrMalformed", err)
	}
	if _, err := Render(nil, []byte(`{"messages":[{"role":"user","content":"hi"}]}`+" \n\t"), ChatML); err != nil {
		t.Errorf("trailing whitespace: %v", err)
	}
}
