package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/shared/policy"
	"github.com/kvroute/kvroute/shared/prompt"
)

// configKeys has one row per configuration field: a value the parser must
// take and what it must make of it, and one it must refuse.
var configKeys = []struct {
	key, good string
	check     func(c *config) bool
	bad       string
}{
	{"paths", `["/v1/chat/completions"]`, func(c *config) bool { return slices.Equal(c.paths, []string{"/v1/chat/completions"}) }, `"/v1"`},
	{"max_body_bytes", `1024`, func(c *config) bool { return c.maxBodyBytes == 1024 }, `1e9`},
	{"endpoints", `["10.0.0.1:8000","[fd00::1]:8000"]`, func(c *config) bool {
		return strings.Join(c.endpoints, ",") == "10.0.0.1:8000,[fd00::1]:8000"
	}, `["host:80"]`},
	{"chat_template", `"llama3"`, func(c *config) bool { return c.template == prompt.Llama3 && !c.autoTemplate }, `3`},
	{"chat_template_source", `"{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"`, func(c *config) bool {
		return c.template == prompt.Custom && c.custom != nil && strings.HasPrefix(c.templateName(), prompt.CustomPrefix)
	}, `"{% for m in %}"`},
	{"chat_template_tokens", `{"bos_token":"<s>"}`, func(c *config) bool { return c.customTokens["bos_token"] == "<s>" }, `{"bos_token":1}`},
	{"block_size", `32`, func(c *config) bool { return c.hashing.BlockSize == 32 && c.policy.BlockBytes == 32 }, `-64`},
	{"max_blocks", `100`, func(c *config) bool { return c.hashing.MaxBlocks == 100 }, `0`},
	{"affinity_blocks", `4`, func(c *config) bool { return c.affinityBlocks == 4 }, `"8"`},
	{"sync_interval_ms", `250`, func(c *config) bool { return c.syncInterval == 250*time.Millisecond }, `5`},
	{"max_staleness_ms", `9000`, func(c *config) bool { return c.maxStaleness == 9*time.Second }, `0`},
	{"report_blocks", `512`, func(c *config) bool { return c.reportBlocks == 512 }, `100000`},
	{"local_capacity_blocks", `1000`, func(c *config) bool { return c.localBlocks == 1000 }, `1.5`},
	{"hold_timeout_ms", `1500`, func(c *config) bool { return c.holdTimeout == 1500*time.Millisecond }, `-1`},
	{"debug_header", `true`, func(c *config) bool { return c.debugHeader }, `"yes"`},
	{"fallback_endpoints", `0`, func(c *config) bool { return c.fallbackEndpoints == 0 }, `9`},
	{"failure_mode", `"closed"`, func(c *config) bool { return c.failClosed }, `"shut"`},
	{"trust_subset_header", `true`, func(c *config) bool { return c.trustSubset }, `1`},
	{"session_header", `"X-Session-ID"`, func(c *config) bool { return c.sessionHeader == "x-session-id" }, `""`},
	{"session_ttl_ms", `60000`, func(c *config) bool { return c.sessionTTL == time.Minute }, `10`},
	{"cachesync.cluster", `"cs"`, func(c *config) bool { return c.cachesync.cluster == "cs" }, `""`},
	{"cachesync.authority", `"cachesync.llm"`, func(c *config) bool { return c.cachesync.authority == "cachesync.llm" }, `7`},
	{"cachesync.snapshot_path", `"/snap"`, func(c *config) bool { return c.cachesync.snapshotPath == "/snap" }, `"snap"`},
	{"cachesync.report_path", `"/rep"`, func(c *config) bool { return c.cachesync.reportPath == "/rep" }, `"rep"`},
	{"cachesync.report_token", `"s3cret"`, func(c *config) bool { return c.cachesync.reportToken == "s3cret" }, `""`},
	{"cachesync.report_token_env", `"PATH"`, func(c *config) bool { return c.cachesync.reportToken == os.Getenv("PATH") }, `"KVROUTE_NO_SUCH_VARIABLE"`},
	{"cachesync.timeout_ms", `500`, func(c *config) bool { return c.cachesync.timeout == 500*time.Millisecond }, `0`},
	{"policy.mode", `"decode"`, func(c *config) bool { return c.policy.Mode == policy.ModeDecode }, `"fast"`},
	{"policy.prefill_tokens_per_second", `20000`, func(c *config) bool { return c.policy.PrefillRate == 20000 }, `0`},
	{"policy.cpu_discount", `0.5`, func(c *config) bool { return c.policy.CPUDiscount == 0.5 }, `2`},
	{"policy.others_weight", `0`, func(c *config) bool { return c.policy.OthersWeight == 0 }, `-1`},
	{"policy.eviction_weight", `2.5`, func(c *config) bool { return c.policy.EvictionWeight == 2.5 }, `11`},
	{"policy.tie_tolerance_ms", `10`, func(c *config) bool { return c.policy.TieTolerance == 10*time.Millisecond }, `-1`},
	{"policy.slo_ttft_ms", `1500`, func(c *config) bool { return c.policy.SLOTTFT == 1500*time.Millisecond }, `-1`},
	{"policy.slo_tpot_ms", `50`, func(c *config) bool { return c.policy.SLOTPOT == 50*time.Millisecond }, `"50"`},
	{"policy.default_output_tokens", `512`, func(c *config) bool { return c.policy.DefaultOutputTokens == 512 }, `0`},
	{"policy.shed", `true`, func(c *config) bool { return c.shed }, `1`},
}

// withKey nests a dotted key's value into a configuration object, adding
// cachesync's required cluster when the key is in that section.
func withKey(key, value string) string {
	sec, name, nested := strings.Cut(key, ".")
	switch {
	case key == "chat_template_tokens":
		return `{"chat_template":"custom","chat_template_source":"{{ bos_token }}","` + key + `":` + value + `}`
	case strings.HasPrefix(key, "chat_template_"):
		return `{"chat_template":"custom","` + key + `":` + value + `}`
	case !nested:
		return `{"` + key + `":` + value + `}`
	}
	extra := ""
	if sec == "cachesync" && name != "cluster" {
		extra = `"cluster":"cs",`
	}
	return `{"` + sec + `":{` + extra + `"` + name + `":` + value + `}}`
}

func TestParseConfigEveryField(t *testing.T) {
	for _, k := range configKeys {
		t.Run(k.key, func(t *testing.T) {
			cfg, err := parseConfig([]byte(withKey(k.key, k.good)))
			if err != nil {
				t.Fatalf("%s = %s: %v", k.key, k.good, err)
			}
			if !k.check(&cfg) {
				t.Errorf("%s = %s not applied: %+v", k.key, k.good, cfg)
			}
			_, err = parseConfig([]byte(withKey(k.key, k.bad)))
			if err == nil || !strings.Contains(err.Error(), k.key) {
				t.Errorf("%s = %s: error %v, want one naming the field", k.key, k.bad, err)
			}
		})
	}
}

// TestConfigKeysCoverTheParser: every field the parser accepts has its row
// above, and no row names a field it does not accept.
func TestConfigKeysCoverTheParser(t *testing.T) {
	var rows, fields []string
	for _, k := range configKeys {
		rows = append(rows, k.key)
	}
	for _, f := range configFields {
		fields = append(fields, f.name)
	}
	slices.Sort(rows)
	slices.Sort(fields)
	if !slices.Equal(rows, fields) {
		t.Errorf("test rows %v\nparser fields %v", rows, fields)
	}
}

// TestREADMEListsEveryField: the README's configuration table has one row
// per field the parser accepts, and no other.
func TestREADMEListsEveryField(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "### Configuration")
	if start < 0 {
		t.Fatal("README has no ### Configuration section")
	}
	section := text[start:]
	if end := strings.Index(section[4:], "\n#"); end >= 0 {
		section = section[:end+4]
	}
	row := regexp.MustCompile("(?m)^\\| `([a-z_.]+)` \\|")
	var listed []string
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		listed = append(listed, m[1])
	}
	var fields []string
	for _, f := range configFields {
		fields = append(fields, f.name)
	}
	slices.Sort(listed)
	slices.Sort(fields)
	if !slices.Equal(listed, fields) {
		t.Errorf("README lists %v\nthe parser accepts %v", listed, fields)
	}
}

func TestParseConfigDefaultsAndShape(t *testing.T) {
	empty, err := parseConfig(nil)
	if err != nil || empty.maxBodyBytes != defaultMaxBodyBytes || len(empty.paths) != 4 || empty.cachesync != nil {
		t.Errorf("empty configuration: %+v, %v", empty, err)
	}
	// chat_template auto is the default and can be named; a fixed template
	// is what the filter tells cachesync it renders with.
	if !empty.autoTemplate || empty.templateName() != "auto" {
		t.Errorf("default chat template %v (auto %v), want auto", empty.template, empty.autoTemplate)
	}
	if auto, err := parseConfig([]byte(`{"chat_template":"auto"}`)); err != nil || !auto.autoTemplate || auto.template != prompt.Plain {
		t.Errorf("chat_template auto: %+v, %v", auto.template, err)
	}
	if fixed, _ := parseConfig([]byte(`{"chat_template":"qwen3"}`)); fixed.autoTemplate || fixed.templateName() != "qwen3" {
		t.Errorf("chat_template qwen3 names itself %q", fixed.templateName())
	}
	for _, c := range []struct{ json, field string }{
		{`{"colour":"blue"}`, "colour"},
		{`{"policy":{"colour":"blue"}}`, "policy.colour"},
		{`{"cachesync":"cs"}`, "cachesync"},
		{`{"cachesync":{}}`, "cachesync.cluster"},
		{`{"policy":1}`, "policy"},
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
	first := r.route(body("one"), nil, nil, routeOptions{})
	if first.outcome != routed || first.reason != reasonRendezvous {
		t.Fatalf("decision %+v", first)
	}
	for _, u := range []string{"two", "three", strings.Repeat("long ", 1000)} {
		if d := r.route(body(u), nil, nil, routeOptions{}); d.endpoint != first.endpoint {
			t.Errorf("prompts sharing %d bytes went to %s and %s", len(shared), first.endpoint, d.endpoint)
		}
	}
	if d := r.route([]byte(`{"model":"m","messages":"hi"}`), nil, nil, routeOptions{}); d.outcome == routed {
		t.Error("messages as a string was routed")
	}
}
