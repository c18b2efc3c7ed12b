package wasmhost

import (
	"context"
	"strings"
	"time"

	"github.com/tetratelabs/wazero/api"
)

// proxy_status_t values.
const (
	statusOK                  = 0
	statusNotFound            = 1
	statusBadArgument         = 2
	statusInvalidMemoryAccess = 6
	statusEmpty               = 7
	statusCasMismatch         = 8
	statusInternalFailure     = 10
	statusUnimplemented       = 12
)

// Buffer and map kinds of ABI 0.2.1.
const (
	bufHTTPRequestBody      = 0
	bufHTTPResponseBody     = 1
	bufHTTPCallResponseBody = 4
	bufVMConfiguration      = 6
	bufPluginConfiguration  = 7
	bufMax                  = 8

	mapRequestHeaders      = 0
	mapRequestTrailers     = 1
	mapResponseHeaders     = 2
	mapResponseTrailers    = 3
	mapCallResponseHeaders = 6
	mapCallResponseTrail   = 7
)

type envFunc struct {
	params  []api.ValueType
	results []api.ValueType
	fn      func(vm *VM, mod api.Module, stack []uint64)
}

func params(n int) []api.ValueType {
	p := make([]api.ValueType, n)
	for i := range p {
		p[i] = i32
	}
	return p
}

var status = []api.ValueType{i32}

func unimplemented(_ *VM, _ api.Module, stack []uint64) { stack[0] = statusUnimplemented }

// envoyEnv is the "env" module Envoy registers for ABI 0.2.1 modules.
var envoyEnv = map[string]envFunc{
	"proxy_log":                          {params(3), status, envLog},
	"proxy_get_log_level":                {params(1), status, envGetLogLevel},
	"proxy_get_status":                   {params(3), status, unimplemented},
	"proxy_set_property":                 {params(4), status, envSetProperty},
	"proxy_get_property":                 {params(4), status, envGetProperty},
	"proxy_continue_stream":              {params(1), status, envContinueStream},
	"proxy_close_stream":                 {params(1), status, envCloseStream},
	"proxy_send_local_response":          {params(8), status, envSendLocalResponse},
	"proxy_get_shared_data":              {params(5), status, envGetSharedData},
	"proxy_set_shared_data":              {params(5), status, envSetSharedData},
	"proxy_register_shared_queue":        {params(3), status, envRegisterQueue},
	"proxy_resolve_shared_queue":         {params(5), status, envResolveQueue},
	"proxy_dequeue_shared_queue":         {params(3), status, envDequeue},
	"proxy_enqueue_shared_queue":         {params(3), status, envEnqueue},
	"proxy_get_header_map_value":         {params(5), status, envGetHeaderValue},
	"proxy_add_header_map_value":         {params(5), status, envAddHeaderValue},
	"proxy_replace_header_map_value":     {params(5), status, envReplaceHeaderValue},
	"proxy_remove_header_map_value":      {params(3), status, envRemoveHeaderValue},
	"proxy_get_header_map_pairs":         {params(3), status, envGetHeaderPairs},
	"proxy_set_header_map_pairs":         {params(3), status, envSetHeaderPairs},
	"proxy_get_header_map_size":          {params(2), status, envGetHeaderMapSize},
	"proxy_get_buffer_status":            {params(3), status, envGetBufferStatus},
	"proxy_get_buffer_bytes":             {params(5), status, envGetBufferBytes},
	"proxy_set_buffer_bytes":             {params(5), status, envSetBufferBytes},
	"proxy_http_call":                    {params(10), status, envHTTPCall},
	"proxy_grpc_call":                    {params(12), status, unimplemented},
	"proxy_grpc_stream":                  {params(9), status, unimplemented},
	"proxy_grpc_close":                   {params(1), status, unimplemented},
	"proxy_grpc_cancel":                  {params(1), status, unimplemented},
	"proxy_grpc_send":                    {params(4), status, unimplemented},
	"proxy_set_tick_period_milliseconds": {params(1), status, envSetTickPeriod},
	"proxy_get_current_time_nanoseconds": {params(1), status, envGetCurrentTime},
	"proxy_define_metric":                {params(4), status, envDefineMetric},
	"proxy_increment_metric":             {[]api.ValueType{i32, i64}, status, envIncrementMetric},
	"proxy_record_metric":                {[]api.ValueType{i32, i64}, status, envRecordMetric},
	"proxy_get_metric":                   {params(2), status, envGetMetric},
	"proxy_set_effective_context":        {params(1), status, envSetEffectiveContext},
	"proxy_done":                         {nil, status, envDone},
	"proxy_call_foreign_function":        {params(6), status, envCallForeignFunction},
}

func (h *Host) instantiateEnv(ctx context.Context) error {
	b := h.runtime.NewHostModuleBuilder("env")
	for name, f := range envoyEnv {
		b.NewFunctionBuilder().
			WithGoModuleFunction(h.hostFunc(name, f.params, f.fn), f.params, f.results).
			Export(name)
	}
	_, err := b.Instantiate(ctx)
	return err
}

func read(mod api.Module, ptr, size uint64) ([]byte, bool) {
	if size == 0 {
		return nil, true
	}
	b, ok := mod.Memory().Read(uint32(ptr), uint32(size))
	if !ok {
		return nil, false
	}
	return append([]byte(nil), b...), true
}

func readString(mod api.Module, ptr, size uint64) (string, bool) {
	b, ok := read(mod, ptr, size)
	return string(b), ok
}

func envLog(vm *VM, mod api.Module, stack []uint64) {
	if stack[0] > levelCritical {
		stack[0] = statusBadArgument
		return
	}
	msg, ok := readString(mod, stack[1], stack[2])
	if !ok {
		stack[0] = statusInvalidMemoryAccess
		return
	}
	vm.log(int(stack[0]), msg)
	stack[0] = statusOK
}

func envGetLogLevel(_ *VM, mod api.Module, stack []uint64) {
	mod.Memory().WriteUint32Le(uint32(stack[0]), levelTrace)
	stack[0] = statusOK
}

func envSetTickPeriod(vm *VM, _ api.Module, stack []uint64) {
	if vm.active != vm.rootID {
		stack[0] = statusBadArgument
		return
	}
	vm.tickPeriod = time.Duration(uint32(stack[0])) * time.Millisecond
	stack[0] = statusOK
}

func envGetCurrentTime(_ *VM, mod api.Module, stack []uint64) {
	mod.Memory().WriteUint64Le(uint32(stack[0]), uint64(time.Now().UnixNano()))
	stack[0] = statusOK
}

// Properties: the few Envoy attributes a plugin commonly reads.
func envGetProperty(vm *VM, mod api.Module, stack []uint64) {
	path, ok := readString(mod, stack[0], stack[1])
	if !ok {
		stack[0] = statusInvalidMemoryAccess
		return
	}
	var val string
	switch path {
	case "plugin_root_id":
		val = vm.cfg.RootID
	case "plugin_vm_id":
		val = vm.cfg.VMID
	case "upstream\x00address":
		// What Envoy's override-host policy would have picked: the first
		// address of the destination header, once the request went up.
		st := vm.streams[vm.active]
		if st == nil || st.Upstream.Headers == nil {
			stack[0] = statusNotFound
			return
		}
		v, _ := st.Upstream.Header("x-gateway-destination-endpoint")
		if v, _, _ = strings.Cut(v, ","); v == "" {
			stack[0] = statusNotFound
			return
		}
		val = v
	default:
		st := vm.streams[vm.active]
		if st == nil || !strings.HasPrefix(path, "request\x00") {
			stack[0] = statusNotFound
			return
		}
		v, found := st.reqHeaders.get(":" + strings.TrimPrefix(path, "request\x00"))
		if !found {
			stack[0] = statusNotFound
			return
		}
		val = v
	}
	stack[0] = uint64(vm.copyOut(mod, []byte(val), uint32(stack[2]), uint32(stack[3])))
}

func envSetProperty(_ *VM, _ api.Module, stack []uint64) { stack[0] = statusOK }

func envCallForeignFunction(vm *VM, mod api.Module, stack []uint64) {
	name, ok := readString(mod, stack[0], stack[1])
	if !ok {
		stack[0] = statusInvalidMemoryAccess
		return
	}
	if name != "clear_route_cache" {
		stack[0] = statusNotFound
		return
	}
	stack[0] = uint64(vm.copyOut(mod, nil, uint32(stack[4]), uint32(stack[5])))
}

func envSetEffectiveContext(vm *VM, _ api.Module, stack []uint64) {
	id := uint32(stack[0])
	if _, ok := vm.streams[id]; !ok && id != vm.rootID {
		stack[0] = statusBadArgument
		return
	}
	vm.active = id
	stack[0] = statusOK
}

func envDone(_ *VM, _ api.Module, stack []uint64) { stack[0] = statusOK }

// Header maps.

func (vm *VM) headerMap(kind uint64) *headerMap {
	if kind == mapCallResponseHeaders || kind == mapCallResponseTrail {
		if vm.callResponse == nil {
			return nil
		}
		if kind == mapCallResponseHeaders {
			return &vm.callResponse.headers
		}
		return &vm.callResponse.trailers
	}
	st := vm.streams[vm.active]
	if st == nil {
		return nil
	}
	switch kind {
	case mapRequestHeaders:
		return st.reqHeaders.orNil()
	case mapRequestTrailers:
		return st.reqTrailers.orNil()
	case mapResponseHeaders:
		return st.respHeaders.orNil()
	case mapResponseTrailers:
		return st.respTrailers.orNil()
	}
	return nil
}

func envGetHeaderValue(vm *VM, mod api.Module, stack []uint64) {
	m := vm.headerMap(stack[0])
	key, ok := readString(mod, stack[1], stack[2])
	if !ok {
		stack[0] = statusInvalidMemoryAccess
		return
	}
	if m == nil {
		stack[0] = statusNotFound
		return
	}
	v, found := m.get(key)
	if !found {
		stack[0] = statusNotFound
		return
	}
	stack[0] = uint64(vm.copyOut(mod, []byte(v), uint32(stack[3]), uint32(stack[4])))
}

func headerEdit(stack []uint64, vm *VM, mod api.Module, edit func(m *headerMap, key, value string)) {
	m := vm.headerMap(stack[0])
	key, ok1 := readString(mod, stack[1], stack[2])
	var value string
	ok2 := true
	if edit != nil && len(stack) >= 5 {
		value, ok2 = readString(mod, stack[3], stack[4])
	}
	if !ok1 || !ok2 {
		stack[0] = statusInvalidMemoryAccess
		return
	}
	if m == nil {
		stack[0] = statusBadArgument
		return
	}
	edit(m, key, value)
	stack[0] = statusOK
}

func envAddHeaderValue(vm *VM, mod api.Module, stack []uint64) {
	headerEdit(stack, vm, mod, (*headerMap).add)
}

func envReplaceHeaderValue(vm *VM, mod api.Module, stack []uint64) {
	headerEdit(stack, vm, mod, (*headerMap).replace)
}

func envRemoveHeaderValue(vm *VM, mod api.Module, stack []uint64) {
	headerEdit(stack, vm, mod, func(m *headerMap, key, _ string) { m.remove(key) })
}

func envGetHeaderPairs(vm *VM, mod api.Module, stack []uint64) {
	m := vm.headerMap(stack[0])
	if m == nil {
		stack[0] = statusNotFound
		return
	}
	stack[0] = uint64(vm.copyOut(mod, marshalPairs(m.pairs), uint32(stack[1]), uint32(stack[2])))
}

func envGetHeaderMapSize(vm *VM, mod api.Module, stack []uint64) {
	m := vm.headerMap(stack[0])
	if m == nil {
		stack[0] = statusNotFound
		return
	}
	mod.Memory().WriteUint32Le(uint32(stack[1]), uint32(len(marshalPairs(m.pairs))))
	stack[0] = statusOK
}

func envSetHeaderPairs(vm *VM, mod api.Module, stack []uint64) {
	m := vm.headerMap(stack[0])
	data, ok := read(mod, stack[1], stack[2])
	if !ok {
		stack[0] = statusInvalidMemoryAccess
		return
	}
	if m == nil {
		stack[0] = statusBadArgument
		return
	}
	m.pairs = nil
	for _, p := range unmarshalPairs(data) {
		m.add(p[0], p[1])
	}
	stack[0] = statusOK
}

// Buffers.

func (vm *VM) buffer(kind uint64) (*[]byte, bool) {
	switch kind {
	case bufVMConfiguration:
		return &vm.cfg.VMConfiguration, vm.vmConfigVisible
	case bufPluginConfiguration:
		return &vm.cfg.PluginConfiguration, vm.pluginConfigVisible
	case bufHTTPCallResponseBody:
		if vm.callResponse == nil {
			return nil, false
		}
		return &vm.callResponse.Body, true
	}
	st := vm.streams[vm.active]
	if st == nil {
		return nil, false
	}
	switch kind {
	case bufHTTPRequestBody:
		return &st.reqBody, st.reqBodyVisible
	case bufHTTPResponseBody:
		return &st.respBody, st.respBodyVisible
	}
	return nil, false
}

func envGetBufferStatus(vm *VM, mod api.Module, stack []uint64) {
	if stack[0] >= bufMax {
		stack[0] = statusBadArgument
		return
	}
	b, ok := vm.buffer(stack[0])
	if !ok {
		stack[0] = statusNotFound
		return
	}
	mod.Memory().WriteUint32Le(uint32(stack[1]), uint32(len(*b)))
	mod.Memory().WriteUint32Le(uint32(stack[2]), 0)
	stack[0] = statusOK
}

// envGetBufferBytes clips the window to the buffer like cpp-host and
// writes nothing at all for an empty window.
func envGetBufferBytes(vm *VM, mod api.Module, stack []uint64) {
	if stack[0] >= bufMax {
		stack[0] = statusBadArgument
		return
	}
	b, ok := vm.buffer(stack[0])
	if !ok {
		stack[0] = statusNotFound
		return
	}
	start, length := uint64(uint32(stack[1])), uint64(uint32(stack[2]))
	if start > uint64(len(*b)) {
		stack[0] = statusBadArgument
		return
	}
	if start+length > uint64(len(*b)) {
		length = uint64(len(*b)) - start
	}
	if length == 0 {
		stack[0] = statusOK
		return
	}
	stack[0] = uint64(vm.copyOut(mod, (*b)[start:start+length], uint32(stack[3]), uint32(stack[4])))
}

func envSetBufferBytes(vm *VM, mod api.Module, stack []uint64) {
	if stack[0] >= bufMax {
		stack[0] = statusBadArgument
		return
	}
	b, ok := vm.buffer(stack[0])
	data, ok2 := read(mod, stack[3], stack[4])
	if !ok2 {
		stack[0] = statusInvalidMemoryAccess
		return
	}
	if !ok {
		stack[0] = statusNotFound
		return
	}
	start, size := int(uint32(stack[1])), int(uint32(stack[2]))
	switch {
	case start == 0 && size == 0: // prepend
		*b = append(data, *b...)
	case start >= len(*b): // append
		*b = append(*b, data...)
	case start == 0 && size >= len(*b): // replace
		*b = data
	default:
		stack[0] = statusBadArgument
		return
	}
	stack[0] = statusOK
}

// Shared data and queues.

func envGetSharedData(vm *VM, mod api.Module, stack []uint64) {
	key, ok := readString(mod, stack[0], stack[1])
	if !ok {
		stack[0] = statusInvalidMemoryAccess
		return
	}
	h := vm.host
	h.mu.Lock()
	v, found := h.shared[vm.cfg.VMID][key]
	var data []byte
	var cas uint32
	if found {
		data, cas = v.data, v.cas
	}
	h.mu.Unlock()
	if !found {
		stack[0] = statusNotFound
		return
	}
	if st := vm.copyOut(mod, data, uint32(stack[2]), uint32(stack[3])); st != statusOK {
		stack[0] = uint64(st)
		return
	}
	mod.Memory().WriteUint32Le(uint32(stack[4]), cas)
	stack[0] = statusOK
}

func envSetSharedData(vm *VM, mod api.Module, stack []uint64) {
	key, ok1 := readString(mod, stack[0], stack[1])
	val, ok2 := read(mod, stack[2], stack[3])
	if !ok1 || !ok2 {
		stack[0] = statusInvalidMemoryAccess
		return
	}
	vm.host.mu.Lock()
	stack[0] = uint64(vm.host.setShared(vm.cfg.VMID, key, val, uint32(stack[4])))
	vm.host.mu.Unlock()
}

func envRegisterQueue(vm *VM, mod api.Module, stack []uint64) {
	name, ok := readString(mod, stack[0], stack[1])
	if !ok {
		stack[0] = statusInvalidMemoryAccess
		return
	}
	h := vm.host
	h.mu.Lock()
	k := queueKey{vm.cfg.VMID, name}
	q, found := h.queues[k]
	if !found {
		q = &queue{key: k}
		q.id = h.queueIDs.add(q)
		h.queues[k] = q
	}
	q.owner = vm
	id := q.id
	h.mu.Unlock()
	mod.Memory().WriteUint32Le(uint32(stack[2]), id)
	stack[0] = statusOK
}

func envResolveQueue(vm *VM, mod api.Module, stack []uint64) {
	vmID, ok1 := readString(mod, stack[0], stack[1])
	name, ok2 := readString(mod, stack[2], stack[3])
	if !ok1 || !ok2 {
		stack[0] = statusInvalidMemoryAccess
		return
	}
	if vmID == "" {
		vmID = vm.cfg.VMID
	}
	h := vm.host
	h.mu.Lock()
	q, found := h.queues[queueKey{vmID, name}]
	var id uint32
	if found {
		id = q.id
	}
	h.mu.Unlock()
	if !found {
		stack[0] = statusNotFound
		return
	}
	mod.Memory().WriteUint32Le(uint32(stack[4]), id)
	stack[0] = statusOK
}

func envEnqueue(vm *VM, mod api.Module, stack []uint64) {
	val, ok := read(mod, stack[1], stack[2])
	if !ok {
		stack[0] = statusInvalidMemoryAccess
		return
	}
	h := vm.host
	h.mu.Lock()
	q := h.queueIDs.get(stack[0])
	if q != nil {
		q.items = append(q.items, val)
		if q.owner != nil {
			q.owner.readyQueues = append(q.owner.readyQueues, uint32(stack[0]))
		}
	}
	h.mu.Unlock()
	if q == nil {
		stack[0] = statusNotFound
		return
	}
	stack[0] = statusOK
}

func envDequeue(vm *VM, mod api.Module, stack []uint64) {
	h := vm.host
	h.mu.Lock()
	q := h.queueIDs.get(stack[0])
	var item []byte
	empty := true
	if q != nil && len(q.items) > 0 {
		item, q.items, empty = q.items[0], q.items[1:], false
	}
	h.mu.Unlock()
	switch {
	case q == nil:
		stack[0] = statusNotFound
	case empty:
		stack[0] = statusEmpty
	default:
		stack[0] = uint64(vm.copyOut(mod, item, uint32(stack[1]), uint32(stack[2])))
	}
}

// Metrics: one value per name for the whole host, like Envoy stats.

func envDefineMetric(vm *VM, mod api.Module, stack []uint64) {
	kind := uint32(stack[0])
	name, ok := readString(mod, stack[1], stack[2])
	if !ok {
		stack[0] = statusInvalidMemoryAccess
		return
	}
	if kind > 2 {
		stack[0] = statusBadArgument
		return
	}
	h := vm.host
	h.mu.Lock()
	m, found := h.metrics[name]
	if !found {
		m = &metric{name: name, kind: kind}
		m.id = h.metricIDs.add(m)
		h.metrics[name] = m
	}
	id := m.id
	h.mu.Unlock()
	mod.Memory().WriteUint32Le(uint32(stack[3]), id)
	stack[0] = statusOK
}

func envIncrementMetric(vm *VM, _ api.Module, stack []uint64) {
	h := vm.host
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.metricIDs.get(stack[0])
	delta := int64(stack[1])
	switch {
	case m == nil:
		stack[0] = statusNotFound
	case m.kind == 0 && delta < 0:
		stack[0] = statusBadArgument
	case m.kind == 2:
		stack[0] = statusBadArgument
	default:
		m.value += delta
		stack[0] = statusOK
	}
}

func envRecordMetric(vm *VM, _ api.Module, stack []uint64) {
	h := vm.host
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.metricIDs.get(stack[0])
	if m == nil {
		stack[0] = statusNotFound
		return
	}
	m.value = int64(stack[1])
	stack[0] = statusOK
}

func envGetMetric(vm *VM, mod api.Module, stack []uint64) {
	h := vm.host
	h.mu.Lock()
	m := h.metricIDs.get(stack[0])
	var v int64
	if m != nil {
		v = m.value
	}
	h.mu.Unlock()
	if m == nil {
		stack[0] = statusNotFound
		return
	}
	mod.Memory().WriteUint64Le(uint32(stack[1]), uint64(v))
	stack[0] = statusOK
}
