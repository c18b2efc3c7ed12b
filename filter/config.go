package main

import (
	"errors"
	"net/netip"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/shared/blockhash"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/tidwall/gjson"
)

// config is the validated plugin configuration.
type config struct {
	paths        []string
	maxBodyBytes int
	endpoints    []string // ip:port, the rendezvous fallback's candidates
	template     prompt.Template
	hashing      blockhash.Config
	// affinityBlocks is how many leading blocks name a prompt for the
	// rendezvous fallback.
	affinityBlocks int
}

const (
	defaultMaxBodyBytes = 8 << 20
	// maxMaxBodyBytes bounds what one worker may buffer per request.
	maxMaxBodyBytes = 64 << 20
)

func defaultConfig() config {
	return config{
		paths:          []string{"/v1/chat/completions", "/v1/completions"},
		maxBodyBytes:   defaultMaxBodyBytes,
		template:       prompt.ChatML,
		hashing:        blockhash.Config{BlockSize: blockhash.DefaultBlockSize, MaxBlocks: blockhash.DefaultMaxBlocks},
		affinityBlocks: 8,
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
		return cfg, nil
	}
	if !gjson.ValidBytes(data) {
		return cfg, errors.New("plugin configuration: not valid JSON")
	}
	root := gjson.ParseBytes(data)
	if !root.IsObject() {
		return cfg, errors.New("plugin configuration: not a JSON object")
	}
	var err error
	root.ForEach(func(key, v gjson.Result) bool {
		err = cfg.set(key.String(), v)
		return err == nil
	})
	return cfg, err
}

func (c *config) set(field string, v gjson.Result) error {
	switch field {
	case "paths":
		if !v.IsArray() {
			return fieldErr(field, "want an array of paths")
		}
		var paths []string
		for _, p := range v.Array() {
			if p.Type != gjson.String || !strings.HasPrefix(p.Str, "/") {
				return fieldErr(field, "each path must be a string starting with /")
			}
			paths = append(paths, p.Str)
		}
		if len(paths) == 0 {
			return fieldErr(field, "must list at least one path")
		}
		c.paths = paths
	case "max_body_bytes":
		n, err := positiveInt(v, maxMaxBodyBytes)
		if err != nil {
			return fieldErr(field, err.Error())
		}
		c.maxBodyBytes = n
	case "endpoints":
		if !v.IsArray() {
			return fieldErr(field, "want an array of ip:port strings")
		}
		var eps []string
		for _, e := range v.Array() {
			ap, err := netip.ParseAddrPort(e.String())
			if e.Type != gjson.String || err != nil {
				return fieldErr(field, strconv.Quote(e.String())+" is not an ip:port")
			}
			eps = append(eps, ap.String())
		}
		c.endpoints = eps
	case "chat_template":
		t, err := prompt.ParseTemplate(v.String())
		if v.Type != gjson.String || err != nil {
			return fieldErr(field, "unknown template "+strconv.Quote(v.String()))
		}
		c.template = t
	case "block_size":
		n, err := positiveInt(v, 1<<20)
		if err != nil {
			return fieldErr(field, err.Error())
		}
		c.hashing.BlockSize = n
	case "max_blocks":
		n, err := positiveInt(v, 1<<20)
		if err != nil {
			return fieldErr(field, err.Error())
		}
		c.hashing.MaxBlocks = n
	case "affinity_blocks":
		n, err := positiveInt(v, 1<<20)
		if err != nil {
			return fieldErr(field, err.Error())
		}
		c.affinityBlocks = n
	default:
		return fieldErr(field, "unknown field")
	}
	return nil
}

func positiveInt(v gjson.Result, max int) (int, error) {
	if v.Type != gjson.Number {
		return 0, errors.New("want a number")
	}
	n, err := strconv.ParseInt(v.Raw, 10, 64)
	if err != nil || n <= 0 || n > int64(max) {
		return 0, errors.New("want an integer from 1 to " + strconv.Itoa(max))
	}
	return int(n), nil
}

// routes reports whether the filter handles a request with this method and
// path (query string ignored).
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
