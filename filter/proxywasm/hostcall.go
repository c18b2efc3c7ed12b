package proxywasm

import (
	"strings"
	"unsafe"

	"github.com/kvroute/kvroute/filter/proxywasm/types"
)

// Buffer, map and stream kinds as ABI 0.2.1 numbers them.
const (
	bufferHTTPRequestBody      = 0
	bufferHTTPResponseBody     = 1
	bufferHTTPCallResponseBody = 4
	bufferVMConfiguration      = 6
	bufferPluginConfiguration  = 7

	mapHTTPRequestHeaders      = 0
	mapHTTPRequestTrailers     = 1
	mapHTTPResponseHeaders     = 2
	mapHTTPResponseTrailers    = 3
	mapHTTPCallResponseHeaders = 6
	mapHTTPCallResponseTrail   = 7

	streamHTTPRequest  = 0
	streamHTTPResponse = 1

	metricCounter   = 0
	metricGauge     = 1
	metricHistogram = 2
)

func statusErr(s uint32) error { return types.Status(s).Err() }

// Logging.

func logAt(level types.LogLevel, msg string) {
	proxyLog(uint32(level), stringPtr(msg), uint32(len(msg)))
}

// LogTrace logs msg at trace level.
func LogTrace(msg string) { logAt(types.LogLevelTrace, msg) }

// LogDebug logs msg at debug level.
func LogDebug(msg string) { logAt(types.LogLevelDebug, msg) }

// LogInfo logs msg at info level.
func LogInfo(msg string) { logAt(types.LogLevelInfo, msg) }

// LogWarn logs msg at warn level.
func LogWarn(msg string) { logAt(types.LogLevelWarn, msg) }

// LogError logs msg at error level.
func LogError(msg string) { logAt(types.LogLevelError, msg) }

// LogCritical logs msg at critical level.
func LogCritical(msg string) { logAt(types.LogLevelCritical, msg) }

// GetLogLevel returns the host's current log level for this plugin, so
// callers can skip building messages nobody will see.
func GetLogLevel() (types.LogLevel, error) {
	var level uint32
	if err := statusErr(proxyGetLogLevel(unsafe.Pointer(&level))); err != nil {
		return types.LogLevelInfo, err
	}
	return types.LogLevel(level), nil
}

// Buffers.

func getBuffer(kind uint32, start, maxSize int) ([]byte, error) {
	st := proxyGetBufferBytes(kind, uint32(start), uint32(maxSize), unsafe.Pointer(&out.ptr), unsafe.Pointer(&out.size))
	p, n := takeOut()
	if err := statusErr(st); err != nil {
		return nil, err
	}
	return owned(p, n), nil
}

func setBuffer(kind uint32, start, size int, data []byte) error {
	return statusErr(proxySetBufferBytes(kind, uint32(start), uint32(size), bytesPtr(data), uint32(len(data))))
}

// GetVMConfiguration returns the VM configuration; valid only in OnVMStart.
func GetVMConfiguration() ([]byte, error) {
	return getBuffer(bufferVMConfiguration, 0, 1<<31-1)
}

// GetPluginConfiguration returns the plugin configuration; valid only in
// OnPluginStart.
func GetPluginConfiguration() ([]byte, error) {
	return getBuffer(bufferPluginConfiguration, 0, 1<<31-1)
}

// GetHttpRequestBody returns up to maxSize bytes of the buffered request
// body from start.
func GetHttpRequestBody(start, maxSize int) ([]byte, error) {
	return getBuffer(bufferHTTPRequestBody, start, maxSize)
}

// ReadHttpRequestBody reads up to len(dst) bytes of the buffered request body
// from start, into dst's storage when the body fits, so a filter can reuse
// one buffer across requests. It returns the bytes read.
func ReadHttpRequestBody(dst []byte, start int) ([]byte, error) {
	reserve(dst)
	st := proxyGetBufferBytes(bufferHTTPRequestBody, uint32(start), uint32(len(dst)), unsafe.Pointer(&out.ptr), unsafe.Pointer(&out.size))
	reserved = nil
	p, n := takeOut()
	if err := statusErr(st); err != nil {
		return nil, err
	}
	return owned(p, n), nil
}

// ReplaceHttpRequestBody replaces the buffered request body.
func ReplaceHttpRequestBody(body []byte) error {
	return setBuffer(bufferHTTPRequestBody, 0, 1<<31-1, body)
}

// GetHttpResponseBody returns up to maxSize bytes of the buffered response
// body from start.
func GetHttpResponseBody(start, maxSize int) ([]byte, error) {
	return getBuffer(bufferHTTPResponseBody, start, maxSize)
}

// GetHttpCallResponseBody returns up to maxSize bytes of an HTTP callout's
// response body; valid only in the callout's callback.
func GetHttpCallResponseBody(start, maxSize int) ([]byte, error) {
	return getBuffer(bufferHTTPCallResponseBody, start, maxSize)
}

// ReadHttpCallResponseBody is GetHttpCallResponseBody reading into dst's
// storage when the body fits.
func ReadHttpCallResponseBody(dst []byte, start int) ([]byte, error) {
	reserve(dst)
	st := proxyGetBufferBytes(bufferHTTPCallResponseBody, uint32(start), uint32(len(dst)), unsafe.Pointer(&out.ptr), unsafe.Pointer(&out.size))
	reserved = nil
	p, n := takeOut()
	if err := statusErr(st); err != nil {
		return nil, err
	}
	return owned(p, n), nil
}

// Header maps.

func getMap(kind uint32) ([][2]string, error) {
	st := proxyGetHeaderMapPairs(kind, unsafe.Pointer(&out.ptr), unsafe.Pointer(&out.size))
	p, n := takeOut()
	if err := statusErr(st); err != nil {
		return nil, err
	}
	return decodePairs(borrowed(p, n))
}

func setMap(kind uint32, pairs [][2]string) error {
	b := encodePairs(pairs)
	return statusErr(proxySetHeaderMapPairs(kind, bytesPtr(b), uint32(len(b))))
}

func getMapValue(kind uint32, key string) (string, error) {
	st := proxyGetHeaderMapValue(kind, stringPtr(key), uint32(len(key)), unsafe.Pointer(&out.ptr), unsafe.Pointer(&out.size))
	p, n := takeOut()
	if err := statusErr(st); err != nil {
		return "", err
	}
	return string(borrowed(p, n)), nil
}

func replaceMapValue(kind uint32, key, value string) error {
	return statusErr(proxyReplaceHeaderMapValue(kind, stringPtr(key), uint32(len(key)), stringPtr(value), uint32(len(value))))
}

func addMapValue(kind uint32, key, value string) error {
	return statusErr(proxyAddHeaderMapValue(kind, stringPtr(key), uint32(len(key)), stringPtr(value), uint32(len(value))))
}

func removeMapValue(kind uint32, key string) error {
	return statusErr(proxyRemoveHeaderMapValue(kind, stringPtr(key), uint32(len(key))))
}

// GetHttpRequestHeaders returns all request headers, pseudo-headers included.
func GetHttpRequestHeaders() ([][2]string, error) { return getMap(mapHTTPRequestHeaders) }

// ReplaceHttpRequestHeaders replaces the whole request header map.
func ReplaceHttpRequestHeaders(headers [][2]string) error {
	return setMap(mapHTTPRequestHeaders, headers)
}

// VisitHttpRequestHeaders calls fn for every request header, in order,
// with key and value in host-owned memory that stays valid only during the
// call: one hostcall for the whole map, and nothing allocated.
func VisitHttpRequestHeaders(fn func(key, value []byte)) error {
	st := proxyGetHeaderMapPairs(mapHTTPRequestHeaders, unsafe.Pointer(&out.ptr), unsafe.Pointer(&out.size))
	p, n := takeOut()
	if err := statusErr(st); err != nil {
		return err
	}
	return visitPairs(borrowed(p, n), fn)
}

// GetHttpRequestHeader returns one request header's value.
func GetHttpRequestHeader(key string) (string, error) {
	return getMapValue(mapHTTPRequestHeaders, key)
}

// ReplaceHttpRequestHeader sets a request header, replacing every value it had.
func ReplaceHttpRequestHeader(key, value string) error {
	return replaceMapValue(mapHTTPRequestHeaders, key, value)
}

// AddHttpRequestHeader appends a value to a request header.
func AddHttpRequestHeader(key, value string) error {
	return addMapValue(mapHTTPRequestHeaders, key, value)
}

// RemoveHttpRequestHeader removes every value of a request header.
func RemoveHttpRequestHeader(key string) error {
	return removeMapValue(mapHTTPRequestHeaders, key)
}

// GetHttpRequestTrailers returns the request trailers.
func GetHttpRequestTrailers() ([][2]string, error) { return getMap(mapHTTPRequestTrailers) }

// GetHttpResponseHeaders returns all response headers.
func GetHttpResponseHeaders() ([][2]string, error) { return getMap(mapHTTPResponseHeaders) }

// GetHttpResponseHeader returns one response header's value.
func GetHttpResponseHeader(key string) (string, error) {
	return getMapValue(mapHTTPResponseHeaders, key)
}

// ReplaceHttpResponseHeader sets a response header.
func ReplaceHttpResponseHeader(key, value string) error {
	return replaceMapValue(mapHTTPResponseHeaders, key, value)
}

// AddHttpResponseHeader appends a value to a response header.
func AddHttpResponseHeader(key, value string) error {
	return addMapValue(mapHTTPResponseHeaders, key, value)
}

// RemoveHttpResponseHeader removes a response header.
func RemoveHttpResponseHeader(key string) error {
	return removeMapValue(mapHTTPResponseHeaders, key)
}

// GetHttpResponseTrailers returns the response trailers.
func GetHttpResponseTrailers() ([][2]string, error) { return getMap(mapHTTPResponseTrailers) }

// GetHttpCallResponseHeaders returns an HTTP callout's response headers;
// valid only in the callout's callback.
func GetHttpCallResponseHeaders() ([][2]string, error) { return getMap(mapHTTPCallResponseHeaders) }

// GetHttpCallResponseTrailers returns an HTTP callout's response trailers.
func GetHttpCallResponseTrailers() ([][2]string, error) { return getMap(mapHTTPCallResponseTrail) }

// Stream control.

// ResumeHttpRequest continues a request paused by ActionPause.
func ResumeHttpRequest() error { return statusErr(proxyContinueStream(streamHTTPRequest)) }

// ResumeHttpResponse continues a response paused by ActionPause.
func ResumeHttpResponse() error { return statusErr(proxyContinueStream(streamHTTPResponse)) }

// SendHttpResponse answers the stream locally; gRPCStatus -1 means none.
func SendHttpResponse(statusCode uint32, headers [][2]string, body []byte, gRPCStatus int32) error {
	h := encodePairs(headers)
	return statusErr(proxySendLocalResponse(statusCode, nil, 0, bytesPtr(body), uint32(len(body)), bytesPtr(h), uint32(len(h)), gRPCStatus))
}

// SetEffectiveContext makes later hostcalls act on contextID, for example on
// a paused stream from a callout or queue callback.
func SetEffectiveContext(contextID uint32) error {
	return statusErr(proxySetEffectiveContext(contextID))
}

// PluginDone tells the host that a plugin whose OnPluginDone returned false
// has finished.
func PluginDone() error { return statusErr(proxyDone()) }

// Timers and callouts.

// SetTickPeriodMilliSeconds starts (or with 0 stops) the plugin's OnTick.
func SetTickPeriodMilliSeconds(period uint32) error {
	return statusErr(proxySetTickPeriodMilliseconds(period))
}

// DispatchHttpCall sends an HTTP request to an Envoy cluster. headers must
// include :method, :path and :authority. callback runs in the plugin
// context when the response arrives or the call fails (numHeaders == 0).
func DispatchHttpCall(cluster string, headers [][2]string, body []byte, trailers [][2]string,
	timeoutMillis uint32, callback func(numHeaders, bodySize, numTrailers int)) (uint32, error) {
	root, ok := current.rootOf(current.active)
	if !ok {
		return 0, types.ErrorStatusBadArgument
	}
	h, tr := encodePairs(headers), encodePairs(trailers)
	var id uint32
	st := proxyHttpCall(stringPtr(cluster), uint32(len(cluster)), bytesPtr(h), uint32(len(h)),
		bytesPtr(body), uint32(len(body)), bytesPtr(tr), uint32(len(tr)), timeoutMillis, unsafe.Pointer(&id))
	if err := statusErr(st); err != nil {
		return 0, err
	}
	root.callouts[id] = callback
	return id, nil
}

// Shared data and queues.

// GetSharedData returns a shared-data value and its CAS token.
func GetSharedData(key string) ([]byte, uint32, error) {
	p, n, cas, err := getSharedData(key)
	return owned(p, n), cas, err
}

// BorrowSharedData is GetSharedData for a caller that decodes the value at
// once: it stays valid only until the current callback returns, and is not
// copied.
func BorrowSharedData(key string) ([]byte, uint32, error) {
	p, n, cas, err := getSharedData(key)
	return borrowed(p, n), cas, err
}

func getSharedData(key string) (p *byte, n, cas uint32, err error) {
	st := proxyGetSharedData(stringPtr(key), uint32(len(key)), unsafe.Pointer(&out.ptr), unsafe.Pointer(&out.size), unsafe.Pointer(&out.cas))
	cas = out.cas
	p, n = takeOut()
	if err := statusErr(st); err != nil {
		return nil, 0, 0, err
	}
	return p, n, cas, nil
}

// SetSharedData stores a shared-data value. A non-zero cas makes the write
// conditional: it fails with ErrorStatusCasMismatch if the key changed since
// the read that returned cas.
func SetSharedData(key string, value []byte, cas uint32) error {
	return statusErr(proxySetSharedData(stringPtr(key), uint32(len(key)), bytesPtr(value), uint32(len(value)), cas))
}

// RegisterSharedQueue creates (or opens) a queue whose OnQueueReady fires on
// this plugin context.
func RegisterSharedQueue(name string) (uint32, error) {
	var id uint32
	if err := statusErr(proxyRegisterSharedQueue(stringPtr(name), uint32(len(name)), unsafe.Pointer(&id))); err != nil {
		return 0, err
	}
	return id, nil
}

// ResolveSharedQueue finds a queue registered by another context; an empty
// vmID means this VM's.
func ResolveSharedQueue(vmID, name string) (uint32, error) {
	var id uint32
	st := proxyResolveSharedQueue(stringPtr(vmID), uint32(len(vmID)), stringPtr(name), uint32(len(name)), unsafe.Pointer(&id))
	if err := statusErr(st); err != nil {
		return 0, err
	}
	return id, nil
}

// EnqueueSharedQueue appends a value to a queue.
func EnqueueSharedQueue(queueID uint32, value []byte) error {
	return statusErr(proxyEnqueueSharedQueue(queueID, bytesPtr(value), uint32(len(value))))
}

// DequeueSharedQueue removes the oldest value of a queue; it fails with
// ErrorStatusEmpty when there is none.
func DequeueSharedQueue(queueID uint32) ([]byte, error) {
	st := proxyDequeueSharedQueue(queueID, unsafe.Pointer(&out.ptr), unsafe.Pointer(&out.size))
	p, n := takeOut()
	if err := statusErr(st); err != nil {
		return nil, err
	}
	return owned(p, n), nil
}

// Properties and foreign functions.

func propertyPath(path []string) string { return strings.Join(path, "\x00") }

// GetProperty reads a host property such as {"request", "path"}.
func GetProperty(path []string) ([]byte, error) {
	p, n, err := getProperty(propertyPath(path))
	return owned(p, n), err
}

// PropertyKey is the key BorrowProperty reads the property at path by,
// joined once instead of on every read.
func PropertyKey(path ...string) string { return propertyPath(path) }

// BorrowProperty is GetProperty for a caller done with the value before the
// current callback returns, by a key from PropertyKey: nothing is
// allocated, and the value is not valid after that.
func BorrowProperty(key string) ([]byte, error) {
	p, n, err := getProperty(key)
	return borrowed(p, n), err
}

func getProperty(key string) (*byte, uint32, error) {
	st := proxyGetProperty(stringPtr(key), uint32(len(key)), unsafe.Pointer(&out.ptr), unsafe.Pointer(&out.size))
	p, n := takeOut()
	if err := statusErr(st); err != nil {
		return nil, 0, err
	}
	return p, n, nil
}

// SetProperty writes a host property.
func SetProperty(path []string, value []byte) error {
	key := propertyPath(path)
	return statusErr(proxySetProperty(stringPtr(key), uint32(len(key)), bytesPtr(value), uint32(len(value))))
}

// CallForeignFunction calls a host extension function such as Envoy's
// clear_route_cache.
func CallForeignFunction(name string, args []byte) ([]byte, error) {
	var p *byte
	var n uint32
	st := proxyCallForeignFunction(stringPtr(name), uint32(len(name)), bytesPtr(args), uint32(len(args)), unsafe.Pointer(&p), unsafe.Pointer(&n))
	if err := statusErr(st); err != nil {
		return nil, err
	}
	return owned(p, n), nil
}

// Metrics.

// MetricCounter is a monotonically increasing host metric.
type MetricCounter uint32

// MetricGauge is a host metric that goes up and down.
type MetricGauge uint32

// MetricHistogram is a host metric that records a distribution.
type MetricHistogram uint32

func defineMetric(kind uint32, name string) uint32 {
	var id uint32
	// A failed definition leaves id 0, which the host rejects on use; metrics
	// must never break routing, so the error is only logged.
	if err := statusErr(proxyDefineMetric(kind, stringPtr(name), uint32(len(name)), unsafe.Pointer(&id))); err != nil {
		LogError("define metric " + name + ": " + err.Error())
	}
	return id
}

// DefineCounterMetric defines (or finds) a counter.
func DefineCounterMetric(name string) MetricCounter {
	return MetricCounter(defineMetric(metricCounter, name))
}

// DefineGaugeMetric defines (or finds) a gauge.
func DefineGaugeMetric(name string) MetricGauge { return MetricGauge(defineMetric(metricGauge, name)) }

// DefineHistogramMetric defines (or finds) a histogram.
func DefineHistogramMetric(name string) MetricHistogram {
	return MetricHistogram(defineMetric(metricHistogram, name))
}

// Increment adds offset to the counter.
func (m MetricCounter) Increment(offset uint64) { proxyIncrementMetric(uint32(m), int64(offset)) }

// Value returns the counter's value.
func (m MetricCounter) Value() uint64 { return getMetric(uint32(m)) }

// Add adds offset (which may be negative) to the gauge.
func (m MetricGauge) Add(offset int64) { proxyIncrementMetric(uint32(m), offset) }

// Set sets the gauge.
func (m MetricGauge) Set(value int64) { proxyRecordMetric(uint32(m), uint64(value)) }

// Value returns the gauge's value.
func (m MetricGauge) Value() int64 { return int64(getMetric(uint32(m))) }

// Record adds one observation to the histogram.
func (m MetricHistogram) Record(value uint64) { proxyRecordMetric(uint32(m), value) }

func getMetric(id uint32) uint64 {
	var v uint64
	proxyGetMetric(id, unsafe.Pointer(&v))
	return v
}
