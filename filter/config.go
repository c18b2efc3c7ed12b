package main

import (
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/filter/internal/placed"
	"github.com/kvroute/kvroute/shared/approx"
	"github.com/kvroute/kvroute/shared/blockhash"
	"github.com/kvroute/kvroute/shared/policy"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/syncapi"
	"github.com/tidwall/gjson"
)

// config is the validated plugin configuration.
type config struct {
	paths        []string
	maxBodyBytes int
	// endpoints are the rendezvous fallback's candidates, and in local mode
	// the endpoints the filter's own index covers.
	endpoints []string
	// template renders chat requests; with autoTemplate, only those whose
	// model the snapshot names no template for.
	template     prompt.Template
	autoTemplate bool
	// custom is the template chat_template "custom" renders with, parsed
	// from customSource and customTokens.
	custom       *prompt.Jinja
	customSource string
	customTokens map[string]string
	hashing      blockhash.Config
	// affinityBlocks is how many leading blocks name a prompt for the
	// rendezvous fallback.
	affinityBlocks int

	// cachesync, when set, is where snapshots come from and reports go;
	// without it the filter keeps its own approximate index (local mode).
	cachesync *cachesyncConfig
	// syncInterval is the tick: snapshot refresh, fetch, report batching.
	syncInterval time.Duration
	// maxStaleness: a snapshot older than this is not trusted for load.
	maxStaleness time.Duration
	policy       policy.Config
	// reportBlocks caps the block hashes reported per routed request.
	reportBlocks int
	// localBlocks is each endpoint's capacity in local mode, in blocks.
	localBlocks int
	// debugHeader adds x-kvroute-decision to responses.
	debugHeader bool
	// shed answers 429 to a sheddable request (x-kvroute-sheddable) that
	// no endpoint is predicted to serve within its SLO.
	shed bool
	// fallbackEndpoints is how many next-best endpoints follow the chosen
	// one in the destination header, for the route's retries.
	fallbackEndpoints int
	// sessionHeader (lower case) names a request's session, "" for none;
	// a session is pinned to its endpoint for sessionTTL after its last
	// request.
	sessionHeader string
	sessionTTL    time.Duration
	// trustSubset honours x-gateway-destination-endpoint-subset: a filter
	// in front that strips the client's sets it. Off, the header is removed
	// unread, since it would let a client choose its upstream.
	trustSubset bool
	// failClosed answers 503 when no endpoint can be picked, instead of
	// leaving the request to Envoy's own balancing.
	failClosed bool
	// holdTimeout is how long a request may wait for its body before the
	// filter lets it go unrouted. It only expires if Envoy never delivers
	// the body, which happens when allow_on_headers_stop_iteration is unset.
	holdTimeout time.Duration
}

type cachesyncConfig struct {
	cluster      string // Envoy cluster of cachesync
	authority    string
	snapshotPath string
	reportPath   string
	reportToken  string
	// reportTokenEnv names a VM environment variable holding the token.
	reportTokenEnv string
	timeout        time.Duration
}

const (
	defaultMaxBodyBytes = 8 << 20
	// maxMaxBodyBytes bounds what one worker may buffer per request.
	maxMaxBodyBytes = 64 << 20
)

func defaultConfig() config {
	return config{
		paths:          []string{"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"},
		maxBodyBytes:   defaultMaxBodyBytes,
		template:       prompt.Plain,
		autoTemplate:   true,
		hashing:        blockhash.Config{BlockSize: blockhash.DefaultBlockSize, MaxBlocks: blockhash.DefaultMaxBlocks},
		affinityBlocks: 8,
		syncInterval:   100 * time.Millisecond,
		maxStaleness:   5 * time.Second,
		policy:         policy.DefaultConfig(),
		reportBlocks:   2048,
		// llm-d's default LRU capacity per server: about 500k tokens.
		localBlocks: approx.DefaultCapacity,
		holdTimeout: 5 * time.Second,
		// One next-best endpoint: what a retry of a refused connection
		// needs, and an ordered list an Endpoint Picker consumer expects.
		fallbackEndpoints: 1,
		// A chat's next turn comes within minutes, and vLLM's cache keeps
		// a finished conversation about that long under load.
		sessionTTL: 10 * time.Minute,
	}
}

// configError names the offending field, so an operator reading Envoy's log
// knows what to fix.
type configError struct {
	field string
	msg   string
}

func (e *configError) Error() string { return "plugin configuration: " + e.field + ": " + e.msg }

func fieldErr(field, msg string) error { return &configError{field: field, msg: msg} }

// parseConfig validates the JSON plugin configuration. An empty
// configuration means all defaults. Unknown fields are errors: a typo must
// not silently leave a default in force.
func parseConfig(data []byte) (config, error) {
	cfg := defaultConfig()
	if len(strings.TrimSpace(string(data))) == 0 {
		return cfg, cfg.finish()
	}
	if !gjson.ValidBytes(data) {
		return cfg, errors.New("plugin configuration: not valid JSON")
	}
	root := gjson.ParseBytes(data)
	if !root.IsObject() {
		return cfg, errors.New("plugin configuration: not a JSON object")
	}
	if err := eachField(root, "", cfg.set); err != nil {
		return cfg, err
	}
	return cfg, cfg.finish()
}

// eachField calls set for every field of obj, prefixing nested names.
func eachField(obj gjson.Result, prefix string, set func(string, gjson.Result) error) error {
	var err error
	obj.ForEach(func(key, v gjson.Result) bool {
		err = set(prefix+key.String(), v)
		return err == nil
	})
	return err
}

// finish checks what only the whole configuration can tell.
func (c *config) finish() error {
	c.policy.BlockBytes = c.hashing.Size()
	if _, err := policy.New(c.policy); err != nil {
		return fieldErr("policy", err.Error())
	}
	switch {
	case c.template == prompt.Custom && c.customSource == "":
		return fieldErr("chat_template_source", "required by chat_template custom")
	case c.template != prompt.Custom && (c.customSource != "" || c.customTokens != nil):
		return fieldErr("chat_template_source", "only with chat_template custom")
	case c.template == prompt.Custom:
		var err error
		if c.custom, err = prompt.ParseJinja(c.customSource, c.customTokens); err != nil {
			return fieldErr("chat_template_source", err.Error())
		}
	}
	if c.cachesync == nil {
		return nil
	}
	if c.cachesync.cluster == "" {
		return fieldErr("cachesync.cluster", "required")
	}
	if name := c.cachesync.reportTokenEnv; name != "" {
		// The Wasm VM's environment: Envoy's vm_config.environment_variables,
		// so the token can come from a Secret rather than plain config.
		token, ok := syscall.Getenv(name)
		if !ok || token == "" {
			return fieldErr("cachesync.report_token_env", "the VM environment has no "+name)
		}
		c.cachesync.reportToken = token
	}
	return nil
}

// setter applies one field's value to a configuration.
type setter func(c *config, v gjson.Result) (err error)

// configFields are every field the configuration accepts, nested ones by
// their dotted path; the README's configuration table lists exactly these
// (TestREADMEListsEveryField).
var configFields = []struct {
	name string
	set  setter
}{
	{"paths", func(c *config, v gjson.Result) (err error) { c.paths, err = pathList(v); return }},
	{"max_body_bytes", func(c *config, v gjson.Result) (err error) {
		c.maxBodyBytes, err = positiveInt(v, maxMaxBodyBytes)
		return
	}},
	{"endpoints", func(c *config, v gjson.Result) (err error) { c.endpoints, err = endpointList(v); return }},
	{"chat_template", func(c *config, v gjson.Result) (err error) {
		if v.Type != gjson.String {
			return errors.New("want a template name or auto")
		}
		if c.autoTemplate = v.Str == syncapi.AutoTemplate; c.autoTemplate {
			c.template = prompt.Plain
			return nil
		}
		c.template, err = prompt.ParseTemplate(v.Str)
		return
	}},
	{"chat_template_source", func(c *config, v gjson.Result) error {
		if v.Type != gjson.String || v.Str == "" {
			return errors.New("want the template's Jinja source")
		}
		c.customSource = v.Str
		return nil
	}},
	{"chat_template_tokens", func(c *config, v gjson.Result) (err error) {
		if !v.IsObject() {
			return errors.New("want an object of special token strings")
		}
		c.customTokens = map[string]string{}
		v.ForEach(func(k, t gjson.Result) bool {
			if t.Type != gjson.String {
				err = errors.New(k.Str + ": want a string")
				return false
			}
			c.customTokens[k.Str] = t.Str
			return true
		})
		return err
	}},
	{"block_size", func(c *config, v gjson.Result) (err error) { c.hashing.BlockSize, err = positiveInt(v, 1<<20); return }},
	{"max_blocks", func(c *config, v gjson.Result) (err error) { c.hashing.MaxBlocks, err = positiveInt(v, 1<<20); return }},
	{"affinity_blocks", func(c *config, v gjson.Result) (err error) { c.affinityBlocks, err = positiveInt(v, 1<<20); return }},
	{"sync_interval_ms", func(c *config, v gjson.Result) (err error) { c.syncInterval, err = millis(v, 10, 60_000); return }},
	{"max_staleness_ms", func(c *config, v gjson.Result) (err error) { c.maxStaleness, err = millis(v, 1, 3_600_000); return }},
	{"report_blocks", func(c *config, v gjson.Result) (err error) { c.reportBlocks, err = positiveInt(v, 1<<16); return }},
	{"local_capacity_blocks", func(c *config, v gjson.Result) (err error) { c.localBlocks, err = positiveInt(v, 1<<24-2); return }},
	{"hold_timeout_ms", func(c *config, v gjson.Result) (err error) { c.holdTimeout, err = millis(v, 1, 3_600_000); return }},
	{"fallback_endpoints", func(c *config, v gjson.Result) (err error) { c.fallbackEndpoints, err = intRange(v, 0, 8); return }},
	{"failure_mode", func(c *config, v gjson.Result) error {
		switch v.Str {
		case "open":
			c.failClosed = false
		case "closed":
			c.failClosed = true
		default:
			return errors.New("want open or closed")
		}
		return nil
	}},
	{"session_header", func(c *config, v gjson.Result) (err error) {
		c.sessionHeader, err = nonEmpty(v)
		c.sessionHeader = strings.ToLower(c.sessionHeader)
		return
	}},
	{"session_ttl_ms", func(c *config, v gjson.Result) (err error) { c.sessionTTL, err = millis(v, 1000, 86_400_000); return }},
	{"trust_subset_header", func(c *config, v gjson.Result) error {
		if !v.IsBool() {
			return errors.New("want true or false")
		}
		c.trustSubset = v.Bool()
		return nil
	}},
	{"debug_header", func(c *config, v gjson.Result) error {
		if !v.IsBool() {
			return errors.New("want true or false")
		}
		c.debugHeader = v.Bool()
		return nil
	}},
	{"cachesync.cluster", func(c *config, v gjson.Result) (err error) { c.cachesync.cluster, err = nonEmpty(v); return }},
	{"cachesync.authority", func(c *config, v gjson.Result) (err error) { c.cachesync.authority, err = nonEmpty(v); return }},
	{"cachesync.snapshot_path", func(c *config, v gjson.Result) (err error) { c.cachesync.snapshotPath, err = absPath(v); return }},
	{"cachesync.report_path", func(c *config, v gjson.Result) (err error) { c.cachesync.reportPath, err = absPath(v); return }},
	{"cachesync.report_token", func(c *config, v gjson.Result) (err error) { c.cachesync.reportToken, err = nonEmpty(v); return }},
	{"cachesync.report_token_env", func(c *config, v gjson.Result) (err error) { c.cachesync.reportTokenEnv, err = nonEmpty(v); return }},
	{"cachesync.timeout_ms", func(c *config, v gjson.Result) (err error) { c.cachesync.timeout, err = millis(v, 1, 60_000); return }},
	{"policy.mode", func(c *config, v gjson.Result) (err error) {
		if v.Type != gjson.String {
			return errors.New("want auto, prefill or decode")
		}
		c.policy.Mode, err = policy.ParseMode(v.Str)
		return
	}},
	{"policy.prefill_tokens_per_second", func(c *config, v gjson.Result) error {
		n, err := positiveInt(v, 1<<30)
		c.policy.PrefillRate = float64(n)
		return err
	}},
	{"policy.cpu_discount", func(c *config, v gjson.Result) (err error) { c.policy.CPUDiscount, err = fraction(v); return }},
	{"policy.others_weight", func(c *config, v gjson.Result) (err error) { c.policy.OthersWeight, err = weight(v); return }},
	{"policy.eviction_weight", func(c *config, v gjson.Result) (err error) { c.policy.EvictionWeight, err = weight(v); return }},
	{"policy.tie_tolerance_ms", func(c *config, v gjson.Result) (err error) { c.policy.TieTolerance, err = millis(v, 0, 60_000); return }},
	{"policy.slo_ttft_ms", func(c *config, v gjson.Result) (err error) { c.policy.SLOTTFT, err = millis(v, 0, 3_600_000); return }},
	{"policy.slo_tpot_ms", func(c *config, v gjson.Result) (err error) { c.policy.SLOTPOT, err = millis(v, 0, 60_000); return }},
	{"policy.default_output_tokens", func(c *config, v gjson.Result) (err error) {
		c.policy.DefaultOutputTokens, err = positiveInt(v, 1<<24)
		return
	}},
	{"policy.shed", func(c *config, v gjson.Result) error {
		if !v.IsBool() {
			return errors.New("want true or false")
		}
		c.shed = v.Bool()
		return nil
	}},
}

// sections are the fields holding objects of fields.
var sections = []string{"cachesync", "policy"}

func (c *config) set(field string, v gjson.Result) error {
	for _, sec := range sections {
		if field != sec {
			continue
		}
		if !v.IsObject() {
			return fieldErr(field, "want an object")
		}
		if sec == "cachesync" {
			c.cachesync = &cachesyncConfig{
				authority: "cachesync", snapshotPath: syncapi.SnapshotPath, reportPath: syncapi.ReportPath,
				timeout: 2 * time.Second,
			}
		}
		return eachField(v, sec+".", c.set)
	}
	for _, f := range configFields {
		if f.name == field {
			if err := f.set(c, v); err != nil {
				return fieldErr(field, err.Error())
			}
			return nil
		}
	}
	return fieldErr(field, "unknown field")
}

func pathList(v gjson.Result) ([]string, error) {
	if !v.IsArray() {
		return nil, errors.New("want an array of paths")
	}
	var paths []string
	for _, p := range v.Array() {
		if p.Type != gjson.String || !strings.HasPrefix(p.Str, "/") {
			return nil, errors.New("each path must be a string starting with /")
		}
		paths = append(paths, p.Str)
	}
	if len(paths) == 0 {
		return nil, errors.New("must list at least one path")
	}
	return paths, nil
}

func endpointList(v gjson.Result) ([]string, error) {
	if !v.IsArray() {
		return nil, errors.New("want an array of ip:port strings")
	}
	var eps []string
	for _, e := range v.Array() {
		ap, err := netip.ParseAddrPort(e.String())
		if e.Type != gjson.String || err != nil {
			return nil, errors.New(strconv.Quote(e.String()) + " is not an ip:port")
		}
		eps = append(eps, ap.String())
	}
	return eps, nil
}

func positiveInt(v gjson.Result, max int) (int, error) { return intRange(v, 1, max) }

func intRange(v gjson.Result, min, max int) (int, error) {
	if v.Type != gjson.Number {
		return 0, errors.New("want a number")
	}
	n, err := strconv.ParseInt(v.Raw, 10, 64)
	if err != nil || n < int64(min) || n > int64(max) {
		return 0, errors.New("want an integer from " + strconv.Itoa(min) + " to " + strconv.Itoa(max))
	}
	return int(n), nil
}

func millis(v gjson.Result, min, max int64) (time.Duration, error) {
	if v.Type != gjson.Number {
		return 0, errors.New("want a number of milliseconds")
	}
	n, err := strconv.ParseInt(v.Raw, 10, 64)
	if err != nil || n < min || n > max {
		return 0, errors.New("want an integer from " + strconv.FormatInt(min, 10) + " to " + strconv.FormatInt(max, 10))
	}
	return time.Duration(n) * time.Millisecond, nil
}

func fraction(v gjson.Result) (float64, error) {
	if v.Type != gjson.Number || v.Num < 0 || v.Num > 1 {
		return 0, errors.New("want a number from 0 to 1")
	}
	return v.Num, nil
}

// weight reads a policy weight: how many seconds one second of a secondary
// cost counts for.
func weight(v gjson.Result) (float64, error) {
	if v.Type != gjson.Number || v.Num < 0 || v.Num > 10 {
		return 0, errors.New("want a number from 0 to 10")
	}
	return v.Num, nil
}

func nonEmpty(v gjson.Result) (string, error) {
	if v.Type != gjson.String || v.Str == "" {
		return "", errors.New("want a non-empty string")
	}
	return v.Str, nil
}

func absPath(v gjson.Result) (string, error) {
	if v.Type != gjson.String || !strings.HasPrefix(v.Str, "/") {
		return "", errors.New("want a path starting with /")
	}
	return v.Str, nil
}

// routes reports whether the filter handles a request with this method and
// path (query string ignored).
// hashAhead is how many of a prompt's blocks are hashed before the policy
// looks: as many as a report, the recent placements and rendezvous use.
func (c *config) hashAhead() int {
	return max(c.reportBlocks, placed.Stride*placed.MaxSamples, c.affinityBlocks, 1)
}

func (c *config) routes(method, path string) bool {
	if method != "POST" {
		return false
	}
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	for _, p := range c.paths {
		if p == path {
			return true
		}
	}
	return false
}

// templateName is what the filter tells cachesync it renders with.
func (c *config) templateName() string {
	switch {
	case c.autoTemplate:
		return syncapi.AutoTemplate
	case c.custom != nil:
		return c.custom.Name()
	}
	return c.template.String()
}
