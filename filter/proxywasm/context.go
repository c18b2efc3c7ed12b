// Package proxywasm is kvroute's binding of the proxy-wasm ABI 0.2.1 for
// standard Go (GOOS=wasip1, -buildmode=c-shared). Its surface follows
// github.com/proxy-wasm/proxy-wasm-go-sdk: register a types.VMContext with
// SetVMContext in init, and call the hostcall functions of this package from
// the contexts' callbacks.
//
// Unlike the SDK, every callback recovers from panics: a Go panic would
// otherwise abort the VM and take routing down for a whole Envoy worker. A
// panicking HTTP context is logged, dropped, and its stream continues as if
// the filter were absent.
package proxywasm

import (
	"strconv"

	"github.com/kvroute/kvroute/filter/proxywasm/types"
)

type pluginState struct {
	ctx      types.PluginContext
	callouts map[uint32]func(numHeaders, bodySize, numTrailers int)
}

type streamState struct {
	ctx  types.HttpContext
	root uint32
	done bool // OnHttpStreamDone has run
}

// state is the VM's registry of contexts; the host drives one VM from one
// thread, so it needs no locking.
type state struct {
	vm      types.VMContext
	plugins map[uint32]*pluginState
	streams map[uint32]*streamState
	// active is the context whose callback is running, so hostcalls that
	// belong to a plugin (DispatchHttpCall) can find it.
	active uint32
}

var current = newState()

func newState() *state {
	return &state{plugins: map[uint32]*pluginState{}, streams: map[uint32]*streamState{}}
}

// SetVMContext registers the VM context. Call it from init: the host has not
// started the VM yet, and no hostcall other than logging is allowed there.
func SetVMContext(ctx types.VMContext) { current.vm = ctx }

func (s *state) rootOf(id uint32) (*pluginState, bool) {
	if p, ok := s.plugins[id]; ok {
		return p, true
	}
	if st, ok := s.streams[id]; ok {
		p, ok := s.plugins[st.root]
		return p, ok
	}
	return nil, false
}

// guard runs a callback body with the arena and panic bookkeeping every
// host-to-module call needs. It reports whether fn completed.
func guard(where string, contextID uint32, fn func()) (ok bool) {
	enter()
	prev := current.active
	current.active = contextID
	defer func() {
		current.active = prev
		if r := recover(); r != nil {
			ok = false
			LogCritical("kvroute: recovered panic in " + where + " (context " +
				strconv.FormatUint(uint64(contextID), 10) + "): " + panicText(r))
			if st, found := current.streams[contextID]; found {
				// The context may be half-updated: stop calling it and let the
				// stream go on without the filter.
				st.ctx = types.DefaultHttpContext{}
			}
		}
		leave()
	}()
	fn()
	return true
}

func panicText(r any) string {
	switch v := r.(type) {
	case string:
		return v
	case error:
		return v.Error()
	}
	return "non-error panic value"
}

func onContextCreate(contextID, parentID uint32) {
	guard("proxy_on_context_create", contextID, func() {
		if parentID == 0 {
			if current.vm == nil {
				return
			}
			current.plugins[contextID] = &pluginState{
				ctx:      current.vm.NewPluginContext(contextID),
				callouts: map[uint32]func(int, int, int){},
			}
			return
		}
		root, ok := current.plugins[parentID]
		if !ok || root.ctx == nil {
			return
		}
		if h := root.ctx.NewHttpContext(contextID); h != nil {
			current.streams[contextID] = &streamState{ctx: h, root: parentID}
		}
	})
}

func onVMStart(rootID, size uint32) uint32 {
	started := false
	ok := guard("proxy_on_vm_start", rootID, func() {
		if current.vm != nil {
			started = bool(current.vm.OnVMStart(int(size)))
		}
	})
	return boolWord(ok && started)
}

func onConfigure(rootID, size uint32) uint32 {
	configured := false
	ok := guard("proxy_on_configure", rootID, func() {
		if p, found := current.plugins[rootID]; found && p.ctx != nil {
			configured = bool(p.ctx.OnPluginStart(int(size)))
		}
	})
	return boolWord(ok && configured)
}

func onTick(rootID uint32) {
	guard("proxy_on_tick", rootID, func() {
		if p, ok := current.plugins[rootID]; ok {
			p.ctx.OnTick()
		}
	})
}

func onQueueReady(rootID, queueID uint32) {
	guard("proxy_on_queue_ready", rootID, func() {
		if p, ok := current.plugins[rootID]; ok {
			p.ctx.OnQueueReady(queueID)
		}
	})
}

func onHttpCallResponse(rootID, calloutID, numHeaders, bodySize, numTrailers uint32) {
	guard("proxy_on_http_call_response", rootID, func() {
		p, ok := current.plugins[rootID]
		if !ok {
			return
		}
		cb := p.callouts[calloutID]
		delete(p.callouts, calloutID)
		if cb != nil {
			cb(int(numHeaders), int(bodySize), int(numTrailers))
		}
	})
}

// streamAction runs an HTTP callback and turns a panic into ActionContinue.
func streamAction(where string, contextID uint32, fn func(types.HttpContext) types.Action) uint32 {
	action := types.ActionContinue
	guard(where, contextID, func() {
		if st, ok := current.streams[contextID]; ok {
			action = fn(st.ctx)
		}
	})
	return uint32(action)
}

func onDone(contextID uint32) uint32 {
	done := true
	guard("proxy_on_done", contextID, func() {
		if p, ok := current.plugins[contextID]; ok {
			done = p.ctx.OnPluginDone()
		}
	})
	return boolWord(done)
}

func onLog(contextID uint32) {
	guard("proxy_on_log", contextID, func() { streamDone(contextID) })
}

// onDelete also finishes a stream whose proxy_on_log never came, so that
// per-stream accounting is released however the stream ended.
func onDelete(contextID uint32) {
	guard("proxy_on_delete", contextID, func() {
		defer delete(current.streams, contextID)
		delete(current.plugins, contextID)
		streamDone(contextID)
	})
}

func streamDone(contextID uint32) {
	if st, ok := current.streams[contextID]; ok && !st.done {
		st.done = true
		st.ctx.OnHttpStreamDone()
	}
}

func boolWord(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}
