package wasmhost

import (
	"time"

	"github.com/tetratelabs/wazero/api"
)

// Callout is an HTTP call the module dispatched with proxy_http_call.
type Callout struct {
	ID      uint32
	Cluster string
	Headers [][2]string
	Body    []byte
	Timeout time.Duration
}

// Header returns the first value of a callout request header.
func (c *Callout) Header(key string) string {
	m := headerMap{pairs: c.Headers}
	v, _ := m.get(key)
	return v
}

// CalloutResponse is what a cluster answered. Fail reports a failed call
// (reset, timeout, no healthy upstream): the module sees zero headers.
type CalloutResponse struct {
	Headers  [][2]string
	Body     []byte
	Trailers [][2]string
	Fail     bool

	headers, trailers headerMap
}

func envHTTPCall(vm *VM, mod api.Module, stack []uint64) {
	cluster, ok1 := readString(mod, stack[0], stack[1])
	hdrs, ok2 := read(mod, stack[2], stack[3])
	body, ok3 := read(mod, stack[4], stack[5])
	_, ok4 := read(mod, stack[6], stack[7])
	if !ok1 || !ok2 || !ok3 || !ok4 {
		stack[0] = statusInvalidMemoryAccess
		return
	}
	if _, known := vm.cfg.Clusters[cluster]; !known {
		stack[0] = statusBadArgument
		return
	}
	h := headerMap{pairs: unmarshalPairs(hdrs)}
	for _, required := range []string{":method", ":path", ":authority"} {
		if _, found := h.get(required); !found {
			stack[0] = statusBadArgument
			return
		}
	}
	vm.nextCallout++
	c := &Callout{ID: vm.nextCallout, Cluster: cluster, Headers: h.pairs, Body: body,
		Timeout: time.Duration(uint32(stack[8])) * time.Millisecond}
	vm.callouts = append(vm.callouts, c)
	mod.Memory().WriteUint32Le(uint32(stack[9]), c.ID)
	stack[0] = statusOK
}

// PendingCallouts returns the calls dispatched and not yet answered.
func (vm *VM) PendingCallouts() []*Callout { return append([]*Callout(nil), vm.callouts...) }

// DeliverCallouts answers every pending call through its cluster's handler
// and runs proxy_on_http_call_response for each, as Envoy does when the
// responses arrive. It returns how many it delivered.
func (vm *VM) DeliverCallouts() int {
	pending := vm.callouts
	vm.callouts = nil
	for _, c := range pending {
		resp := vm.cfg.Clusters[c.Cluster](c)
		vm.respond(c, resp)
	}
	return len(pending)
}

func (vm *VM) respond(c *Callout, resp CalloutResponse) {
	nh, nt := len(resp.Headers), len(resp.Trailers)
	if resp.Fail {
		nh, nt, resp.Body = 0, 0, nil
	}
	resp.headers = newHeaderMap(resp.Headers)
	resp.trailers = newHeaderMap(resp.Trailers)
	vm.callResponse = &resp
	vm.withContext(vm.rootID, func() {
		vm.call("proxy_on_http_call_response", uint64(vm.rootID), uint64(c.ID), uint64(nh), uint64(len(resp.Body)), uint64(nt))
	})
	vm.callResponse = nil
}

// DeliverQueues runs proxy_on_queue_ready for every enqueue on a queue this
// VM registered.
func (vm *VM) DeliverQueues() int {
	vm.host.mu.Lock()
	ready := vm.readyQueues
	vm.readyQueues = nil
	vm.host.mu.Unlock()
	for _, id := range ready {
		vm.withContext(vm.rootID, func() {
			vm.call("proxy_on_queue_ready", uint64(vm.rootID), uint64(id))
		})
	}
	return len(ready)
}
