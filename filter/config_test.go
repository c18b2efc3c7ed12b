package main

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/shared/prompt"
)

func TestParseConfig(t *testing.T) {
	cfg, err := parseConfig([]byte(`{
		"paths": ["/v1/chat/completions"],
		"max_body_bytes": 1024,
		"endpoints": ["10.0.0.1:8000", "[fd00::1]:8000"],
		"chat_template": "llama3",
		"block_size": 32,
		"max_blocks": 100,
		"affinity_blocks": 4
	}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.maxBodyBytes != 1024 || cfg.template != prompt.Llama3 || cfg.hashing.BlockSize != 32 ||
		cfg.hashing.MaxBlocks != 100 || cfg.affinityBlocks != 4 || len(cfg.paths) != 1 ||
		strings.Join(cfg.endpoints, ",") != "10.0.0.1:8000,[fd00::1]:8000" {
		t.Errorf("parsed %+v", cfg)
	}
	empty, err := parseConfig(nil)
	if err != nil || empty.maxBodyBytes != defaultMaxBodyBytes || len(empty.paths) != 2 {
		t.Errorf("empty configuration: %+v, %v", empty, err)
	}
}

func TestParseConfigErrorsNameTheField(t *testing.T) {
	for _, c := range []struct{ json, field string }{
		{`{"paths":"/v1"}`, "paths"},
		{`{"paths":[1]}`, "paths"},
		{`{"max_body_bytes":0}`, "max_body_bytes"},
		{`{"max_body_bytes":1e9}`, "max_body_bytes"},
		{`{"max_body_bytes":1.5}`, "max_body_bytes"},
		{`{"endpoints":["host:80"]}`, "endpoints"},
		{`{"endpoints":[80]}`, "endpoints"},
		{`{"chat_template":3}`, "chat_template"},
		{`{"block_size":-64}`, "block_size"},
		{`{"affinity_blocks":"8"}`, "affinity_blocks"},
		{`{"colour":"blue"}`, "colour"},
		{`[1,2]`, "object"},
		{`{"paths":`, "JSON"},
	} {
		_, err := parseConfig([]byte(c.json))
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: error %v, want one naming %q", c.json, err, c.field)
		}
	}
}

func TestRoutes(t *testing.T) {
	cfg := defaultConfig()
	for _, c := range []struct {
		method, path string
		want         bool
	}{
		{"POST", "/v1/chat/completions", true},
		{"POST", "/v1/completions?stream=true", true},
		{"GET", "/v1/chat/completions", false},
		{"POST", "/v1/chat/completions/x", false},
		{"POST", "/v1/embeddings", false},
		{"post", "/v1/completions", false},
	} {
		if got := cfg.routes(c.method, c.path); got != c.want {
			t.Errorf("routes(%s %s) = %v, want %v", c.method, c.path, got, c.want)
		}
	}
}

func TestRouterAffinityKey(t *testing.T) {
	cfg := defaultConfig()
	cfg.endpoints = []string{"10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"}
	r, err := newRouter(cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	shared := strings.Repeat("a shared system prompt of some length. ", 20)
	body := func(user string) []byte {
		return []byte(`{"model":"m","messages":[{"role":"system","content":"` + shared + `"},{"role":"user","content":"` + user + `"}]}`)
	}
	first := r.route(body("one"), nil, nil, false, false)
	if first.outcome != routed || first.reason != reasonRendezvous {
		t.Fatalf("decision %+v", first)
	}
	for _, u := range []string{"two", "three", strings.Repeat("long ", 1000)} {
		if d := r.route(body(u), nil, nil, false, false); d.endpoint != first.endpoint {
			t.Errorf("prompts sharing %d bytes went to %s and %s", len(shared), first.endpoint, d.endpoint)
		}
	}
	if d := r.route([]byte(`{"model":"m","messages":"hi"}`), nil, nil, false, false); d.outcome == routed {
		t.Error("messages as a string was routed")
	}
}
