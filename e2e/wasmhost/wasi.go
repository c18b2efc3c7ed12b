package wasmhost

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"time"

	"github.com/tetratelabs/wazero/api"
)

// WASI errno values cpp-host answers with.
const (
	errnoSuccess = 0
	errnoBadf    = 8
	errnoFault   = 21
	errnoNosys   = 52
	errnoNotsup  = 58
)

const (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

// wasiFunc is one WASI import as Envoy 1.33's cpp-host (commit c4d7bb0)
// registers it: the set of names is the allowlist a module must fit in.
type wasiFunc struct {
	params  []api.ValueType
	results []api.ValueType
	fn      func(vm *VM, mod api.Module, stack []uint64)
}

var envoyWASI = map[string]wasiFunc{
	"fd_write":            {[]api.ValueType{i32, i32, i32, i32}, []api.ValueType{i32}, wasiFdWrite},
	"fd_read":             {[]api.ValueType{i32, i32, i32, i32}, []api.ValueType{i32}, wasiErrno(errnoNosys)},
	"fd_seek":             {[]api.ValueType{i32, i64, i32, i32}, []api.ValueType{i32}, wasiLogged("wasi_unstable fd_seek")},
	"fd_close":            {[]api.ValueType{i32}, []api.ValueType{i32}, wasiLogged("wasi_unstable fd_close")},
	"fd_fdstat_get":       {[]api.ValueType{i32, i32}, []api.ValueType{i32}, wasiFdstatGet},
	"fd_fdstat_set_flags": {[]api.ValueType{i32, i32}, []api.ValueType{i32}, wasiErrno(errnoNosys)},
	"environ_get":         {[]api.ValueType{i32, i32}, []api.ValueType{i32}, wasiEnvironGet},
	"environ_sizes_get":   {[]api.ValueType{i32, i32}, []api.ValueType{i32}, wasiEnvironSizesGet},
	"args_get":            {[]api.ValueType{i32, i32}, []api.ValueType{i32}, wasiErrno(errnoSuccess)},
	"args_sizes_get":      {[]api.ValueType{i32, i32}, []api.ValueType{i32}, wasiArgsSizesGet},
	"clock_time_get":      {[]api.ValueType{i32, i64, i32}, []api.ValueType{i32}, wasiClockTimeGet},
	"random_get":          {[]api.ValueType{i32, i32}, []api.ValueType{i32}, wasiRandomGet},
	"sched_yield":         {nil, []api.ValueType{i32}, wasiErrno(errnoSuccess)},
	"poll_oneoff":         {[]api.ValueType{i32, i32, i32, i32}, []api.ValueType{i32}, wasiPollOneoff},
	"proc_exit":           {[]api.ValueType{i32}, nil, wasiProcExit},
	"path_open":           {[]api.ValueType{i32, i32, i32, i32, i32, i64, i64, i32, i32}, []api.ValueType{i32}, wasiErrno(errnoNosys)},
	"fd_prestat_get":      {[]api.ValueType{i32, i32}, []api.ValueType{i32}, wasiErrno(errnoBadf)},
	"fd_prestat_dir_name": {[]api.ValueType{i32, i32, i32}, []api.ValueType{i32}, wasiErrno(errnoNosys)},
}

// allowedDuringInit are the calls cpp-host permits while _initialize runs;
// every other hostcall traps with restricted_callback.
var allowedDuringInit = map[string]bool{
	"proxy_log": true, "fd_write": true, "args_get": true, "args_sizes_get": true,
	"environ_get": true, "environ_sizes_get": true, "clock_time_get": true, "random_get": true,
	"fd_fdstat_get": true, "fd_fdstat_set_flags": true, "fd_prestat_get": true,
	"fd_prestat_dir_name": true, "poll_oneoff": true, "sched_yield": true, "proc_exit": true,
}

// allowedInAllocator returns the calls permitted while the host runs the
// guest allocator. poll_oneoff joined the list with 94091cd ("go runtime gc
// sleep").
func allowedInAllocator(s Semantics, name string) bool {
	switch name {
	case "proxy_log", "fd_write", "clock_time_get":
		return true
	case "poll_oneoff":
		return s == Fixed
	}
	return false
}

func (h *Host) instantiateWASI(ctx context.Context) error {
	b := h.runtime.NewHostModuleBuilder("wasi_snapshot_preview1")
	for name, f := range envoyWASI {
		b.NewFunctionBuilder().
			WithGoModuleFunction(h.hostFunc(name, f.params, f.fn), f.params, f.results).
			Export(name)
	}
	_, err := b.Instantiate(ctx)
	return err
}

func wasiErrno(errno uint64) func(*VM, api.Module, []uint64) {
	return func(_ *VM, _ api.Module, stack []uint64) { stack[0] = errno }
}

func wasiLogged(msg string) func(*VM, api.Module, []uint64) {
	return func(vm *VM, _ api.Module, stack []uint64) {
		vm.log(levelError, msg)
		stack[0] = errnoSuccess
	}
}

// wasiFdWrite sends stdout to the info log and stderr to the error log, as
// cpp-host's writevImpl does; other descriptors are EBADF.
func wasiFdWrite(vm *VM, mod api.Module, stack []uint64) {
	fd, iovs, n, nwritten := uint32(stack[0]), uint32(stack[1]), uint32(stack[2]), uint32(stack[3])
	level := levelInfo
	switch fd {
	case 1:
	case 2:
		level = levelError
	default:
		stack[0] = errnoBadf
		return
	}
	mem := mod.Memory()
	var s []byte
	for i := uint32(0); i < n; i++ {
		ptr, ok1 := mem.ReadUint32Le(iovs + 8*i)
		size, ok2 := mem.ReadUint32Le(iovs + 8*i + 4)
		data, ok3 := mem.Read(ptr, size)
		if !ok1 || !ok2 || !ok3 {
			stack[0] = errnoFault
			return
		}
		s = append(s, data...)
	}
	written := len(s)
	if written > 0 && s[written-1] == '\n' {
		s = s[:written-1]
	}
	if written > 0 {
		vm.log(level, string(s))
	}
	if !mem.WriteUint32Le(nwritten, uint32(written)) {
		stack[0] = errnoFault
		return
	}
	stack[0] = errnoSuccess
}

// wasiFdstatGet answers for stdout and stderr only: a zeroed fdstat with
// the write right, so the Go runtime never sees a non-blocking descriptor.
func wasiFdstatGet(_ *VM, mod api.Module, stack []uint64) {
	fd, out := uint32(stack[0]), uint32(stack[1])
	if fd != 1 && fd != 2 {
		stack[0] = errnoBadf
		return
	}
	var st [24]byte
	binary.LittleEndian.PutUint64(st[8:], 64) // fs_rights_base = FD_WRITE
	if !mod.Memory().Write(out, st[:]) {
		stack[0] = errnoFault
		return
	}
	stack[0] = errnoSuccess
}

func wasiEnvironGet(vm *VM, mod api.Module, stack []uint64) {
	arr, buf := uint32(stack[0]), uint32(stack[1])
	mem := mod.Memory()
	for _, e := range vm.cfg.Env {
		data := append([]byte(e), 0)
		if !mem.WriteUint32Le(arr, buf) || !mem.Write(buf, data) {
			stack[0] = errnoFault
			return
		}
		arr += 4
		buf += uint32(len(data))
	}
	stack[0] = errnoSuccess
}

func wasiEnvironSizesGet(vm *VM, mod api.Module, stack []uint64) {
	size := 0
	for _, e := range vm.cfg.Env {
		size += len(e) + 1
	}
	mem := mod.Memory()
	if !mem.WriteUint32Le(uint32(stack[0]), uint32(len(vm.cfg.Env))) || !mem.WriteUint32Le(uint32(stack[1]), uint32(size)) {
		stack[0] = errnoFault
		return
	}
	stack[0] = errnoSuccess
}

func wasiArgsSizesGet(_ *VM, mod api.Module, stack []uint64) {
	mem := mod.Memory()
	if !mem.WriteUint32Le(uint32(stack[0]), 0) || !mem.WriteUint32Le(uint32(stack[1]), 0) {
		stack[0] = errnoFault
		return
	}
	stack[0] = errnoSuccess
}

var monotonicStart = time.Now()

func wasiClockTimeGet(_ *VM, mod api.Module, stack []uint64) {
	var now uint64
	switch uint32(stack[0]) {
	case 0: // realtime
		now = uint64(time.Now().UnixNano())
	case 1: // monotonic
		now = uint64(time.Since(monotonicStart).Nanoseconds()) + 1
	default:
		stack[0] = errnoNotsup
		return
	}
	if !mod.Memory().WriteUint64Le(uint32(stack[2]), now) {
		stack[0] = errnoFault
		return
	}
	stack[0] = errnoSuccess
}

func wasiRandomGet(_ *VM, mod api.Module, stack []uint64) {
	buf := make([]byte, uint32(stack[1]))
	rand.Read(buf)
	if !mod.Memory().Write(uint32(stack[0]), buf) {
		stack[0] = errnoFault
		return
	}
	stack[0] = errnoSuccess
}

// wasiPollOneoff is the call at the heart of the Go-on-Envoy crash: legacy
// hosts answer ENOSYS, which the Go runtime turns into a fatal error when it
// sleeps (timers, GC); fixed hosts report success with no events.
func wasiPollOneoff(vm *VM, mod api.Module, stack []uint64) {
	vm.host.countPoll()
	if vm.host.semantics == Legacy {
		stack[0] = errnoNosys
		return
	}
	if !mod.Memory().WriteUint32Le(uint32(stack[3]), 0) {
		stack[0] = errnoFault
		return
	}
	stack[0] = errnoSuccess
}

// wasiProcExit fails the VM: cpp-host reports it as an error and the module
// cannot continue.
func wasiProcExit(vm *VM, _ api.Module, stack []uint64) {
	panic(vmFailure("proc_exit(" + itoa(uint32(stack[0])) + ")"))
}
