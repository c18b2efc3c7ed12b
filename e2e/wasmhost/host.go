// Package wasmhost runs kvroute's compiled Wasm module in-process under
// wazero, behaving like Envoy's proxy-wasm host (proxy-wasm-cpp-host) rather
// than like a friendly WASI runtime:
//
//   - only the WASI imports Envoy registers exist, so a module that needs
//     more fails to instantiate exactly as it would in Envoy;
//   - poll_oneoff answers ENOSYS (Envoy 1.33 to 1.39) or success with no
//     events (hosts with proxy-wasm-cpp-host commit 94091cd);
//   - hostcalls outside Envoy's allowlists trap with restricted_callback
//     while _initialize and the guest allocator run;
//   - contexts are created and called in Envoy's order, and a header pause
//     stops body callbacks unless allow_on_headers_stop_iteration is set;
//   - header maps are parsed as strictly as cpp-host parses them;
//   - shared data and queues are keyed by vm_id with cpp-host's CAS rules and
//     shared by every VM of one Host, like Envoy's worker VMs.
//
// A trap or exit inside the module fails its VM, as in Envoy; tests assert
// on VM.Err.
package wasmhost

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/tetratelabs/wazero"
)

// Semantics selects which generation of Envoy's proxy-wasm host to imitate.
type Semantics int

const (
	// Fixed imitates hosts that include proxy-wasm-cpp-host commit 94091cd
	// (April 2026): poll_oneoff succeeds with no events and may be called
	// while the allocator runs.
	Fixed Semantics = iota
	// Legacy imitates Envoy 1.33 to 1.39 (cpp-host c4d7bb0 up to 94091cd):
	// poll_oneoff fails with ENOSYS, which the Go runtime treats as fatal.
	Legacy
)

func (s Semantics) String() string {
	if s == Legacy {
		return "legacy (poll_oneoff=ENOSYS)"
	}
	return "fixed (poll_oneoff=0)"
}

// compilationCache lets every Host of a test binary share one compilation
// of the same module, which takes seconds.
var compilationCache = wazero.NewCompilationCache()

// Host owns a compiled module and the process-wide state Envoy shares
// between VMs: shared data, shared queues and metrics.
type Host struct {
	semantics Semantics
	runtime   wazero.Runtime
	compiled  wazero.CompiledModule

	mu        sync.Mutex
	shared    map[string]map[string]*sharedValue // vm_id -> key -> value
	cas       uint32
	queues    map[queueKey]*queue
	queueIDs  registry[queue]
	metrics   map[string]*metric
	metricIDs registry[metric]
	vms       []*VM
	polls     int
}

type sharedValue struct {
	data []byte
	cas  uint32
}

type queueKey struct{ vmID, name string }

type queue struct {
	id    uint32
	key   queueKey
	owner *VM // the VM whose root context registered it
	items [][]byte
}

type metric struct {
	id    uint32
	name  string
	kind  uint32
	value int64
}

// registry numbers what it holds from 1, as the ABI's queue and metric ids
// are (0 is never valid).
type registry[T any] struct{ items []*T }

func (r *registry[T]) add(v *T) uint32 {
	r.items = append(r.items, v)
	return uint32(len(r.items))
}

func (r *registry[T]) get(id uint64) *T {
	if id == 0 || id > uint64(len(r.items)) {
		return nil
	}
	return r.items[id-1]
}

// New compiles wasm and prepares a host with the given semantics. It fails
// if the module imports anything Envoy does not provide.
func New(ctx context.Context, wasm []byte, semantics Semantics) (*Host, error) {
	return newHost(ctx, wasm, semantics, true)
}

func newHost(ctx context.Context, wasm []byte, semantics Semantics, cached bool) (*Host, error) {
	cfg := wazero.NewRuntimeConfigCompiler()
	if cached {
		cfg = cfg.WithCompilationCache(compilationCache)
	}
	r := wazero.NewRuntimeWithConfig(ctx, cfg)
	h := &Host{
		semantics: semantics,
		runtime:   r,
		shared:    map[string]map[string]*sharedValue{},
		queues:    map[queueKey]*queue{},
		metrics:   map[string]*metric{},
	}
	if err := h.instantiateWASI(ctx); err != nil {
		r.Close(ctx)
		return nil, fmt.Errorf("wasmhost: wasi module: %w", err)
	}
	if err := h.instantiateEnv(ctx); err != nil {
		r.Close(ctx)
		return nil, fmt.Errorf("wasmhost: env module: %w", err)
	}
	compiled, err := r.CompileModule(ctx, wasm)
	if err != nil {
		r.Close(ctx)
		return nil, fmt.Errorf("wasmhost: compile: %w", err)
	}
	if err := checkModule(compiled); err != nil {
		r.Close(ctx)
		return nil, err
	}
	h.compiled = compiled
	return h, nil
}

// Close releases the runtime and every VM.
func (h *Host) Close(ctx context.Context) error { return h.runtime.Close(ctx) }

// checkModule applies cpp-host's load-time checks: an ABI marker and an
// allocator must be exported, and every import must be one Envoy registers.
func checkModule(c wazero.CompiledModule) error {
	exports := c.ExportedFunctions()
	markers := 0
	for _, m := range []string{"proxy_abi_version_0_2_0", "proxy_abi_version_0_2_1"} {
		if _, ok := exports[m]; ok {
			markers++
		}
	}
	if markers != 1 {
		return errors.New("wasmhost: Missing or unknown Proxy-Wasm ABI version")
	}
	_, malloc := exports["malloc"]
	_, alloc := exports["proxy_on_memory_allocate"]
	if !malloc && !alloc {
		return errors.New("wasmhost: Wasm module is missing malloc function")
	}
	if bad := DisallowedImports(c); len(bad) > 0 {
		return fmt.Errorf("wasmhost: Failed to load Wasm module due to a missing import: %v", bad)
	}
	return nil
}

// DisallowedImports lists the module's imports that Envoy 1.33 does not
// register (as "module.name"), sorted; a module that imports any of them
// cannot load there.
func DisallowedImports(c wazero.CompiledModule) []string {
	var bad []string
	for _, f := range c.ImportedFunctions() {
		mod, name, _ := f.Import()
		allowed := false
		switch mod {
		case "wasi_snapshot_preview1", "wasi_unstable":
			_, allowed = envoyWASI[name]
		case "env":
			_, allowed = envoyEnv[name]
		}
		if !allowed {
			bad = append(bad, mod+"."+name)
		}
	}
	sort.Strings(bad)
	return bad
}

// Imports lists every function the module imports, as "module.name", sorted.
func (h *Host) Imports() []string {
	var all []string
	for _, f := range h.compiled.ImportedFunctions() {
		mod, name, _ := f.Import()
		all = append(all, mod+"."+name)
	}
	sort.Strings(all)
	return all
}

// Metric returns the value of a metric the module defined, summed over VMs
// as Envoy's stats are, and whether it exists.
func (h *Host) Metric(name string) (int64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m, ok := h.metrics[name]
	if !ok {
		return 0, false
	}
	return m.value, true
}

// SharedData returns a shared-data value stored under vmID.
func (h *Host) SharedData(vmID, key string) ([]byte, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, ok := h.shared[vmID][key]
	if !ok {
		return nil, false
	}
	return append([]byte(nil), v.data...), true
}

// SetSharedData stores a value as another VM of the same vm_id would.
func (h *Host) SetSharedData(vmID, key string, data []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.setShared(vmID, key, data, 0)
}

// setShared applies cpp-host's CAS rules: cas 0 writes unconditionally, a
// missing key accepts any cas, and otherwise the cas must match.
func (h *Host) setShared(vmID, key string, data []byte, cas uint32) uint32 {
	m := h.shared[vmID]
	if m == nil {
		m = map[string]*sharedValue{}
		h.shared[vmID] = m
	}
	if v, ok := m[key]; ok && cas != 0 && cas != v.cas {
		return statusCasMismatch
	}
	h.cas++
	m[key] = &sharedValue{data: append([]byte(nil), data...), cas: h.cas}
	return statusOK
}
