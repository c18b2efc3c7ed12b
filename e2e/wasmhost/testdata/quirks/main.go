//go:build wasip1

// Command quirks is a minimal proxy-wasm guest that trips the Envoy quirks
// the wasmhost tests must reproduce. Its VM configuration picks the quirk:
//
//	"sleep"       on_vm_start sleeps, so the Go runtime calls poll_oneoff
//	"alloc-call"  its allocator makes a hostcall Envoy forbids there
package main

import (
	"time"
	"unsafe"
)

func main() {}

//go:wasmimport env proxy_get_buffer_bytes
func getBufferBytes(kind, start, max uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_set_tick_period_milliseconds
func setTickPeriod(ms uint32) uint32

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

var callFromAllocator bool

//go:wasmexport proxy_on_memory_allocate
func allocate(size uint32) *byte {
	if callFromAllocator {
		setTickPeriod(1)
	}
	b := make([]byte, size)
	return &b[0]
}

//go:wasmexport proxy_on_vm_start
func onVMStart(_, size uint32) uint32 {
	var p *byte
	var n uint32
	callFromAllocator = size == uint32(len("alloc-call"))
	getBufferBytes(6, 0, size, unsafe.Pointer(&p), unsafe.Pointer(&n))
	callFromAllocator = false
	if string(unsafe.Slice(p, n)) == "sleep" {
		// Long enough that the timer is still pending when the scheduler
		// idles, even on a loaded machine: a 1 ms sleep could expire
		// first, and then the runtime never called poll_oneoff.
		time.Sleep(100 * time.Millisecond)
	}
	return 1
}

//go:wasmexport proxy_on_configure
func onConfigure(_, _ uint32) uint32 { return 1 }
