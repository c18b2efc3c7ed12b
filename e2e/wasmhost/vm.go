package wasmhost

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// VMConfig is what Envoy's PluginConfig and VmConfig give one VM.
type VMConfig struct {
	VMID                string // vm_config.vm_id: scopes shared data and queues
	RootID              string // root_id, readable as the plugin_root_id property
	VMConfiguration     []byte
	PluginConfiguration []byte
	// AllowOnHeadersStopIteration is PluginConfig.allow_on_headers_stop_iteration
	// (Envoy 1.35+). Without it a pause from the request-headers callback
	// becomes StopAllIterationAndWatermark and the filter sees no body until
	// it calls proxy_continue_stream.
	AllowOnHeadersStopIteration bool
	// Clusters answers proxy_http_call per Envoy cluster name; a call to a
	// cluster not listed fails with BAD_ARGUMENT, as for an unknown cluster.
	Clusters map[string]func(*Callout) CalloutResponse
	// Env is the VM's environment, "KEY=value".
	Env []string
	// Logf, if set, receives every log line the module writes.
	Logf func(format string, args ...any)
}

// LogEntry is one line the module logged.
type LogEntry struct {
	Level int
	Msg   string
}

// Log levels as proxy_log numbers them.
const (
	levelTrace = iota
	levelDebug
	levelInfo
	levelWarn
	levelError
	levelCritical
)

type phase int

const (
	phaseIdle phase = iota
	phaseInit
	phaseCallback
	phaseAlloc
)

// vmFailure is a panic value that fails the VM, like an Envoy trap.
type vmFailure string

type vmKey struct{}

// VM is one instance of the module: one Envoy worker thread's VM, or the
// main thread's singleton.
type VM struct {
	host *Host
	cfg  VMConfig
	mod  api.Module
	ctx  context.Context

	rootID  uint32
	nextID  uint32
	phase   phase
	depth   int
	active  uint32 // effective context
	err     error
	logs    []LogEntry
	after   []func()
	streams map[uint32]*Stream

	tickPeriod time.Duration

	// buffers visible to the running callback
	vmConfigVisible     bool
	pluginConfigVisible bool
	callResponse        *CalloutResponse

	nextCallout uint32
	callouts    []*Callout
	readyQueues []uint32
}

// NewVM instantiates the module and starts its root context the way Envoy
// does: _initialize, then proxy_on_context_create(root, 0),
// proxy_on_vm_start and proxy_on_configure. A false from either callback
// rejects the configuration and is returned as an error.
func (h *Host) NewVM(ctx context.Context, cfg VMConfig) (*VM, error) {
	vm := &VM{host: h, cfg: cfg, streams: map[uint32]*Stream{}, nextID: 1}
	vm.ctx = context.WithValue(ctx, vmKey{}, vm)
	vm.phase = phaseInit
	mod, err := h.runtime.InstantiateModule(vm.ctx, h.compiled,
		wazero.NewModuleConfig().WithName("").WithStartFunctions("_initialize"))
	vm.phase = phaseIdle
	if err != nil {
		vm.fail(err)
		return vm, fmt.Errorf("wasmhost: instantiate: %w", vm.err)
	}
	vm.mod = mod
	h.mu.Lock()
	h.vms = append(h.vms, vm)
	h.mu.Unlock()

	vm.rootID = vm.newID()
	vm.active = vm.rootID
	vm.call("proxy_on_context_create", uint64(vm.rootID), 0)
	vm.vmConfigVisible = true
	ok, _ := vm.call("proxy_on_vm_start", uint64(vm.rootID), uint64(len(cfg.VMConfiguration)))
	vm.vmConfigVisible = false
	if vm.err == nil && ok == 0 {
		return vm, errors.New("wasmhost: proxy_on_vm_start returned false")
	}
	vm.pluginConfigVisible = true
	ok, _ = vm.call("proxy_on_configure", uint64(vm.rootID), uint64(len(cfg.PluginConfiguration)))
	vm.pluginConfigVisible = false
	if vm.err != nil {
		return vm, vm.err
	}
	if ok == 0 {
		return vm, errors.New("wasmhost: proxy_on_configure returned false")
	}
	return vm, nil
}

// Err returns the failure that stopped the VM, or nil while it runs.
func (vm *VM) Err() error { return vm.err }

// Logs returns what the module has logged so far.
func (vm *VM) Logs() []LogEntry { return append([]LogEntry(nil), vm.logs...) }

// LogText returns the logged messages joined by newlines.
func (vm *VM) LogText() string {
	var b strings.Builder
	for _, l := range vm.logs {
		b.WriteString(l.Msg)
		b.WriteByte('\n')
	}
	return b.String()
}

// TickPeriod is the period the root context asked for, 0 if none.
func (vm *VM) TickPeriod() time.Duration { return vm.tickPeriod }

// Tick calls proxy_on_tick if the root context set a tick period.
func (vm *VM) Tick() {
	if vm.tickPeriod > 0 {
		vm.withContext(vm.rootID, func() { vm.call("proxy_on_tick", uint64(vm.rootID)) })
	}
}

// Close runs the root context's teardown: proxy_on_done, then
// proxy_on_delete.
func (vm *VM) Close() {
	vm.withContext(vm.rootID, func() {
		vm.call("proxy_on_done", uint64(vm.rootID))
		vm.call("proxy_on_delete", uint64(vm.rootID))
	})
}

// MemoryPages returns the size of the VM's linear memory in 64 KiB pages.
func (vm *VM) MemoryPages() uint32 {
	if vm.mod == nil {
		return 0
	}
	return vm.mod.Memory().Size() / 65536
}

func (vm *VM) newID() uint32 {
	id := vm.nextID
	vm.nextID++
	return id
}

func (vm *VM) log(level int, msg string) {
	vm.logs = append(vm.logs, LogEntry{Level: level, Msg: msg})
	if vm.cfg.Logf != nil {
		vm.cfg.Logf("wasm[%d]: %s", level, msg)
	}
}

func (vm *VM) fail(err error) {
	if vm.err == nil {
		vm.err = err
	}
}

// call invokes an exported callback if the module has it. Actions the module
// asked for during the call (continuing a stream, a local reply) run after
// the outermost call returns, as Envoy defers them.
func (vm *VM) call(name string, args ...uint64) (uint64, error) {
	if vm.err != nil {
		return 0, vm.err
	}
	fn := vm.mod.ExportedFunction(name)
	if fn == nil {
		return 0, nil
	}
	prev := vm.phase
	vm.phase = phaseCallback
	vm.depth++
	res, err := fn.Call(vm.ctx, args...)
	vm.depth--
	vm.phase = prev
	if err != nil {
		vm.fail(fmt.Errorf("wasmhost: %s: %w", name, err))
		return 0, vm.err
	}
	if vm.depth == 0 {
		for len(vm.after) > 0 {
			next := vm.after[0]
			vm.after = vm.after[1:]
			next()
		}
	}
	if len(res) == 0 {
		return 0, nil
	}
	return res[0], nil
}

// withContext runs fn with a context made effective, as Envoy does for each
// callback.
func (vm *VM) withContext(id uint32, fn func()) {
	prev := vm.active
	vm.active = id
	fn()
	vm.active = prev
}

// alloc runs the guest allocator in its restricted phase.
func (vm *VM) alloc(size uint32) (uint32, error) {
	fn := vm.mod.ExportedFunction("malloc")
	if fn == nil {
		fn = vm.mod.ExportedFunction("proxy_on_memory_allocate")
	}
	prev := vm.phase
	vm.phase = phaseAlloc
	res, err := fn.Call(vm.ctx, uint64(size))
	vm.phase = prev
	if err != nil {
		return 0, err
	}
	if res[0] == 0 {
		return 0, errors.New("allocator returned 0")
	}
	return uint32(res[0]), nil
}

// copyOut hands data to the guest as cpp-host's copyToPointerSize does: an
// empty value is (0, 0) without an allocation.
func (vm *VM) copyOut(mod api.Module, data []byte, ptrPtr, sizePtr uint32) uint32 {
	mem := mod.Memory()
	if len(data) == 0 {
		if !mem.WriteUint32Le(ptrPtr, 0) || !mem.WriteUint32Le(sizePtr, 0) {
			return statusInvalidMemoryAccess
		}
		return statusOK
	}
	p, err := vm.alloc(uint32(len(data)))
	if err != nil {
		panic(vmFailure("allocator: " + err.Error()))
	}
	if !mem.Write(p, data) || !mem.WriteUint32Le(ptrPtr, p) || !mem.WriteUint32Le(sizePtr, uint32(len(data))) {
		return statusInvalidMemoryAccess
	}
	return statusOK
}

// hostFunc wraps a host function with the checks Envoy applies to every
// hostcall: restricted phases trap, and a failure panic traps the VM.
func (h *Host) hostFunc(name string, params []api.ValueType, fn func(*VM, api.Module, []uint64)) api.GoModuleFunc {
	return func(ctx context.Context, mod api.Module, stack []uint64) {
		// wazero leaves the upper half of an i32 parameter undefined.
		for i, t := range params {
			if t == api.ValueTypeI32 {
				stack[i] = uint64(uint32(stack[i]))
			}
		}
		vm, _ := ctx.Value(vmKey{}).(*VM)
		if vm == nil {
			panic("wasmhost: hostcall " + name + " outside a VM call")
		}
		switch vm.phase {
		case phaseInit:
			if !allowedDuringInit[name] {
				vm.restricted(name, "_initialize")
			}
		case phaseAlloc:
			if !allowedInAllocator(h.semantics, name) {
				vm.restricted(name, "the allocator")
			}
		}
		fn(vm, mod, stack)
	}
}

func (vm *VM) restricted(name, where string) {
	msg := "Uncaught Error: restricted_callback: " + name + " called during " + where
	vm.log(levelCritical, msg)
	vm.fail(errors.New("wasmhost: " + msg))
	panic(vmFailure(msg))
}

func itoa(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

func (h *Host) countPoll() {
	h.mu.Lock()
	h.polls++
	h.mu.Unlock()
}

// PollCalls returns how many times modules called poll_oneoff: the Go
// runtime calls it only when it sleeps or idles, which legacy hosts punish.
func (h *Host) PollCalls() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.polls
}
