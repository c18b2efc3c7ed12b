//go:build wasip1

// Command initcall is a proxy-wasm guest whose init makes a hostcall other
// than logging, which Envoy forbids while _initialize runs.
package main

func main() {}

//go:wasmimport env proxy_set_tick_period_milliseconds
func setTickPeriod(ms uint32) uint32

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

//go:wasmexport proxy_on_memory_allocate
func allocate(size uint32) *byte {
	b := make([]byte, size)
	return &b[0]
}

func init() { setTickPeriod(1000) }
