package envoy

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// Well-known names in an Envoy bootstrap.
const (
	hcmFilter  = "envoy.filters.network.http_connection_manager"
	wasmFilter = "envoy.filters.http.wasm"
	stringType = "type.googleapis.com/google.protobuf.StringValue"
)

// Config is an Envoy bootstrap decoded into generic JSON values, so that a
// test runs a shipped file and rewrites only what a test run must change
// (ports, endpoint addresses, the module path, the plugin configuration).
type Config struct {
	root map[string]any
}

// LoadConfig reads a bootstrap file (YAML or JSON).
func LoadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := ParseConfig(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ParseConfig decodes a bootstrap (YAML or JSON). Numbers stay exact.
func ParseConfig(data []byte) (*Config, error) {
	var root map[string]any
	useNumber := func(d *json.Decoder) *json.Decoder { d.UseNumber(); return d }
	if err := yaml.Unmarshal(data, &root, useNumber); err != nil {
		return nil, fmt.Errorf("envoy config: %w", err)
	}
	if root == nil {
		return nil, fmt.Errorf("envoy config: empty")
	}
	return &Config{root: root}, nil
}

// Marshal encodes the bootstrap as JSON, which Envoy reads as YAML.
func (c *Config) Marshal() ([]byte, error) { return json.Marshal(c.root) }

// UseFreePorts binds the admin endpoint and every listener to port 0, so
// that Envoy picks free ports and concurrent runs cannot collide; the
// Process reports the ports it got. Addresses stay as configured.
func (c *Config) UseFreePorts() error {
	adm, err := object(c.root, "admin")
	if err != nil {
		return err
	}
	if err := setPort(adm); err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	listeners, err := c.list("listeners")
	if err != nil {
		return err
	}
	for _, l := range listeners {
		if err := setPort(l); err != nil {
			return fmt.Errorf("listener %v: %w", l["name"], err)
		}
	}
	return nil
}

// SetListenerPort binds the named listener to port, for runs that must
// know it in advance (a hot restart hands the socket to the next process).
func (c *Config) SetListenerPort(name string, port int) error {
	l, err := c.named("listeners", name)
	if err != nil {
		return err
	}
	sa, err := object(l, "address", "socket_address")
	if err != nil {
		return err
	}
	sa["port_value"] = port
	return nil
}

func setPort(holder map[string]any) error {
	sa, err := object(holder, "address", "socket_address")
	if err != nil {
		return err
	}
	sa["port_value"] = 0
	return nil
}

// SetEndpoints replaces the static endpoints of the named cluster with
// addrs (ip:port).
func (c *Config) SetEndpoints(cluster string, addrs []string) error {
	return c.SetPriorityEndpoints(cluster, addrs)
}

// SetPriorityEndpoints replaces the static endpoints of the named cluster
// with one priority level per list of addrs, the first the highest: Envoy
// sends to a lower level only what the levels above cannot take healthy.
func (c *Config) SetPriorityEndpoints(cluster string, levels ...[]string) error {
	cl, err := c.named("clusters", cluster)
	if err != nil {
		return err
	}
	var endpoints []any
	for priority, addrs := range levels {
		var lbEndpoints []any
		for _, a := range addrs {
			ap, err := netip.ParseAddrPort(a)
			if err != nil {
				return fmt.Errorf("cluster %s: %w", cluster, err)
			}
			lbEndpoints = append(lbEndpoints, map[string]any{
				"endpoint": map[string]any{"address": map[string]any{"socket_address": map[string]any{
					"address": ap.Addr().String(), "port_value": ap.Port(),
				}}},
			})
		}
		level := map[string]any{"lb_endpoints": lbEndpoints}
		if priority > 0 {
			level["priority"] = priority
		}
		endpoints = append(endpoints, level)
	}
	cl["load_assignment"] = map[string]any{"cluster_name": cluster, "endpoints": endpoints}
	return nil
}

// SetClusterField sets one field of the named cluster (a value as the
// bootstrap's JSON would hold it).
func (c *Config) SetClusterField(cluster, field string, value any) error {
	cl, err := c.named("clusters", cluster)
	if err != nil {
		return err
	}
	cl[field] = value
	return nil
}

// SetWasmCode points the Wasm HTTP filter whose plugin is named plugin at
// a local module file.
func (c *Config) SetWasmCode(plugin, path string) error {
	pc, err := c.plugin(plugin)
	if err != nil {
		return err
	}
	vm, err := object(pc, "vm_config")
	if err != nil {
		return err
	}
	vm["code"] = map[string]any{"local": map[string]any{"filename": path}}
	return nil
}

// PluginConfiguration returns the JSON configuration of the named Wasm
// plugin, decoded.
func (c *Config) PluginConfiguration(plugin string) (map[string]any, error) {
	pc, err := c.plugin(plugin)
	if err != nil {
		return nil, err
	}
	cfg, err := object(pc, "configuration")
	if err != nil {
		return nil, err
	}
	if cfg["@type"] != stringType {
		return nil, fmt.Errorf("plugin %s: configuration is %v, want a %s", plugin, cfg["@type"], stringType)
	}
	s, ok := cfg["value"].(string)
	if !ok {
		return nil, fmt.Errorf("plugin %s: configuration value is not a string", plugin)
	}
	var v map[string]any
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("plugin %s: configuration: %w", plugin, err)
	}
	return v, nil
}

// SetPluginConfiguration replaces the named Wasm plugin's configuration.
func (c *Config) SetPluginConfiguration(plugin string, v map[string]any) error {
	pc, err := c.plugin(plugin)
	if err != nil {
		return err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	pc["configuration"] = map[string]any{"@type": stringType, "value": string(b)}
	return nil
}

// RemoveWasmFilters deletes every Wasm HTTP filter, leaving the rest of the
// chain (the router) as it is: the baseline the filter is measured against.
func (c *Config) RemoveWasmFilters() error {
	chains, err := c.httpFilterChains()
	if err != nil {
		return err
	}
	n := 0
	for _, hcm := range chains {
		filters := hcm["http_filters"].([]any)
		kept := slices.DeleteFunc(slices.Clone(filters), func(f any) bool {
			m, ok := f.(map[string]any)
			return ok && m["name"] == wasmFilter
		})
		n += len(filters) - len(kept)
		hcm["http_filters"] = kept
	}
	if n == 0 {
		return fmt.Errorf("envoy config: no %s filter", wasmFilter)
	}
	return nil
}

// AddAccessLog makes every HTTP connection manager append one line per
// request to the file at path, in Envoy's text format (e.g.
// "%RESP(X-KVROUTE-DECISION)%\n").
func (c *Config) AddAccessLog(path, format string) error {
	chains, err := c.httpFilterChains()
	if err != nil {
		return err
	}
	for _, hcm := range chains {
		logs, _ := hcm["access_log"].([]any)
		hcm["access_log"] = append(logs, map[string]any{
			"name": "envoy.access_loggers.file",
			"typed_config": map[string]any{
				"@type":      "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
				"path":       path,
				"log_format": map[string]any{"text_format_source": map[string]any{"inline_string": format}},
			},
		})
	}
	return nil
}

// plugin finds the PluginConfig of the Wasm HTTP filter named plugin.
func (c *Config) plugin(name string) (map[string]any, error) {
	chains, err := c.httpFilterChains()
	if err != nil {
		return nil, err
	}
	for _, hcm := range chains {
		for _, f := range hcm["http_filters"].([]any) {
			m, ok := f.(map[string]any)
			if !ok || m["name"] != wasmFilter {
				continue
			}
			pc, err := object(m, "typed_config", "config")
			if err != nil {
				return nil, err
			}
			if pc["name"] == name {
				return pc, nil
			}
		}
	}
	return nil, fmt.Errorf("envoy config: no Wasm plugin named %q", name)
}

// httpFilterChains returns the typed_config of every HTTP connection
// manager in the static listeners.
func (c *Config) httpFilterChains() ([]map[string]any, error) {
	listeners, err := c.list("listeners")
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for _, l := range listeners {
		chains, _ := l["filter_chains"].([]any)
		for _, ch := range chains {
			chm, _ := ch.(map[string]any)
			filters, _ := chm["filters"].([]any)
			for _, f := range filters {
				fm, _ := f.(map[string]any)
				if fm["name"] != hcmFilter {
					continue
				}
				tc, err := object(fm, "typed_config")
				if err != nil {
					return nil, err
				}
				if _, ok := tc["http_filters"].([]any); !ok {
					return nil, fmt.Errorf("listener %v: http_connection_manager has no http_filters", l["name"])
				}
				out = append(out, tc)
			}
		}
	}
	return out, nil
}

// list returns static_resources.<kind> as objects.
func (c *Config) list(kind string) ([]map[string]any, error) {
	sr, err := object(c.root, "static_resources")
	if err != nil {
		return nil, err
	}
	items, ok := sr[kind].([]any)
	if !ok {
		return nil, fmt.Errorf("envoy config: static_resources.%s is not a list", kind)
	}
	out := make([]map[string]any, 0, len(items))
	for i, it := range items {
		m, ok := it.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("envoy config: static_resources.%s[%d] is not an object", kind, i)
		}
		out = append(out, m)
	}
	return out, nil
}

func (c *Config) named(kind, name string) (map[string]any, error) {
	items, err := c.list(kind)
	if err != nil {
		return nil, err
	}
	for _, it := range items {
		if it["name"] == name {
			return it, nil
		}
	}
	return nil, fmt.Errorf("envoy config: no %s named %q", kind, name)
}

// object walks keys down from m, each step an object.
func object(m map[string]any, keys ...string) (map[string]any, error) {
	for i, k := range keys {
		next, ok := m[k].(map[string]any)
		if !ok {
			return nil, fmt.Errorf("envoy config: %v is not an object", keys[:i+1])
		}
		m = next
	}
	return m, nil
}

// SetRoundRobin makes the named cluster balance by plain round robin, as a
// Kubernetes Service does: the baseline kvroute is compared with.
func (c *Config) SetRoundRobin(cluster string) error {
	return c.setPolicy(cluster, "round_robin", "RoundRobin")
}

// SetLeastRequest makes the named cluster balance by Envoy's least-request
// policy (power of two choices over requests in flight).
func (c *Config) SetLeastRequest(cluster string) error {
	return c.setPolicy(cluster, "least_request", "LeastRequest")
}

func (c *Config) setPolicy(cluster, name, typ string) error {
	cl, err := c.named("clusters", cluster)
	if err != nil {
		return err
	}
	cl["load_balancing_policy"] = map[string]any{"policies": []any{map[string]any{
		"typed_extension_config": map[string]any{
			"name": "envoy.load_balancing_policies." + name,
			"typed_config": map[string]any{
				"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies." + name + ".v3." + typ,
			},
		},
	}}}
	return nil
}

// SetOneRequestPerConnection makes the named cluster close each upstream
// connection after one request, as llama.cpp's server needs: it closes
// the connection after every streamed response while advertising
// keep-alive, and a request Envoy sends down it meanwhile fails (503,
// "connection termination"). The cluster must carry the shipped
// HttpProtocolOptions.
func (c *Config) SetOneRequestPerConnection(cluster string) error {
	cl, err := c.named("clusters", cluster)
	if err != nil {
		return err
	}
	opts, err := object(cl, "typed_extension_protocol_options", "envoy.extensions.upstreams.http.v3.HttpProtocolOptions", "common_http_protocol_options")
	if err != nil {
		return err
	}
	opts["max_requests_per_connection"] = 1
	return nil
}
