// Package types holds the values and interfaces of kvroute's proxy-wasm
// binding. Names follow github.com/proxy-wasm/proxy-wasm-go-sdk's
// proxywasm/types so that the SDK could replace the binding.
package types

import "errors"

// Action tells the host whether to continue a stream after a callback.
type Action uint32

const (
	// ActionContinue lets the host pass the data on to the next filter.
	ActionContinue Action = 0
	// ActionPause stops iteration; for a body it means "buffer more".
	ActionPause Action = 1
)

// OnVMStartStatus is the result of VMContext.OnVMStart.
type OnVMStartStatus bool

// Results of OnVMStart.
const (
	OnVMStartStatusOK     OnVMStartStatus = true
	OnVMStartStatusFailed OnVMStartStatus = false
)

// OnPluginStartStatus is the result of PluginContext.OnPluginStart; Failed
// makes the host reject the plugin configuration.
type OnPluginStartStatus bool

// Results of OnPluginStart.
const (
	OnPluginStartStatusOK     OnPluginStartStatus = true
	OnPluginStartStatusFailed OnPluginStartStatus = false
)

// LogLevel is a proxy_log level.
type LogLevel uint32

// Log levels, as the ABI numbers them.
const (
	LogLevelTrace LogLevel = iota
	LogLevelDebug
	LogLevelInfo
	LogLevelWarn
	LogLevelError
	LogLevelCritical
)

// Status is a proxy_status_t returned by every hostcall.
type Status uint32

// Statuses defined by ABI 0.2.1 (5, 9 and 11 are unused).
const (
	StatusOK                   Status = 0
	StatusNotFound             Status = 1
	StatusBadArgument          Status = 2
	StatusSerializationFailure Status = 3
	StatusParseFailure         Status = 4
	StatusInvalidMemoryAccess  Status = 6
	StatusEmpty                Status = 7
	StatusCasMismatch          Status = 8
	StatusInternalFailure      Status = 10
	StatusUnimplemented        Status = 12
)

// Errors a hostcall can return, one per non-OK status so callers can branch
// with errors.Is.
var (
	ErrorStatusNotFound             = errors.New("proxy-wasm: not found")
	ErrorStatusBadArgument          = errors.New("proxy-wasm: bad argument")
	ErrorStatusSerializationFailure = errors.New("proxy-wasm: serialization failure")
	ErrorStatusParseFailure         = errors.New("proxy-wasm: parse failure")
	ErrorInvalidMemoryAccess        = errors.New("proxy-wasm: invalid memory access")
	ErrorStatusEmpty                = errors.New("proxy-wasm: empty")
	ErrorStatusCasMismatch          = errors.New("proxy-wasm: cas mismatch")
	ErrorInternalFailure            = errors.New("proxy-wasm: internal failure")
	ErrorUnimplemented              = errors.New("proxy-wasm: unimplemented")
	ErrorUnknownStatus              = errors.New("proxy-wasm: unknown status")
)

// Err returns nil for StatusOK and the matching error otherwise.
func (s Status) Err() error {
	switch s {
	case StatusOK:
		return nil
	case StatusNotFound:
		return ErrorStatusNotFound
	case StatusBadArgument:
		return ErrorStatusBadArgument
	case StatusSerializationFailure:
		return ErrorStatusSerializationFailure
	case StatusParseFailure:
		return ErrorStatusParseFailure
	case StatusInvalidMemoryAccess:
		return ErrorInvalidMemoryAccess
	case StatusEmpty:
		return ErrorStatusEmpty
	case StatusCasMismatch:
		return ErrorStatusCasMismatch
	case StatusInternalFailure:
		return ErrorInternalFailure
	case StatusUnimplemented:
		return ErrorUnimplemented
	}
	return ErrorUnknownStatus
}

// VMContext is the VM-wide context; the host creates plugin contexts from it.
type VMContext interface {
	// OnVMStart is called once per VM with the size of the VM configuration.
	OnVMStart(vmConfigurationSize int) OnVMStartStatus
	// NewPluginContext creates the root context of one plugin configuration.
	NewPluginContext(contextID uint32) PluginContext
}

// PluginContext is a plugin's root context: configuration, timers, queues and
// callouts live here, and it creates the per-stream contexts.
type PluginContext interface {
	// OnPluginStart is called with the size of the plugin configuration;
	// returning Failed rejects the configuration.
	OnPluginStart(pluginConfigurationSize int) OnPluginStartStatus
	// OnPluginDone is called when the host is about to delete the plugin;
	// return false to finish asynchronously with proxywasm.PluginDone.
	OnPluginDone() bool
	// OnQueueReady is called when a shared queue this plugin registered has data.
	OnQueueReady(queueID uint32)
	// OnTick is called on the period set by SetTickPeriodMilliSeconds.
	OnTick()
	// NewHttpContext creates the context of one HTTP stream, or nil to not
	// take part in it.
	NewHttpContext(contextID uint32) HttpContext
}

// HttpContext handles one HTTP stream.
type HttpContext interface {
	OnHttpRequestHeaders(numHeaders int, endOfStream bool) Action
	OnHttpRequestBody(bodySize int, endOfStream bool) Action
	OnHttpRequestTrailers(numTrailers int) Action
	OnHttpResponseHeaders(numHeaders int, endOfStream bool) Action
	OnHttpResponseBody(bodySize int, endOfStream bool) Action
	OnHttpResponseTrailers(numTrailers int) Action
	// OnHttpStreamDone is called once when the stream ends, whatever way it
	// ends (completion, reset, local reply).
	OnHttpStreamDone()
}

// DefaultVMContext implements VMContext with no-op defaults.
type DefaultVMContext struct{}

// OnVMStart implements VMContext.
func (DefaultVMContext) OnVMStart(int) OnVMStartStatus { return OnVMStartStatusOK }

// NewPluginContext implements VMContext.
func (DefaultVMContext) NewPluginContext(uint32) PluginContext { return DefaultPluginContext{} }

// DefaultPluginContext implements PluginContext with no-op defaults.
type DefaultPluginContext struct{}

// OnPluginStart implements PluginContext.
func (DefaultPluginContext) OnPluginStart(int) OnPluginStartStatus { return OnPluginStartStatusOK }

// OnPluginDone implements PluginContext.
func (DefaultPluginContext) OnPluginDone() bool { return true }

// OnQueueReady implements PluginContext.
func (DefaultPluginContext) OnQueueReady(uint32) {}

// OnTick implements PluginContext.
func (DefaultPluginContext) OnTick() {}

// NewHttpContext implements PluginContext.
func (DefaultPluginContext) NewHttpContext(uint32) HttpContext { return nil }

// DefaultHttpContext implements HttpContext with pass-through defaults.
type DefaultHttpContext struct{}

// OnHttpRequestHeaders implements HttpContext.
func (DefaultHttpContext) OnHttpRequestHeaders(int, bool) Action { return ActionContinue }

// OnHttpRequestBody implements HttpContext.
func (DefaultHttpContext) OnHttpRequestBody(int, bool) Action { return ActionContinue }

// OnHttpRequestTrailers implements HttpContext.
func (DefaultHttpContext) OnHttpRequestTrailers(int) Action { return ActionContinue }

// OnHttpResponseHeaders implements HttpContext.
func (DefaultHttpContext) OnHttpResponseHeaders(int, bool) Action { return ActionContinue }

// OnHttpResponseBody implements HttpContext.
func (DefaultHttpContext) OnHttpResponseBody(int, bool) Action { return ActionContinue }

// OnHttpResponseTrailers implements HttpContext.
func (DefaultHttpContext) OnHttpResponseTrailers(int) Action { return ActionContinue }

// OnHttpStreamDone implements HttpContext.
func (DefaultHttpContext) OnHttpStreamDone() {}
