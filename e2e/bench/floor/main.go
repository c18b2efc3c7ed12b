// Command floor is the least a Go proxy-wasm filter must do to route on the
// request body: pause the headers, read the whole body, set the destination
// header, continue. The filter-cost benchmark (e2e/bench) measures kvroute
// against it, so that what the Go runtime and the ABI cost is told apart
// from what kvroute's own work costs. Its plugin configuration names the
// endpoint to send every request to: {"endpoint": "ip:port"}.
//
// Build it with GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared.
package main

import (
	"strings"

	"github.com/kvroute/kvroute/filter/proxywasm"
	"github.com/kvroute/kvroute/filter/proxywasm/types"
)

func main() {}

func init() { proxywasm.SetVMContext(vmContext{}) }

type vmContext struct{ types.DefaultVMContext }

func (vmContext) NewPluginContext(uint32) types.PluginContext { return &plugin{} }

type plugin struct {
	types.DefaultPluginContext
	endpoint string
	body     []byte
}

func (p *plugin) OnPluginStart(int) types.OnPluginStartStatus {
	b, err := proxywasm.GetPluginConfiguration()
	if err != nil {
		proxywasm.LogCritical("floor: read the plugin configuration: " + err.Error())
		return types.OnPluginStartStatusFailed
	}
	// No JSON parser for one field: the value of "endpoint".
	s := string(b)
	const key = `"endpoint":`
	i := strings.Index(s, key)
	if i < 0 {
		proxywasm.LogCritical(`floor: want {"endpoint": "ip:port"}`)
		return types.OnPluginStartStatusFailed
	}
	v := strings.TrimSpace(s[i+len(key):])
	end := strings.IndexByte(v[min(1, len(v)):], '"')
	if !strings.HasPrefix(v, `"`) || end < 0 {
		proxywasm.LogCritical(`floor: want {"endpoint": "ip:port"}`)
		return types.OnPluginStartStatusFailed
	}
	p.endpoint = v[1 : end+1]
	return types.OnPluginStartStatusOK
}

func (p *plugin) NewHttpContext(uint32) types.HttpContext { return &stream{p: p} }

type stream struct {
	types.DefaultHttpContext
	p *plugin
}

func (s *stream) OnHttpRequestHeaders(_ int, endOfStream bool) types.Action {
	if endOfStream {
		return types.ActionContinue
	}
	return types.ActionPause
}

func (s *stream) OnHttpRequestBody(size int, endOfStream bool) types.Action {
	if !endOfStream {
		return types.ActionPause
	}
	if cap(s.p.body) < size {
		s.p.body = make([]byte, size)
	}
	if _, err := proxywasm.ReadHttpRequestBody(s.p.body[:size], 0); err == nil {
		proxywasm.ReplaceHttpRequestHeader("x-gateway-destination-endpoint", s.p.endpoint)
	}
	return types.ActionContinue
}
