// Command filter is kvroute's proxy-wasm HTTP filter: it reads an
// OpenAI-style request body, hashes the prompt into blocks and sets the
// upstream endpoint in x-gateway-destination-endpoint for Envoy's
// override-host load balancing.
//
// Build it with GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared.
package main

import (
	"github.com/kvroute/kvroute/filter/proxywasm"
	"github.com/kvroute/kvroute/filter/proxywasm/types"
)

func main() {}

func init() { proxywasm.SetVMContext(vmContext{}) }

type vmContext struct{ types.DefaultVMContext }

func (vmContext) NewPluginContext(uint32) types.PluginContext { return &pluginContext{} }

type pluginContext struct {
	types.DefaultPluginContext
	router   router
	outcomes [numOutcomes]proxywasm.MetricCounter
	runtime  *runtimeStats
	streams  uint64
	// body is reused across this VM's requests.
	body []byte
}

// runtimeStatsEvery is how many streams pass between runtime-stat updates.
const runtimeStatsEvery = 64

func (p *pluginContext) OnPluginStart(size int) types.OnPluginStartStatus {
	data, err := proxywasm.GetPluginConfiguration()
	if err != nil && size > 0 {
		proxywasm.LogCritical("kvroute: read plugin configuration: " + err.Error())
		return types.OnPluginStartStatusFailed
	}
	cfg, err := parseConfig(data)
	if err != nil {
		proxywasm.LogCritical("kvroute: " + err.Error())
		return types.OnPluginStartStatusFailed
	}
	p.router = router{cfg: cfg}
	for o := range p.outcomes {
		p.outcomes[o] = proxywasm.DefineCounterMetric("kvroute.requests." + outcome(o).String())
	}
	p.runtime = newRuntimeStats()
	return types.OnPluginStartStatusOK
}

func (p *pluginContext) NewHttpContext(uint32) types.HttpContext {
	if p.streams%runtimeStatsEvery == 0 {
		p.runtime.update()
	}
	p.streams++
	return &httpContext{plugin: p}
}

type httpContext struct {
	types.DefaultHttpContext
	plugin *pluginContext
	// routing is set while the filter holds the request to read its body.
	routing bool
}

func (h *httpContext) OnHttpRequestHeaders(_ int, endOfStream bool) types.Action {
	for _, k := range ownedHeaders {
		if err := proxywasm.RemoveHttpRequestHeader(k); err != nil {
			proxywasm.LogError("kvroute: remove " + k + ": " + err.Error())
		}
	}
	method, _ := proxywasm.GetHttpRequestHeader(":method")
	path, _ := proxywasm.GetHttpRequestHeader(":path")
	if !h.plugin.router.cfg.routes(method, path) {
		return types.ActionContinue
	}
	if endOfStream {
		h.plugin.count(fallbackNoPrompt)
		return types.ActionContinue
	}
	// Hold the headers until the body has been read: the destination header
	// must be in place before the router filter picks a host.
	h.routing = true
	return types.ActionPause
}

func (h *httpContext) OnHttpRequestBody(bodySize int, endOfStream bool) types.Action {
	if !h.routing {
		return types.ActionContinue
	}
	p := h.plugin
	if bodySize > p.router.cfg.maxBodyBytes {
		h.routing = false
		p.count(fallbackTooLarge)
		return types.ActionContinue
	}
	if !endOfStream {
		return types.ActionPause
	}
	h.routing = false
	if cap(p.body) < bodySize {
		p.body = make([]byte, bodySize)
	}
	body, err := proxywasm.ReadHttpRequestBody(p.body[:bodySize], 0)
	if err != nil {
		proxywasm.LogError("kvroute: read request body: " + err.Error())
		p.count(fallbackInvalidBody)
		return types.ActionContinue
	}
	endpoint, out := p.router.route(body)
	p.count(out)
	if out == routed {
		if err := proxywasm.ReplaceHttpRequestHeader(destinationHeader, endpoint); err != nil {
			proxywasm.LogError("kvroute: set " + destinationHeader + ": " + err.Error())
		}
	}
	return types.ActionContinue
}

func (p *pluginContext) count(o outcome) { p.outcomes[o].Increment(1) }
