//go:build wasip1

package proxywasm

import "unsafe"

// The host functions of proxy-wasm ABI 0.2.1, module "env". Every one
// returns a proxy_status_t; outputs are written through the pointers.

//go:wasmimport env proxy_log
func proxyLog(level uint32, msg unsafe.Pointer, size uint32) uint32

//go:wasmimport env proxy_get_log_level
func proxyGetLogLevel(level unsafe.Pointer) uint32

//go:wasmimport env proxy_set_tick_period_milliseconds
func proxySetTickPeriodMilliseconds(period uint32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func proxyGetBufferBytes(bufferType, start, maxSize uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_set_buffer_bytes
func proxySetBufferBytes(bufferType, start, size uint32, data unsafe.Pointer, dataSize uint32) uint32

//go:wasmimport env proxy_get_header_map_pairs
func proxyGetHeaderMapPairs(mapType uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_set_header_map_pairs
func proxySetHeaderMapPairs(mapType uint32, data unsafe.Pointer, size uint32) uint32

//go:wasmimport env proxy_get_header_map_value
func proxyGetHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_add_header_map_value
func proxyAddHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize uint32) uint32

//go:wasmimport env proxy_replace_header_map_value
func proxyReplaceHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize uint32) uint32

//go:wasmimport env proxy_remove_header_map_value
func proxyRemoveHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32) uint32

//go:wasmimport env proxy_continue_stream
func proxyContinueStream(streamType uint32) uint32

//go:wasmimport env proxy_send_local_response
func proxySendLocalResponse(status uint32, details unsafe.Pointer, detailsSize uint32, body unsafe.Pointer, bodySize uint32, headers unsafe.Pointer, headersSize uint32, grpcStatus int32) uint32

//go:wasmimport env proxy_http_call
func proxyHttpCall(upstream unsafe.Pointer, upstreamSize uint32, headers unsafe.Pointer, headersSize uint32, body unsafe.Pointer, bodySize uint32, trailers unsafe.Pointer, trailersSize uint32, timeoutMillis uint32, retCallID unsafe.Pointer) uint32

//go:wasmimport env proxy_set_effective_context
func proxySetEffectiveContext(contextID uint32) uint32

//go:wasmimport env proxy_done
func proxyDone() uint32

//go:wasmimport env proxy_get_shared_data
func proxyGetSharedData(key unsafe.Pointer, keySize uint32, retPtr, retSize, retCas unsafe.Pointer) uint32

//go:wasmimport env proxy_set_shared_data
func proxySetSharedData(key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize uint32, cas uint32) uint32

//go:wasmimport env proxy_register_shared_queue
func proxyRegisterSharedQueue(name unsafe.Pointer, nameSize uint32, retID unsafe.Pointer) uint32

//go:wasmimport env proxy_resolve_shared_queue
func proxyResolveSharedQueue(vmID unsafe.Pointer, vmIDSize uint32, name unsafe.Pointer, nameSize uint32, retID unsafe.Pointer) uint32

//go:wasmimport env proxy_enqueue_shared_queue
func proxyEnqueueSharedQueue(queueID uint32, value unsafe.Pointer, valueSize uint32) uint32

//go:wasmimport env proxy_dequeue_shared_queue
func proxyDequeueSharedQueue(queueID uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_define_metric
func proxyDefineMetric(metricType uint32, name unsafe.Pointer, nameSize uint32, retID unsafe.Pointer) uint32

//go:wasmimport env proxy_increment_metric
func proxyIncrementMetric(metricID uint32, offset int64) uint32

//go:wasmimport env proxy_record_metric
func proxyRecordMetric(metricID uint32, value uint64) uint32

//go:wasmimport env proxy_get_metric
func proxyGetMetric(metricID uint32, retValue unsafe.Pointer) uint32

//go:wasmimport env proxy_get_property
func proxyGetProperty(path unsafe.Pointer, pathSize uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_set_property
func proxySetProperty(path unsafe.Pointer, pathSize uint32, value unsafe.Pointer, valueSize uint32) uint32

//go:wasmimport env proxy_call_foreign_function
func proxyCallForeignFunction(name unsafe.Pointer, nameSize uint32, args unsafe.Pointer, argsSize uint32, retPtr, retSize unsafe.Pointer) uint32
