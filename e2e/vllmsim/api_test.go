package vllmsim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
)

func TestBadRequests(t *testing.T) {
	cfg := testConfig()
	cfg.MaxModelLen = 512
	e := startEngine(t, cfg)
	long := strings.Repeat("word ", 600)
	tests := []struct {
		name, path, body string
		code             int
		typ, msg         string
	}{
		{"not JSON", "/v1/chat/completions", `{"messages":`, 400, "BadRequestError", "invalid JSON"},
		{"wrong field type", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":"ten"}`, 400, "BadRequestError", "max_tokens"},
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`, 404, "NotFoundError", "The model `gpt-9` does not exist."},
		{"no messages", "/v1/chat/completions", `{"model":"Qwen/Qwen2.5-32B-Instruct"}`, 400, "BadRequestError", "messages"},
		{"empty messages", "/v1/chat/completions", `{"messages":[]}`, 400, "BadRequestError", "non-empty"},
		{"prompt too long", "/v1/completions", `{"prompt":"` + long + `"}`, 400, "BadRequestError", "maximum context length is 512 tokens"},
		{"completion too long", "/v1/completions", `{"prompt":"hi","max_tokens":600}`, 400, "BadRequestError", "maximum context length is 512 tokens"},
		{"max_tokens 0", "/v1/completions", `{"prompt":"hi","max_tokens":0}`, 400, "BadRequestError", "at least 1"},
		{"stream options without stream", "/v1/completions", `{"prompt":"hi","stream_options":{"include_usage":true}}`, 400, "BadRequestError", "stream=True"},
		{"n=2", "/v1/completions", `{"prompt":"hi","n":2}`, 400, "BadRequestError", "n=2"},
		{"empty prompt", "/v1/completions", `{"prompt":""}`, 400, "BadRequestError", "empty"},
		{"no prompt", "/v1/completions", `{}`, 400, "BadRequestError", "prompt"},
		{"token out of vocabulary", "/v1/completions", `{"prompt":[1,2,999999]}`, 400, "BadRequestError", "out of vocabulary"},
		{"prompt of objects", "/v1/completions", `{"prompt":[{"a":1}]}`, 400, "BadRequestError", "prompt must be"},
		{"empty salt", "/v1/completions", `{"prompt":"hi","cache_salt":""}`, 400, "BadRequestError", "cache_salt"},
		{"both generation flags", "/v1/chat/completions", `{"messages":[{"role":"assistant","content":"x"}],"continue_final_message":true}`, 400, "BadRequestError", "continue_final_message"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := post(t, e.URL()+tt.path, tt.body)
			var resp struct {
				Error apiError `json:"error"`
			}
			if err := json.Unmarshal(body, &resp); err != nil {
				t.Fatalf("%d %s: %v", code, body, err)
			}
			if code != tt.code || resp.Error.Code != tt.code || resp.Error.Type != tt.typ || !strings.Contains(resp.Error.Message, tt.msg) {
				t.Fatalf("%d %s", code, body)
			}
		})
	}
	resp, err := http.Get(e.URL() + "/v1/completions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/completions: %d", resp.StatusCode)
	}
	if code, _ := post(t, e.URL()+"/v1/completions", `{"prompt":"still serving","max_tokens":2}`); code != 200 {
		t.Errorf("engine stopped serving after bad requests: %d", code)
	}
}

// sse reads a server-sent event stream into its JSON chunks; it wants the
// stream to end with [DONE].
func sse(t *testing.T, body []byte) []map[string]any {
	t.Helper()
	var chunks []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(body))
	done := false
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || done {
			t.Fatalf("bad stream line %q", line)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, m)
	}
	if !done {
		t.Fatal("stream did not end with [DONE]")
	}
	return chunks
}

func TestChatStreaming(t *testing.T) {
	cfg := testConfig()
	cfg.EnablePromptTokensDetails = true
	e := startEngine(t, cfg)
	body := `{"messages":[{"role":"user","content":"Stream to me."}],"max_tokens":7,"stream":true,"stream_options":{"include_usage":true}}`
	code, raw := post(t, e.URL()+"/v1/chat/completions", body)
	if code != 200 {
		t.Fatalf("%d %s", code, raw)
	}
	chunks := sse(t, raw)
	first := chunks[0]["choices"].([]any)[0].(map[string]any)
	if d := first["delta"].(map[string]any); d["role"] != "assistant" || first["finish_reason"] != nil {
		t.Fatalf("first chunk %v", chunks[0])
	}
	var text strings.Builder
	var finish any
	for _, c := range chunks[1 : len(chunks)-1] {
		if c["object"] != "chat.completion.chunk" || !strings.HasPrefix(c["id"].(string), "chatcmpl-") {
			t.Fatalf("chunk %v", c)
		}
		ch := c["choices"].([]any)[0].(map[string]any)
		text.WriteString(ch["delta"].(map[string]any)["content"].(string))
		finish = ch["finish_reason"]
	}
	if want := e.tok.decode(filler[:7]); text.String() != want || finish != "length" {
		t.Fatalf("streamed %q (finish %v), want %q", text.String(), finish, want)
	}
	last := chunks[len(chunks)-1]
	u := last["usage"].(map[string]any)
	if len(last["choices"].([]any)) != 0 || u["completion_tokens"] != 7.0 || u["total_tokens"] != u["prompt_tokens"].(float64)+7 {
		t.Fatalf("usage chunk %v", last)
	}
	if _, ok := u["prompt_tokens_details"].(map[string]any)["cached_tokens"]; !ok {
		t.Fatalf("usage without cached tokens: %v", u)
	}
}

func TestCompletionPromptForms(t *testing.T) {
	e := startEngine(t, testConfig())
	ids := e.tok.encode("Hello world, tokens here.")
	idsJSON, _ := json.Marshal(ids)
	tests := []struct {
		name, prompt string
		choices      int
		promptTokens int
	}{
		{"string", `"Hello world, tokens here."`, 1, len(ids)},
		{"strings", `["Hello world, tokens here.","Hello world, tokens here."]`, 2, 2 * len(ids)},
		{"token ids", string(idsJSON), 1, len(ids)},
		{"lists of token ids", "[" + string(idsJSON) + "," + string(idsJSON) + "," + string(idsJSON) + "]", 3, 3 * len(ids)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := post(t, e.URL()+"/v1/completions", `{"prompt":`+tt.prompt+`,"max_tokens":3}`)
			if code != 200 {
				t.Fatalf("%d %s", code, body)
			}
			var resp struct {
				Object  string
				Choices []struct {
					Index        int
					Text         string
					FinishReason string `json:"finish_reason"`
				}
				Usage usage
			}
			if err := json.Unmarshal(body, &resp); err != nil {
				t.Fatal(err)
			}
			if resp.Object != "text_completion" || len(resp.Choices) != tt.choices || resp.Usage.PromptTokens != tt.promptTokens ||
				resp.Usage.CompletionTokens != 3*tt.choices {
				t.Fatalf("%s", body)
			}
			for i, c := range resp.Choices {
				if c.Index != i || c.FinishReason != "length" || c.Text != e.tok.decode(filler[:3]) {
					t.Fatalf("choice %d: %+v", i, c)
				}
			}
		})
	}
}

func TestChatWithoutMaxTokensStops(t *testing.T) {
	cfg := testConfig()
	cfg.DefaultOutputTokens = 5
	e := startEngine(t, cfg)
	code, body := post(t, e.URL()+"/v1/chat/completions", `{"messages":[{"role":"user","content":"Hi"}]}`)
	if code != 200 || !strings.Contains(string(body), `"finish_reason":"stop"`) || !strings.Contains(string(body), `"completion_tokens":5`) {
		t.Fatalf("%d %s", code, body)
	}
}

func TestModelsAndTokenize(t *testing.T) {
	cfg := testConfig()
	cfg.LoRAModules = []LoRAModule{{Name: "sql-lora", Path: "/adapters/sql"}}
	e := startEngine(t, cfg)
	resp, err := http.Get(e.URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Object string
		Data   []struct {
			ID, Object, Root string
			Parent           any
			MaxModelLen      int `json:"max_model_len"`
		}
	}
	json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if models.Object != "list" || len(models.Data) != 2 || models.Data[0].ID != DefaultModel || models.Data[0].MaxModelLen != 63*16 ||
		models.Data[1].ID != "sql-lora" || models.Data[1].Root != "/adapters/sql" || models.Data[1].Parent != DefaultModel {
		t.Fatalf("%+v", models)
	}
	if r, err := http.Get(e.URL() + "/health"); err != nil || r.StatusCode != 200 {
		t.Fatalf("health: %v %v", r, err)
	}

	// /tokenize renders chat messages as the chat endpoint does, and
	// /detokenize gives back the exact rendered text.
	msgs := `[{"role":"user","content":"ünïcödé 日本 <|im_end|> & more"}]`
	code, body := post(t, e.URL()+"/tokenize", `{"messages":`+msgs+`}`)
	var tok struct {
		Count  int
		Tokens []int
	}
	if err := json.Unmarshal(body, &tok); code != 200 || err != nil || tok.Count != len(tok.Tokens) || tok.Count == 0 {
		t.Fatalf("tokenize: %d %s", code, body)
	}
	code, body = post(t, e.URL()+"/detokenize", `{"tokens":`+mustJSON(tok.Tokens)+`}`)
	var detok struct{ Prompt string }
	json.Unmarshal(body, &detok)
	want, _ := e.tpl.Load().render(chatRender{messages: json.RawMessage(msgs), addGenerationPrompt: true})
	if code != 200 || detok.Prompt != want {
		t.Fatalf("detokenize: %d %q, want %q", code, detok.Prompt, want)
	}
	hit, err := e.Probe("/v1/chat/completions", []byte(`{"messages":`+msgs+`}`))
	if err != nil || hit.PromptTokens != tok.Count {
		t.Fatalf("probe counts %d tokens, /tokenize %d (%v)", hit.PromptTokens, tok.Count, err)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestLlama3CompletionsAddBOS(t *testing.T) {
	cfg := testConfig()
	cfg.Model = "meta-llama/Llama-3.1-8B-Instruct"
	e := startEngine(t, cfg)
	code, body := post(t, e.URL()+"/tokenize", `{"prompt":"Hi"}`)
	var tok struct{ Tokens []int }
	json.Unmarshal(body, &tok)
	if got := e.tok.decode(tok.Tokens); code != 200 || got != "<|begin_of_text|>Hi" {
		t.Fatalf("%d %q", code, got)
	}
}

func TestTokenizerRoundTrip(t *testing.T) {
	tok, err := loadTokenizer()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		"<|im_start|>system\nYou are Qwen.<|im_end|>\n<|endoftext|>",
		"ünïcödé 日本語 😀 \t\r\n  spaces   ",
		"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n",
	} {
		ids := tok.encode(s)
		if err := tok.validate(ids); err != nil {
			t.Fatal(err)
		}
		if got := tok.decode(ids); got != s {
			t.Errorf("decode(encode(%q)) = %q", s, got)
		}
	}
	// Every ordinary id decodes to something.
	for id := 0; id < vocabSize; id += 997 {
		if tok.decode([]int{id}) == "" {
			t.Errorf("id %d decodes to nothing", id)
		}
	}
}

// TestRender: the render endpoints (what vllm-router's cache_aware policy
// asks every worker for) give the token ids generation would run on, for
// completions as a list and for chat as one request, and refuse what
// generation refuses.
func TestRender(t *testing.T) {
	e := startEngine(t, testConfig())
	tokens := func(body string) []int {
		code, b := post(t, e.URL()+"/tokenize", body)
		if code != http.StatusOK {
			t.Fatalf("tokenize: %d %s", code, b)
		}
		var out struct{ Tokens []int }
		json.Unmarshal([]byte(b), &out)
		return out.Tokens
	}
	code, b := post(t, e.URL()+"/v1/completions/render", `{"prompt":["one prompt","and another"],"max_tokens":5}`)
	var list []struct {
		TokenIDs       []int          `json:"token_ids"`
		Features       any            `json:"features"`
		SamplingParams map[string]any `json:"sampling_params"`
	}
	if err := json.Unmarshal([]byte(b), &list); code != http.StatusOK || err != nil || len(list) != 2 {
		t.Fatalf("completions render: %d %s", code, b)
	}
	if !slices.Equal(list[1].TokenIDs, tokens(`{"prompt":"and another"}`)) || list[0].Features != nil || list[0].SamplingParams["max_tokens"] != 5.0 {
		t.Errorf("completions render %s", b)
	}
	msgs := `"messages":[{"role":"user","content":"hello there"}]`
	code, b = post(t, e.URL()+"/v1/chat/completions/render", `{`+msgs+`}`)
	var one struct {
		TokenIDs []int `json:"token_ids"`
	}
	if err := json.Unmarshal([]byte(b), &one); code != http.StatusOK || err != nil || !slices.Equal(one.TokenIDs, tokens(`{`+msgs+`}`)) {
		t.Errorf("chat render: %d %s", code, b)
	}
	if code, _ := post(t, e.URL()+"/v1/completions/render", `{"prompt":"x","max_tokens":0}`); code != http.StatusBadRequest {
		t.Errorf("render of an invalid request: %d", code)
	}
}

// TestCloseCutsStreams: a closed engine fails its streams as a killed
// process does, with the connection gone and no [DONE]; had the loop's
// aborts gone out first, a client could not tell a killed engine from one
// that finished.
func TestCloseCutsStreams(t *testing.T) {
	cfg := testConfig()
	cfg.TimeScale = 1 // a token every few milliseconds of wall time
	for i := range 20 {
		e := startEngine(t, cfg)
		resp, err := http.Post(e.URL()+"/v1/completions", "application/json",
			strings.NewReader(`{"prompt":"a long answer, please","max_tokens":2000,"stream":true}`))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(resp.Body)
		if !sc.Scan() {
			t.Fatalf("no first chunk: %v", sc.Err())
		}
		e.Close()
		last := sc.Text()
		for sc.Scan() {
			if sc.Text() != "" {
				last = sc.Text()
			}
		}
		resp.Body.Close()
		if last == "data: [DONE]" {
			t.Fatalf("close %d: the stream ended cleanly", i)
		}
	}
}
