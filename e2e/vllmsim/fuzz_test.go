package vllmsim

import (
	"context"
	"testing"
)

// FuzzProbe feeds arbitrary bodies through request validation, template
// rendering and tokenization: bad input gets an error, never a panic.
func FuzzProbe(f *testing.F) {
	for _, s := range []string{
		`{"messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"}]}],"tools":[{"a":1}]}`,
		`{"messages":[{"role":"user"}],"chat_template_kwargs":{"x":[1,2.5,null]}}`,
		`{"prompt":[[1,2],[3]],"max_tokens":3}`,
		`{"prompt":"x","cache_salt":"s","model":"m"}`,
		`{"messages":[{"role":"assistant","content":"a"}],"add_generation_prompt":false,"continue_final_message":true}`,
	} {
		f.Add("/v1/chat/completions", []byte(s))
		f.Add("/v1/completions", []byte(s))
	}
	cfg := testConfig()
	cfg.KVEvents = KVEventsConfig{}
	cfg.ChatTemplate = "gemma" // raises on bad role order; the other families are in TestProbeNeverPanics
	e, err := Start(context.Background(), cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { e.Close() })
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		e.Probe(path, body)
	})
}

// TestProbeNeverPanics runs the fuzz seeds against every template family.
func TestProbeNeverPanics(t *testing.T) {
	bodies := []string{
		`{"messages":[{"role":"user","content":null}]}`,
		`{"messages":[{"role":"tool","content":{"a":[1]}}],"tools":[{"function":{"name":1}}]}`,
		`{"messages":[{"role":"user","content":"x","tool_calls":[{"function":{"arguments":"not json"}}]}]}`,
		`{"messages":[{"role":"user","content":"x","tool_calls":"nope"}]}`,
		`{"messages":[{"role":"assistant","tool_calls":[{"id":"123","function":{"name":"f","arguments":{}}}]}]}`,
		`{"messages":[{"role":"user","content":[]}]}`,
		`{"messages":[[]]}`,
		`{"messages":"x"}`,
		`{"messages":[{"role":"user","content":"\u0000\ud800"}]}`,
		`[]`, `null`, `""`, `{"prompt":-1}`, `{"prompt":[[]]}`, `{"prompt":[1.5]}`,
	}
	for _, fam := range []string{"chatml", "llama3", "mistral", "gemma"} {
		cfg := testConfig()
		cfg.ChatTemplate = fam
		cfg.KVEvents = KVEventsConfig{}
		e := startEngine(t, cfg)
		for _, b := range bodies {
			for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
				e.Probe(path, []byte(b))
			}
		}
	}
}
