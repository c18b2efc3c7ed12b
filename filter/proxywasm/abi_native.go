//go:build !wasip1

package proxywasm

import (
	"unsafe"

	"github.com/kvroute/kvroute/filter/proxywasm/types"
)

const unimplemented = uint32(types.StatusUnimplemented)

// Outside Wasm there is no host: every hostcall reports StatusUnimplemented,
// so the filter compiles natively and its logic can be unit-tested.
func proxyLog(level uint32, msg unsafe.Pointer, size uint32) uint32 { return unimplemented }
func proxyGetLogLevel(level unsafe.Pointer) uint32                  { return unimplemented }
func proxySetTickPeriodMilliseconds(period uint32) uint32           { return unimplemented }
func proxyGetBufferBytes(bufferType, start, maxSize uint32, retPtr, retSize unsafe.Pointer) uint32 {
	return unimplemented
}
func proxySetBufferBytes(bufferType, start, size uint32, data unsafe.Pointer, dataSize uint32) uint32 {
	return unimplemented
}
func proxyGetHeaderMapPairs(mapType uint32, retPtr, retSize unsafe.Pointer) uint32 {
	return unimplemented
}
func proxySetHeaderMapPairs(mapType uint32, data unsafe.Pointer, size uint32) uint32 {
	return unimplemented
}
func proxyGetHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32, retPtr, retSize unsafe.Pointer) uint32 {
	return unimplemented
}
func proxyAddHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize uint32) uint32 {
	return unimplemented
}
func proxyReplaceHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize uint32) uint32 {
	return unimplemented
}
func proxyRemoveHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32) uint32 {
	return unimplemented
}
func proxyContinueStream(streamType uint32) uint32 { return unimplemented }
func proxySendLocalResponse(status uint32, details unsafe.Pointer, detailsSize uint32, body unsafe.Pointer, bodySize uint32, headers unsafe.Pointer, headersSize uint32, grpcStatus int32) uint32 {
	return unimplemented
}
func proxyHttpCall(upstream unsafe.Pointer, upstreamSize uint32, headers unsafe.Pointer, headersSize uint32, body unsafe.Pointer, bodySize uint32, trailers unsafe.Pointer, trailersSize uint32, timeoutMillis uint32, retCallID unsafe.Pointer) uint32 {
	return unimplemented
}
func proxySetEffectiveContext(contextID uint32) uint32 { return unimplemented }
func proxyDone() uint32                                { return unimplemented }
func proxyGetSharedData(key unsafe.Pointer, keySize uint32, retPtr, retSize, retCas unsafe.Pointer) uint32 {
	return unimplemented
}
func proxySetSharedData(key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize uint32, cas uint32) uint32 {
	return unimplemented
}
func proxyRegisterSharedQueue(name unsafe.Pointer, nameSize uint32, retID unsafe.Pointer) uint32 {
	return unimplemented
}
func proxyResolveSharedQueue(vmID unsafe.Pointer, vmIDSize uint32, name unsafe.Pointer, nameSize uint32, retID unsafe.Pointer) uint32 {
	return unimplemented
}
func proxyEnqueueSharedQueue(queueID uint32, value unsafe.Pointer, valueSize uint32) uint32 {
	return unimplemented
}
func proxyDequeueSharedQueue(queueID uint32, retPtr, retSize unsafe.Pointer) uint32 {
	return unimplemented
}
func proxyDefineMetric(metricType uint32, name unsafe.Pointer, nameSize uint32, retID unsafe.Pointer) uint32 {
	return unimplemented
}
func proxyIncrementMetric(metricID uint32, offset int64) uint32      { return unimplemented }
func proxyRecordMetric(metricID uint32, value uint64) uint32         { return unimplemented }
func proxyGetMetric(metricID uint32, retValue unsafe.Pointer) uint32 { return unimplemented }
func proxyGetProperty(path unsafe.Pointer, pathSize uint32, retPtr, retSize unsafe.Pointer) uint32 {
	return unimplemented
}
func proxySetProperty(path unsafe.Pointer, pathSize uint32, value unsafe.Pointer, valueSize uint32) uint32 {
	return unimplemented
}
func proxyCallForeignFunction(name unsafe.Pointer, nameSize uint32, args unsafe.Pointer, argsSize uint32, retPtr, retSize unsafe.Pointer) uint32 {
	return unimplemented
}
