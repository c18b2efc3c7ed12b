package prompt

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"
)

// conversion is one case of testdata/conversions.json: a body and the
// chat request vLLM's conversion makes of it, worked out by hand from its
// code (ParseAPI names the files). The simulator's own conversion is
// checked against the same file.
type conversionCase struct {
	Name string          `json:"name"`
	API  string          `json:"api"`
	Body json.RawMessage `json:"body"`
	Chat json.RawMessage `json:"chat"`
	Prev string          `json:"previous_response_id"`
}

func (c *conversionCase) api() API {
	if c.API == "messages" {
		return Messages
	}
	return Responses
}

func loadConversions(t testing.TB) []conversionCase {
	t.Helper()
	b, err := os.ReadFile("testdata/conversions.json")
	if err != nil {
		t.Fatal(err)
	}
	var cs []conversionCase
	if err := json.Unmarshal(b, &cs); err != nil {
		t.Fatal(err)
	}
	return cs
}

func TestConversions(t *testing.T) {
	for _, tc := range loadConversions(t) {
		t.Run(tc.Name, func(t *testing.T) {
			for _, tmpl := range Templates() {
				if tmpl == Qwen3 && (reasons(tc.Body)) {
					continue // reasoning Qwen3 would print: TestConversionErrors
				}
				var r, ref Renderer
				r.Now = func() time.Time { return time.Unix(1_790_000_000, 0) }
				ref.Now = r.Now
				if err := r.ParseAPI(tc.Body, tc.api()); err != nil {
					t.Fatalf("%v: ParseAPI: %v", tmpl, err)
				}
				got, err := r.RenderParsed(nil, tmpl)
				if tmpl == Harmony && errors.Is(err, ErrUnsupported) {
					// vLLM converts reasoning and tool_use input in
					// ways harmony prints and kvroute does not follow:
					// such requests fall back.
					continue
				}
				want, refErr := ref.Render(nil, tc.Chat, tmpl)
				if refErr != nil {
					// The template rejects the conversation (Mistral's
					// alternation, Llama 3's single tool call): so it
					// must reject the converted one.
					if !errors.Is(refErr, ErrTemplate) || !errors.Is(err, ErrTemplate) {
						t.Errorf("%v: %v, reference %v", tmpl, err, refErr)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%v: %v", tmpl, err)
				}
				if string(got.Text) != string(want.Text) {
					t.Errorf("%v:\n got %q\nwant %q\n(converted %s)", tmpl, got.Text, want.Text, r.conv)
				}
				if got.Model != "m" || r.PreviousResponse() != tc.Prev || got.MaxTokens != want.MaxTokens {
					t.Errorf("%v: model %q prev %q max %d, want m %q %d", tmpl, got.Model, r.PreviousResponse(), got.MaxTokens, tc.Prev, want.MaxTokens)
				}
			}
		})
	}
}

// A tool_use without an id gets vLLM's call_<unix seconds>.
// reasons reports whether a body holds reasoning, which Qwen3 would print.
func reasons(body []byte) bool {
	return bytes.Contains(body, []byte(`"type": "thinking"`)) || bytes.Contains(body, []byte(`"type": "reasoning"`))
}

func TestConversionToolUseID(t *testing.T) {
	r := Renderer{Now: func() time.Time { return time.Unix(1_790_000_123, 0) }}
	body := `{"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"tool_use","name":"f","input":{"a":1}}]},{"role":"user","content":"y"}]}`
	if err := r.ParseAPI([]byte(body), Messages); err != nil {
		t.Fatal(err)
	}
	want := `{"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"call_1790000123","type":"function","function":{"name":"f","arguments":{"a":1}}}]},{"role":"user","content":"y"}]}`
	if string(r.conv) != want {
		t.Errorf("converted\n%s\nwant\n%s", r.conv, want)
	}
}

func TestConversionErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		api  API
		tmpl Template
		body string
		want error
	}{
		{"messages not JSON", Messages, ChatML, `{"model":`, ErrInvalidJSON},
		{"messages without messages", Messages, ChatML, `{"model":"m"}`, ErrNoPrompt},
		{"messages empty", Messages, ChatML, `{"model":"m","messages":[]}`, ErrNoPrompt},
		{"an unknown role", Messages, ChatML, `{"messages":[{"role":"tool","content":"x"}]}`, ErrMalformed},
		{"an empty block list", Messages, ChatML, `{"messages":[{"role":"user","content":[]}]}`, ErrMalformed},
		{"an unknown block", Messages, ChatML, `{"messages":[{"role":"user","content":[{"type":"video"}]}]}`, ErrMalformed},
		{"an assistant's list tool result", Messages, ChatML, `{"messages":[{"role":"assistant","content":[{"type":"tool_result","content":[{"type":"text","text":"x"}]}]}]}`, ErrUnsupported},
		{"a tool reference", Messages, ChatML, `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"tool_reference","tool_name":"f"}]}]}]}`, ErrUnsupported},
		{"thinking under Qwen3", Messages, Qwen3, `{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"thinking","thinking":"hmm"},{"type":"text","text":"b"}]}]}`, ErrUnsupported},
		{"a tool without a schema", Messages, ChatML, `{"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f"}]}`, ErrMalformed},
		{"responses without input", Responses, ChatML, `{"model":"m"}`, ErrNoPrompt},
		{"responses input a number", Responses, ChatML, `{"input":3}`, ErrMalformed},
		{"an unknown item", Responses, ChatML, `{"input":[{"type":"image_generation_call","id":"x"}]}`, ErrUnsupported},
		{"a namespaced call", Responses, ChatML, `{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}","namespace":"ns"}]}`, ErrUnsupported},
		{"a namespace tool", Responses, ChatML, `{"input":"x","tools":[{"type":"namespace","name":"ns","tools":[]}]}`, ErrUnsupported},
		{"reasoning under Qwen3", Responses, Qwen3, `{"input":[{"role":"user","content":"q"},{"type":"reasoning","content":[{"type":"reasoning_text","text":"t"}]}]}`, ErrUnsupported},
		{"trailing bytes", Responses, ChatML, `{"input":"x"} {}`, ErrInvalidJSON},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r Renderer
			err := r.ParseAPI([]byte(tc.body), tc.api)
			if err == nil {
				_, err = r.RenderParsed(nil, tc.tmpl)
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestAPIOf(t *testing.T) {
	for path, want := range map[string]API{
		"/v1/chat/completions": OpenAI, "/v1/completions": OpenAI, "/v1/responses": Responses,
		"/v1/messages?beta=true": Messages, "/openai/v1/responses": Responses, "/v1/messages/count_tokens": OpenAI,
	} {
		if got := APIOf(path); got != want {
			t.Errorf("APIOf(%q) = %v, want %v", path, got, want)
		}
	}
}

// Converting happens on the request path: a long conversation converts
// without allocating once the Renderer's buffers have grown.
func TestConversionNoAllocs(t *testing.T) {
	var r Renderer
	body := loadConversions(t)[4].Body
	allocs := testing.AllocsPerRun(20, func() {
		if err := r.ParseAPI(body, Messages); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 0 {
		t.Errorf("%v allocations per conversion", allocs)
	}
}

// FuzzConvert: a converted body is always one valid JSON object, invalid
// JSON never converts, and whatever the body, nothing panics.
func FuzzConvert(f *testing.F) {
	for _, c := range loadConversions(f) {
		f.Add([]byte(c.Body), c.api() == Messages)
	}
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"image","source":{"media_type":null}}]}]}]}`), true)
	f.Add([]byte(`{"system":[{"type":"text","text":"\u0000\"\\"}],"messages":[{"role":"user","content":"\ud800"}],"tools":[{"name":"f","input_schema":{ }}]}`), true)
	f.Fuzz(func(t *testing.T, body []byte, messages bool) {
		api := Responses
		if messages {
			api = Messages
		}
		var r Renderer
		err := r.ParseAPI(body, api)
		if len(r.conv) > 0 && (err == nil || !errors.Is(err, ErrInvalidJSON)) && !json.Valid(r.conv) {
			t.Fatalf("converted to invalid JSON: %s", r.conv)
		}
		if err == nil && !json.Valid(body) {
			t.Fatalf("invalid JSON converted: %s", r.conv)
		}
		if err == nil {
			for _, tmpl := range Templates() {
				r.RenderParsed(nil, tmpl)
			}
		}
	})
}
