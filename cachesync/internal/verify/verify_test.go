package verify

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/cachesync/internal/vocab"
	"github.com/kvroute/kvroute/e2e/vllmsim"
	"github.com/kvroute/kvroute/shared/prompt"
)

// The simulator renders chat requests with the real HuggingFace templates
// through a Jinja engine and tokenizes with cl100k_base, so it stands for an
// engine here.

var (
	vocabOnce sync.Once
	cl100k    *vocab.Vocab
	vocabErr  error
)

func loadVocab(t *testing.T) *vocab.Vocab {
	t.Helper()
	vocabOnce.Do(func() { cl100k, vocabErr = vocab.Load("cl100k_base") })
	if vocabErr != nil {
		t.Fatal(vocabErr)
	}
	return cl100k
}

func startSim(t *testing.T, model, template string) *vllmsim.Engine {
	t.Helper()
	return startSimConfig(t, vllmsim.Config{Model: model, ChatTemplate: template})
}

func startSimConfig(t *testing.T, cfg vllmsim.Config) *vllmsim.Engine {
	t.Helper()
	cfg.Host = "127.0.0.1"
	e, err := vllmsim.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// Each template agrees with an engine serving it, and only with it. The
// general path's families are served from their real source, as an engine
// given --chat-template would. gpt-oss's chat completions render through
// harmony, which the render endpoint shows; an engine without one (vLLM
// before it) shows the Jinja template its /tokenize applies.
func TestEachTemplateAgreesWithItsEngineOnly(t *testing.T) {
	v := loadVocab(t)
	tests := []struct {
		model    string
		want     prompt.Template
		general  bool // the engine is given the template's source
		noRender bool
	}{
		{"Qwen/Qwen2.5-7B-Instruct", prompt.ChatML, false, false},
		{"meta-llama/Llama-3.1-8B-Instruct", prompt.Llama3, false, false},
		{"mistralai/Mistral-Nemo-Instruct-2407", prompt.Mistral, false, false},
		{"google/gemma-3-4b-it", prompt.Gemma, false, false},
		{"Qwen/Qwen3-32B", prompt.Qwen3, false, false},
		{"meta-llama/Llama-3.2-3B-Instruct", prompt.Llama32, false, false}, // today's date, on the engine's clock
		{"deepseek-ai/DeepSeek-V3.1", prompt.DeepSeekV31, true, false},
		{"deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", prompt.DeepSeekR1, true, false},
		{"openai/gpt-oss-120b", prompt.Harmony, false, false},
		{"openai/gpt-oss-20b", prompt.GptOss, true, true},
		{"mistralai/Mistral-Small-3.2-24B-Instruct-2506", prompt.MistralSmall32, true, false},
		{"microsoft/Phi-3.5-mini-instruct", prompt.Phi35, true, false},
		{"ibm-granite/granite-3.3-8b-instruct", prompt.Granite33, true, false},
		{"NousResearch/Hermes-3-Llama-3.1-8B", prompt.Hermes, true, false},
		// vLLM's example templates, as given with --chat-template. (Not
		// tool_chat_template_llama4_json.jinja: the simulator's Jinja
		// library cannot parse its adjacent string literals, which
		// Jinja2 and shared/jinja join; reference.json pins it.)
		{"meta-llama/Llama-3.1-70B-Instruct", prompt.VLLMLlama31JSON, true, false},
		{"meta-llama/Llama-4-Maverick-17B-128E-Instruct", prompt.VLLMLlama4Pythonic, true, false},
		{"microsoft/Phi-4-mini-instruct", prompt.VLLMPhi4Mini, true, false},
		{"NousResearch/Hermes-3-Llama-3.1-70B", prompt.VLLMHermes, true, false},
		{"Qwen/Qwen2.5-72B-Instruct", prompt.VLLMChatML, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.want.String(), func(t *testing.T) {
			spec := ""
			if tt.general {
				spec = templateSource(t, tt.want)
			}
			if strings.HasPrefix(tt.model, "openai/gpt-oss") {
				spec = templateSource(t, prompt.GptOss) // the tokenizer's own
			}
			e := startSimConfig(t, vllmsim.Config{Model: tt.model, ChatTemplate: spec, NoRender: tt.noRender})
			r, err := Fetch(context.Background(), http.DefaultClient, e.URL(), tt.model, v)
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]string{false: RenderPath, true: TokenizePath}[tt.noRender]; r.Path != want {
				t.Errorf("rendered by %s, want %s", r.Path, want)
			}
			a := Compare(r, tt.want, nil)
			if !a.Agrees() {
				t.Fatalf("own template: %v", a)
			}
			// Every probe a template family supports must have been
			// compared, or the set proves less than it claims. Hermes's
			// tool-use template refuses every conversation without tools
			// (Jinja2 too), so only the tools probe compares.
			if refused := len(Probes) - a.Compared; refused > 1 && !(tt.want == prompt.Hermes && a.Compared == 1) {
				t.Errorf("only %d of %d probes compared (refused: %q)", a.Compared, len(Probes), r.Refused)
			}
			if got := Matching(r); !slices.Equal(got, []prompt.Template{tt.want}) {
				t.Errorf("Matching = %v, want only %v", got, tt.want)
			}
		})
	}
}

func templateSource(t *testing.T, tmpl prompt.Template) string {
	t.Helper()
	src, err := os.ReadFile("../../../shared/prompt/templates/" + tmpl.String() + ".jinja")
	if err != nil {
		t.Fatal(err)
	}
	return string(src)
}

// A gateway's custom template agrees with an engine serving the same
// source, and without the special token the template prints, does not.
func TestCustomTemplateAgrees(t *testing.T) {
	const model = "deepseek-ai/DeepSeek-V3.1"
	src := templateSource(t, prompt.DeepSeekV31)
	e := startSim(t, model, src)
	r, err := Fetch(context.Background(), http.DefaultClient, e.URL(), model, loadVocab(t))
	if err != nil {
		t.Fatal(err)
	}
	j, err := prompt.ParseJinja(src, map[string]string{"bos_token": "<｜begin▁of▁sentence｜>"})
	if err != nil {
		t.Fatal(err)
	}
	if a := Compare(r, prompt.Custom, j); !a.Agrees() || a.Compared != len(Probes) {
		t.Errorf("the custom template: %v", a)
	}
	bare, _ := prompt.ParseJinja(src, nil)
	if a := Compare(r, prompt.Custom, bare); a.Agrees() || a.Common != len("<｜") {
		t.Errorf("a custom template without its BOS: %v", a)
	}
}

func TestDisagreementNamesTheFirstDifference(t *testing.T) {
	v := loadVocab(t)
	// A Qwen model served with Llama 3's template, as a wrong
	// --chat-template would.
	e := startSim(t, "Qwen/Qwen2.5-7B-Instruct", "llama3")
	r, err := Fetch(context.Background(), http.DefaultClient, e.URL(), "Qwen/Qwen2.5-7B-Instruct", v)
	if err != nil {
		t.Fatal(err)
	}
	a := Compare(r, prompt.ChatML, nil)
	if a.Agrees() || a.Exact != 0 {
		t.Fatalf("chatml agrees with a llama3 engine: %v", a)
	}
	// Both begin with a special token's "<|".
	if a.Probe != Probes[0].Name || a.Common != 2 {
		t.Errorf("first difference at probe %s byte %d, want %s byte 2", a.Probe, a.Common, Probes[0].Name)
	}
	if !strings.HasPrefix(a.Engine, `"begin_of_text|>`) || !strings.HasPrefix(a.Rendered, `"im_start|>`) {
		t.Errorf("excerpts engine %s, kvroute %s", a.Engine, a.Rendered)
	}
	if s := a.String(); !strings.Contains(s, "probe user after 2 bytes") {
		t.Errorf("String() = %q", s)
	}
	if got := Matching(r); !slices.Equal(got, []prompt.Template{prompt.Llama3}) {
		t.Errorf("Matching = %v, want [llama3]", got)
	}
}

func TestEngineAnswers(t *testing.T) {
	v := loadVocab(t)
	tests := []struct {
		name    string
		handler http.HandlerFunc
		wantErr error
		refused bool
	}{
		{"no tokenize", http.NotFound, ErrUnsupported, false},
		{"tokenize without chat", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"count":0}`)) }, ErrUnsupported, false},
		{"client error refuses", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, `{"error":"template rejects tools"}`, http.StatusBadRequest)
		}, nil, true},
		{"server error fails", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", 500) }, nil, false},
		{"unknown token fails", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"tokens":[4000000000]}`)) }, vocab.ErrUnknownToken, false},
		{"garbage fails", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`<html>`)) }, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.handler)
			defer srv.Close()
			r, err := Fetch(context.Background(), srv.Client(), srv.URL, "m", v)
			switch {
			case tt.refused:
				if err != nil || r.Refused[0] == "" || Compare(r, prompt.ChatML, nil).Agrees() {
					t.Fatalf("err %v, refused %q: want every probe refused and no agreement", err, r.Refused)
				}
			case err == nil:
				t.Fatal("no error")
			case tt.wantErr != nil && !strings.Contains(err.Error(), tt.wantErr.Error()):
				t.Fatalf("err %v, want %v", err, tt.wantErr)
			}
		})
	}
}

// TestProbesArePinnedToJinja2: shared/prompt's reference renders hold every
// probe as it is now, so its Jinja2 test covers the probe set; a probe
// changed without regenerating the reference fails here.
func TestProbesArePinnedToJinja2(t *testing.T) {
	b, err := os.ReadFile("../../../shared/prompt/testdata/reference.json")
	if err != nil {
		t.Fatal(err)
	}
	var ref struct{ Cases []struct{ Name, Body string } }
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	bodies := map[string]string{}
	for _, c := range ref.Cases {
		bodies[c.Name] = c.Body
	}
	for _, p := range Probes {
		var want, got any
		if err := json.Unmarshal(p.Body, &want); err != nil {
			t.Fatal(err)
		}
		body, ok := bodies["probe_"+p.Name]
		if !ok {
			t.Errorf("probe %s is not in the reference: run shared/prompt/testdata/render_reference.py", p.Name)
			continue
		}
		if err := json.Unmarshal([]byte(body), &got); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("probe %s differs from its reference render's body: run shared/prompt/testdata/render_reference.py", p.Name)
		}
	}
}

// TestFetchApplied reads llama.cpp's /apply-template answers: the text
// itself, a refusal, or no such path.
func TestFetchApplied(t *testing.T) {
	// The engine answers with what the ChatML template renders, so the
	// rendering must agree with ChatML and only with it (among those
	// that render every probe differently).
	var rd prompt.Renderer
	chatml := func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		p, err := rd.Render(nil, body, prompt.ChatML)
		if err != nil {
			http.Error(w, `{"error":{"code":400,"message":"`+err.Error()+`"}}`, http.StatusBadRequest)
			return
		}
		json.NewEncoder(w).Encode(map[string]string{"prompt": string(p.Text)})
	}
	srv := httptest.NewServer(http.HandlerFunc(chatml))
	defer srv.Close()
	r, err := FetchApplied(context.Background(), srv.Client(), srv.URL, "gemma-3-270m")
	if err != nil {
		t.Fatal(err)
	}
	if a := Compare(r, prompt.ChatML, nil); !a.Agrees() || a.Compared < len(Probes)-1 {
		t.Errorf("ChatML: %v", a)
	}
	if a := Compare(r, prompt.Llama3, nil); !a.Disagrees() {
		t.Errorf("Llama 3: %v, want a disagreement", a)
	}

	// llama.cpp leaves the BOS out of the text (its tokenizer adds the
	// token): Gemma's "<bos>" must not count as a difference, and nothing
	// else may be forgiven with it.
	gemma := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		p, err := rd.Render(nil, body, prompt.Gemma)
		if err != nil {
			http.Error(w, `{"error":{"code":400}}`, http.StatusBadRequest)
			return
		}
		json.NewEncoder(w).Encode(map[string]string{"prompt": strings.TrimPrefix(string(p.Text), "<bos>")})
	}))
	defer gemma.Close()
	if r, err = FetchApplied(context.Background(), gemma.Client(), gemma.URL, "gemma-3-270m"); err != nil {
		t.Fatal(err)
	}
	if a := Compare(r, prompt.Gemma, nil); !a.Agrees() {
		t.Errorf("Gemma without its BOS: %v", a)
	}
	if a := Compare(r, prompt.ChatML, nil); !a.Disagrees() {
		t.Errorf("ChatML against a Gemma engine: %v", a)
	}
	r.NoBOS = false
	if a := Compare(r, prompt.Gemma, nil); !a.Disagrees() || a.Common != len("<") {
		t.Errorf("Gemma without its BOS, from an engine that keeps it: %v", a)
	}

	for name, h := range map[string]http.HandlerFunc{
		"no apply-template": http.NotFound,
		"no prompt":         func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"tokens":[]}`)) },
	} {
		srv := httptest.NewServer(h)
		_, err := FetchApplied(context.Background(), srv.Client(), srv.URL, "m")
		srv.Close()
		if !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: err %v, want ErrUnsupported", name, err)
		}
	}
}
