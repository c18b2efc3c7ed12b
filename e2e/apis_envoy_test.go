package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/e2e/vllmsim"
	"github.com/kvroute/kvroute/shared/prompt"
)

// apiBody is one turn of a tool-using conversation in the Anthropic
// Messages or OpenAI Responses API, after a long system prompt.
func apiBody(api, system, question string, maxTokens int) []byte {
	var v map[string]any
	if api == "messages" {
		v = map[string]any{
			"model": simModel, "max_tokens": maxTokens,
			"system": []any{map[string]any{"type": "text", "text": system}},
			"tools": []any{map[string]any{"name": "lookup", "description": "Look a policy up.",
				"input_schema": map[string]any{"properties": map[string]any{"q": map[string]any{"type": "string"}}}}},
			"messages": []any{
				map[string]any{"role": "user", "content": "Find the refund policy."},
				map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": map[string]any{"q": "refund"}}}},
				map[string]any{"role": "user", "content": []any{
					map[string]any{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Refunds within 30 days."},
					map[string]any{"type": "text", "text": question}}},
			},
		}
	} else {
		v = map[string]any{
			"model": simModel, "max_output_tokens": maxTokens, "instructions": system,
			"tools": []any{map[string]any{"type": "function", "name": "lookup", "description": "Look a policy up.",
				"parameters": map[string]any{"type": "object", "properties": map[string]any{"q": map[string]any{"type": "string"}}}}},
			"input": []any{
				map[string]any{"role": "user", "content": "Find the refund policy."},
				map[string]any{"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": `{"q":"refund"}`},
				map[string]any{"type": "function_call_output", "call_id": "c1", "output": "Refunds within 30 days."},
				map[string]any{"role": "user", "content": question},
			},
		}
	}
	b, _ := json.Marshal(v)
	return b
}

// commonBlocks is how many 64-byte blocks the filter's renders of two
// bodies share.
func commonBlocks(t testing.TB, api string, a, b []byte) int {
	t.Helper()
	apiOf := prompt.Messages
	if api == "responses" {
		apiOf = prompt.Responses
	}
	var r prompt.Renderer
	var texts [2]string
	for i, body := range [][]byte{a, b} {
		if err := r.ParseAPI(body, apiOf); err != nil {
			t.Fatal(err)
		}
		p, err := r.RenderParsed(nil, prompt.ChatML)
		if err != nil {
			t.Fatal(err)
		}
		texts[i] = string(p.Text)
	}
	n := 0
	for n < len(texts[0]) && n < len(texts[1]) && texts[0][n] == texts[1][n] {
		n++
	}
	if n < 1000 {
		t.Fatalf("renders share only %d bytes", n)
	}
	return n / 64
}

// postPath sends body to url+path and returns the status, kvroute's
// decision and the response body.
func postPath(t testing.TB, client *http.Client, url, path string, body []byte) (int, string, []byte) {
	t.Helper()
	resp, err := client.Post(url+path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("x-kvroute-decision"), b
}

// TestEnvoyMessagesAndResponsesAPIs: requests in the Messages and
// Responses APIs are rendered as the engine renders them (it converts them
// its own way), so a conversation an engine has cached draws its next turn
// there by the engine's KV events alone; and a Responses request naming a
// previous response goes to the engine holding it, the only one that can
// answer it.
func TestEnvoyMessagesAndResponsesAPIs(t *testing.T) {
	es := startEngines(t, 3, vllmsim.Config{NumGPUBlocks: 512, TimeScale: 0.05})
	cs := startCachesync(t, "127.0.0.1:0", es, true)
	g := cachesyncGateway(t, es, cs.addr, nil)

	for i, api := range []string{"messages", "responses"} {
		path := "/v1/" + api
		for j := range 3 {
			warm := es[(i+j)%len(es)]
			system := "Tenant " + strconv.Itoa(10*i+j) + " support rules. " + strings.Repeat("Answer politely and cite the policy. ", 30)
			if code, _, body := postPath(t, http.DefaultClient, warm.URL(), path, apiBody(api, system, "First question?", 1)); code != http.StatusOK {
				t.Fatalf("%s: warming %s: %d %s", api, warm.Addr(), code, body)
			}
			// max tokens -1: the engine refuses before computing, the filter
			// routes and explains all the same.
			// Every block before the two turns' questions part matches once
			// the engine's events are in (they arrive a prefill chunk at a
			// time): the tools, the tool call and its result included.
			want := commonBlocks(t, api, apiBody(api, system, "First question?", 1), apiBody(api, system, "Second question?", 1))
			waitFor(t, 10*time.Second, api+" affinity to the engine that cached the conversation", func() bool {
				code, d, _ := postPath(t, g.client, g.url, path, apiBody(api, system, "Second question?", -1))
				if code != http.StatusBadRequest {
					t.Fatalf("%s probe: %d", api, code)
				}
				blocks, _ := strconv.Atoi(field(d, "gpu_blocks"))
				return affineTo(d, warm.Addr()) && blocks >= want
			})
		}
	}

	served := map[string]int{}
	for k := range 9 {
		// Long instructions, so that placement by cache room spreads the
		// conversations over the engines: the pin, not the prompt, must
		// bring each next turn home (its prompt leaves them out).
		system := "Conversation " + strconv.Itoa(k) + ". " + strings.Repeat("Keep answers short and cite the rule you apply. ", 120)
		first := map[string]any{"model": simModel, "instructions": system, "input": "Start.", "max_output_tokens": 2}
		b, _ := json.Marshal(first)
		code, d, body := postPath(t, g.client, g.url, "/v1/responses", b)
		var resp struct{ ID string }
		if code != http.StatusOK || json.Unmarshal(body, &resp) != nil || resp.ID == "" {
			t.Fatalf("turn 1: %d %s", code, body)
		}
		home := field(d, "endpoint")
		served[home]++
		for turn := 2; turn <= 3; turn++ {
			next, _ := json.Marshal(map[string]any{"model": simModel, "previous_response_id": resp.ID, "input": "Go on.", "max_output_tokens": 2})
			code, d, body = postPath(t, g.client, g.url, "/v1/responses", next)
			if code != http.StatusOK || field(d, "reason") != "response" || field(d, "endpoint") != home {
				t.Fatalf("conversation %d turn %d: %d %q %s, want 200 from %s by reason=response", k, turn, code, d, body, home)
			}
			json.Unmarshal(body, &resp)
		}
	}
	if len(served) < 2 {
		t.Errorf("first turns all went to %v", served)
	}
	// An id no engine knows is routed as any request, and the engine says so.
	bogus, _ := json.Marshal(map[string]any{"model": simModel, "previous_response_id": "resp_unknown", "input": "x", "max_output_tokens": 2})
	if code, d, _ := postPath(t, g.client, g.url, "/v1/responses", bogus); code != http.StatusNotFound || field(d, "reason") == "response" {
		t.Errorf("unknown previous response: %d %q, want the engine's 404", code, d)
	}
	stats, err := g.envoy.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n := stats["wasmcustom.kvroute.decisions.response"]; n != 18 {
		t.Errorf("kvroute.decisions.response %d, want 18", n)
	}
}
