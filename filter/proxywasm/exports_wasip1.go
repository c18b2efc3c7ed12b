//go:build wasip1

package proxywasm

import "github.com/kvroute/kvroute/filter/proxywasm/types"

// The callbacks the host calls, as ABI 0.2.1 names them. Each is a thin shim
// over the dispatch code so that the logic stays testable natively.

//go:wasmexport proxy_abi_version_0_2_1
func proxyABIVersion() {}

//go:wasmexport proxy_on_memory_allocate
func proxyOnMemoryAllocate(size uint32) *byte { return allocate(size) }

//go:wasmexport proxy_on_context_create
func proxyOnContextCreate(contextID, parentID uint32) { onContextCreate(contextID, parentID) }

//go:wasmexport proxy_on_vm_start
func proxyOnVMStart(rootID, size uint32) uint32 { return onVMStart(rootID, size) }

//go:wasmexport proxy_on_configure
func proxyOnConfigure(rootID, size uint32) uint32 { return onConfigure(rootID, size) }

//go:wasmexport proxy_on_tick
func proxyOnTick(rootID uint32) { onTick(rootID) }

//go:wasmexport proxy_on_queue_ready
func proxyOnQueueReady(rootID, queueID uint32) { onQueueReady(rootID, queueID) }

//go:wasmexport proxy_on_http_call_response
func proxyOnHttpCallResponse(rootID, calloutID, numHeaders, bodySize, numTrailers uint32) {
	onHttpCallResponse(rootID, calloutID, numHeaders, bodySize, numTrailers)
}

//go:wasmexport proxy_on_request_headers
func proxyOnRequestHeaders(contextID, numHeaders, endOfStream uint32) uint32 {
	return streamAction("proxy_on_request_headers", contextID, func(h types.HttpContext) types.Action {
		return h.OnHttpRequestHeaders(int(numHeaders), endOfStream != 0)
	})
}

//go:wasmexport proxy_on_request_body
func proxyOnRequestBody(contextID, bodySize, endOfStream uint32) uint32 {
	return streamAction("proxy_on_request_body", contextID, func(h types.HttpContext) types.Action {
		return h.OnHttpRequestBody(int(bodySize), endOfStream != 0)
	})
}

//go:wasmexport proxy_on_request_trailers
func proxyOnRequestTrailers(contextID, numTrailers uint32) uint32 {
	return streamAction("proxy_on_request_trailers", contextID, func(h types.HttpContext) types.Action {
		return h.OnHttpRequestTrailers(int(numTrailers))
	})
}

//go:wasmexport proxy_on_response_headers
func proxyOnResponseHeaders(contextID, numHeaders, endOfStream uint32) uint32 {
	return streamAction("proxy_on_response_headers", contextID, func(h types.HttpContext) types.Action {
		return h.OnHttpResponseHeaders(int(numHeaders), endOfStream != 0)
	})
}

//go:wasmexport proxy_on_response_body
func proxyOnResponseBody(contextID, bodySize, endOfStream uint32) uint32 {
	return streamAction("proxy_on_response_body", contextID, func(h types.HttpContext) types.Action {
		return h.OnHttpResponseBody(int(bodySize), endOfStream != 0)
	})
}

//go:wasmexport proxy_on_response_trailers
func proxyOnResponseTrailers(contextID, numTrailers uint32) uint32 {
	return streamAction("proxy_on_response_trailers", contextID, func(h types.HttpContext) types.Action {
		return h.OnHttpResponseTrailers(int(numTrailers))
	})
}

//go:wasmexport proxy_on_done
func proxyOnDone(contextID uint32) uint32 { return onDone(contextID) }

//go:wasmexport proxy_on_log
func proxyOnLog(contextID uint32) { onLog(contextID) }

//go:wasmexport proxy_on_delete
func proxyOnDelete(contextID uint32) { onDelete(contextID) }
