package envoy

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

const bootstrap = `
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: 9901}}
static_resources:
  listeners:
  - name: llm
    address: {socket_address: {address: 127.0.0.1, port_value: 10000}}
    per_connection_buffer_limit_bytes: 10485760
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          http_filters:
          - name: envoy.filters.http.wasm
            typed_config:
              config:
                name: kvroute
                vm_config: {runtime: envoy.wasm.runtime.v8, code: {local: {filename: build/kvroute.wasm}}}
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: '{"max_body_bytes": 8388608, "endpoints": ["127.0.0.1:8001"]}'
          - name: envoy.filters.http.router
  clusters:
  - name: engines
    load_assignment:
      cluster_name: engines
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 8001}}}
`

func TestConfigRewrite(t *testing.T) {
	c, err := ParseConfig([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.UseFreePorts(); err != nil {
		t.Fatal(err)
	}
	if err := c.SetEndpoints("engines", []string{"127.0.0.1:41001", "[::1]:41002"}); err != nil {
		t.Fatal(err)
	}
	if err := c.SetWasmCode("kvroute", "/tmp/k.wasm"); err != nil {
		t.Fatal(err)
	}
	pc, err := c.PluginConfiguration("kvroute")
	if err != nil {
		t.Fatal(err)
	}
	if got := pc["max_body_bytes"]; got != json.Number("8388608") {
		t.Errorf("max_body_bytes = %#v", got)
	}
	pc["endpoints"] = []string{"127.0.0.1:41001"}
	if err := c.SetPluginConfiguration("kvroute", pc); err != nil {
		t.Fatal(err)
	}
	b, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	for _, want := range []string{
		`"admin":{"address":{"socket_address":{"address":"127.0.0.1","port_value":0}}}`,
		`"per_connection_buffer_limit_bytes":10485760`, // untouched, exact
		`"filename":"/tmp/k.wasm"`,
		`{"address":"::1","port_value":41002}`,
		`"value":"{\"endpoints\":[\"127.0.0.1:41001\"],\"max_body_bytes\":8388608}"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("rewritten config lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "10000") || strings.Contains(out, "8001}") {
		t.Errorf("old port left in:\n%s", out)
	}

	if err := c.RemoveWasmFilters(); err != nil {
		t.Fatal(err)
	}
	b, _ = c.Marshal()
	if strings.Contains(string(b), "envoy.filters.http.wasm") || !strings.Contains(string(b), "envoy.filters.http.router") {
		t.Errorf("after RemoveWasmFilters:\n%s", b)
	}
	if err := c.RemoveWasmFilters(); err == nil {
		t.Error("removing a Wasm filter that is not there succeeded")
	}
}

func TestConfigErrors(t *testing.T) {
	cases := []struct {
		name string
		edit func(*Config) error
		want string
	}{
		{"unknown cluster", func(c *Config) error { return c.SetEndpoints("nope", nil) }, `no clusters named "nope"`},
		{"bad endpoint", func(c *Config) error { return c.SetEndpoints("engines", []string{"localhost:80"}) }, "engines"},
		{"unknown plugin", func(c *Config) error { return c.SetWasmCode("other", "x") }, `no Wasm plugin named "other"`},
		{"unknown plugin config", func(c *Config) error { _, err := c.PluginConfiguration("other"); return err }, "other"},
	}
	for _, tc := range cases {
		c, err := ParseConfig([]byte(bootstrap))
		if err != nil {
			t.Fatal(err)
		}
		err = tc.edit(c)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
	for _, bad := range []string{"", "[1, 2]", "admin: [unclosed"} {
		if _, err := ParseConfig([]byte(bad)); err == nil {
			t.Errorf("ParseConfig(%q) succeeded", bad)
		}
	}
}

// TestShippedIdleTimeout: envoy.yaml closes idle connections to the
// engines before they do (5 s: uvicorn's and cpp-httplib's keep-alive), so
// that no request goes down a connection an engine is closing.
func TestShippedIdleTimeout(t *testing.T) {
	c, err := LoadConfig("../../envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	engines, err := c.named("clusters", "engines")
	if err != nil {
		t.Fatal(err)
	}
	opts, err := object(engines, "typed_extension_protocol_options", "envoy.extensions.upstreams.http.v3.HttpProtocolOptions", "common_http_protocol_options")
	if err != nil {
		t.Fatal(err)
	}
	idle, _ := opts["idle_timeout"].(string)
	d, err := time.ParseDuration(idle)
	if err != nil || d <= 0 || d >= 5*time.Second {
		t.Errorf("engines idle_timeout %q, want under the engines' 5 s", idle)
	}
}

func TestSetOneRequestPerConnection(t *testing.T) {
	c, err := LoadConfig("../../envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetOneRequestPerConnection("engines"); err != nil {
		t.Fatal(err)
	}
	engines, _ := c.named("clusters", "engines")
	opts, err := object(engines, "typed_extension_protocol_options", "envoy.extensions.upstreams.http.v3.HttpProtocolOptions", "common_http_protocol_options")
	if err != nil || opts["max_requests_per_connection"] != 1 || opts["idle_timeout"] != "4s" {
		t.Errorf("engines protocol options %v (%v)", opts, err)
	}
	if err := c.SetOneRequestPerConnection("cachesync"); err == nil {
		t.Error("a cluster without HttpProtocolOptions was changed")
	}
}
