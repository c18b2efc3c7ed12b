package proxywasm

import "unsafe"

// The host hands data to the module by calling proxy_on_memory_allocate and
// copying into what it returns. Envoy restricts which hostcalls may run while
// the allocator runs (older releases trap on the poll_oneoff the Go runtime
// issues when the GC sleeps), so the allocator avoids the Go heap wherever it
// can: small values go to a static arena that is reset when the host enters
// the module, and large values whose size the caller knows in advance go to
// a buffer the caller reserved before the hostcall. Only a large value of
// unknown size makes the allocator call make.

// arena holds small host-to-guest values until the host's outermost call into
// the module returns.
var arena [64 << 10]byte

var (
	arenaUsed int
	// reserved, when non-nil, receives the next allocation that fits in it.
	reserved []byte
	// spill keeps the last heap allocation reachable until its hostcall has
	// returned and the caller holds it.
	spill []byte
	// depth counts nested host-to-module calls; the arena is reset only on
	// the outermost one, so a value read in a callback stays valid for the
	// whole callback.
	depth int
)

// out receives a data-returning hostcall's results. Locals whose addresses
// go to an import escape to the heap, since the compiler cannot see that the
// host keeps none: two allocations per hostcall, and a request makes about
// eight such calls. A global costs none, and unlike a stack slot cannot move
// while the host calls back into the allocator. One is enough: the module
// makes one hostcall at a time and reads the results before the next, and
// the allocator the host may call meanwhile makes no hostcall. Calls the host
// may answer by calling back into the filter (an HTTP call's dispatch) keep
// their own.
var out struct {
	ptr       *byte
	size, cas uint32
}

// takeOut returns the data pointer and size the last hostcall wrote to out,
// and clears them so that out keeps nothing alive.
func takeOut() (*byte, uint32) {
	p, n := out.ptr, out.size
	out.ptr, out.size, out.cas = nil, 0, 0
	return p, n
}

func allocate(size uint32) *byte {
	n := int(size)
	if n == 0 {
		n = 1 // the host never asks for 0 bytes, but a nil result means failure
	}
	if reserved != nil && n <= cap(reserved) {
		b := reserved[:n]
		reserved = nil
		return &b[0]
	}
	start := (arenaUsed + 7) &^ 7
	if start+n <= len(arena) {
		arenaUsed = start + n
		return &arena[start]
	}
	spill = make([]byte, n)
	return &spill[0]
}

// reserve makes buf the destination of the next host allocation that fits.
func reserve(buf []byte) {
	if cap(buf) > 0 {
		reserved = buf[:cap(buf)]
	}
}

// enter marks the start of a host-to-module call.
func enter() {
	depth++
	if depth == 1 {
		arenaUsed = 0
	}
}

// leave marks its end.
func leave() {
	depth--
	if depth == 0 {
		reserved = nil
		spill = nil
	}
}

func inArena(p *byte) bool {
	a := uintptr(unsafe.Pointer(&arena[0]))
	q := uintptr(unsafe.Pointer(p))
	return q >= a && q < a+uintptr(len(arena))
}

// owned returns the size bytes at p as a slice the caller may keep: arena
// bytes are copied out, anything else already belongs to the caller.
func owned(p *byte, size uint32) []byte {
	if p == nil || size == 0 {
		return nil
	}
	b := unsafe.Slice(p, size)
	if inArena(p) {
		return append([]byte(nil), b...)
	}
	return b
}

// borrowed returns the size bytes at p without copying; arena bytes stay
// valid only until the current callback returns.
func borrowed(p *byte, size uint32) []byte {
	if p == nil || size == 0 {
		return nil
	}
	return unsafe.Slice(p, size)
}

func bytesPtr(b []byte) unsafe.Pointer {
	return unsafe.Pointer(unsafe.SliceData(b))
}

func stringPtr(s string) unsafe.Pointer {
	return unsafe.Pointer(unsafe.StringData(s))
}
