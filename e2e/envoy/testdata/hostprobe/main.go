//go:build wasip1

// Command hostprobe is a minimal proxy-wasm HTTP filter that reports how the
// Envoy running it treats the Go runtime. Requests are answered by the filter
// itself, by :path:
//
//	/poll_oneoff  "errno=N": what the host's poll_oneoff returns for a 1 ms
//	              clock subscription (0 once proxy-wasm-cpp-host has 94091cd,
//	              52 (ENOSYS) on the older stub, which makes the Go runtime
//	              throw when its scheduler or GC sleeps)
//	/sleep        "slept": time.Sleep and runtime.GC, the runtime's own path
//	              into poll_oneoff
//	/trap         an out-of-bounds load, which kills the VM
//
// Other paths pass through.
package main

import (
	"encoding/binary"
	"runtime"
	"strconv"
	"time"
	"unsafe"
)

func main() {}

//go:wasmimport env proxy_get_header_map_value
func getHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_send_local_response
func sendLocalResponse(status uint32, details unsafe.Pointer, detailsSize uint32, body unsafe.Pointer, bodySize uint32,
	headers unsafe.Pointer, headersSize uint32, grpcStatus int32) uint32

//go:wasmimport wasi_snapshot_preview1 poll_oneoff
func pollOneoff(in, out unsafe.Pointer, nsubscriptions uint32, nevents unsafe.Pointer) uint32

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

//go:wasmexport proxy_on_memory_allocate
func allocate(size uint32) *byte {
	b := make([]byte, size+1)
	keep = append(keep, b)
	return &b[0]
}

// keep holds the host's allocations until the callback that asked for
// them is over.
var keep [][]byte

//go:wasmexport proxy_on_context_create
func onContextCreate(_, _ uint32) {}

//go:wasmexport proxy_on_vm_start
func onVMStart(_, _ uint32) uint32 { return 1 }

//go:wasmexport proxy_on_configure
func onConfigure(_, _ uint32) uint32 { return 1 }

//go:wasmexport proxy_on_done
func onDone(uint32) uint32 { return 1 }

//go:wasmexport proxy_on_delete
func onDelete(uint32) {}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(_, _, _ uint32) uint32 {
	defer func() { keep = keep[:0] }()
	key := ":path"
	var p *byte
	var n uint32
	if getHeaderMapValue(0, unsafe.Pointer(unsafe.StringData(key)), uint32(len(key)), unsafe.Pointer(&p), unsafe.Pointer(&n)) != 0 {
		return 0
	}
	switch string(unsafe.Slice(p, n)) {
	case "/poll_oneoff":
		return respond("errno=" + strconv.Itoa(int(pollClock())))
	case "/sleep":
		time.Sleep(time.Millisecond)
		runtime.GC()
		return respond("slept")
	case "/trap":
		return uint32(*(*byte)(unsafe.Pointer(uintptr(0xfffffff0))))
	}
	return 0
}

// pollClock asks poll_oneoff to wait 1 ms on the monotonic clock, laid out
// as WASI preview 1 defines subscription (48 bytes) and event (32 bytes).
func pollClock() uint32 {
	var sub [48]byte
	var ev [32]byte
	var nevents uint32
	sub[8] = 0                                           // tag: clock
	binary.LittleEndian.PutUint32(sub[16:], 1)           // id: monotonic
	binary.LittleEndian.PutUint64(sub[24:], uint64(1e6)) // timeout: 1 ms, relative
	binary.LittleEndian.PutUint64(sub[32:], 1000)        // precision
	return pollOneoff(unsafe.Pointer(&sub), unsafe.Pointer(&ev), 1, unsafe.Pointer(&nevents))
}

func respond(body string) uint32 {
	sendLocalResponse(200, nil, 0, unsafe.Pointer(unsafe.StringData(body)), uint32(len(body)), nil, 0, -1)
	return 1 // pause: the local response ends the stream
}
