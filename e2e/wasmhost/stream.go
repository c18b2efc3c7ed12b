package wasmhost

import (
	"github.com/tetratelabs/wazero/api"
)

// Action is what a stream callback returned.
type Action uint32

// Actions of ABI 0.2.1.
const (
	Continue Action = 0
	Pause    Action = 1
)

type reqState int

const (
	reqStart       reqState = iota
	reqHeadersHeld          // paused in headers: StopIteration, body callbacks still come
	reqAllStopped           // paused in headers: StopAllIteration, nothing comes until continue
	reqHeadersSent          // headers have gone on to the router
)

// Forwarded is what passed the filter towards the upstream (or, for a
// response, towards the client): it is what the next filter sees.
type Forwarded struct {
	Headers [][2]string // nil until the headers have passed
	Body    []byte
	Ended   bool
}

// Header returns the first value of a forwarded header.
func (f *Forwarded) Header(key string) (string, bool) {
	m := headerMap{pairs: f.Headers}
	return m.get(key)
}

// LocalResponse is a reply the filter sent with proxy_send_local_response.
type LocalResponse struct {
	Status  uint32
	Body    []byte
	Headers [][2]string
}

// Stream drives one HTTP stream through a VM in Envoy's order.
type Stream struct {
	vm *VM
	id uint32

	reqHeaders, reqTrailers   headerMap
	respHeaders, respTrailers headerMap
	reqBody, respBody         []byte
	reqBodyVisible            bool
	respBodyVisible           bool
	req                       reqState
	reqEnded                  bool

	// Upstream is what the router would send to the engine.
	Upstream Forwarded
	// Downstream is what the client would receive.
	Downstream Forwarded
	// Local is set if the filter answered the request itself.
	Local  *LocalResponse
	closed bool
}

// NewStream creates a stream context under the VM's root context.
func (vm *VM) NewStream() *Stream {
	s := &Stream{vm: vm, id: vm.newID()}
	vm.streams[s.id] = s
	vm.call("proxy_on_context_create", uint64(s.id), uint64(vm.rootID))
	return s
}

// ID is the stream's context id.
func (s *Stream) ID() uint32 { return s.id }

func (s *Stream) callback(name string, args ...uint64) Action {
	var res uint64
	s.vm.withContext(s.id, func() {
		res, _ = s.vm.call(name, append([]uint64{uint64(s.id)}, args...)...)
	})
	if s.vm.err != nil {
		// A failed VM leaves the stream to Envoy's failure policy; the test
		// checks VM.Err.
		return Continue
	}
	return Action(res)
}

func boolArg(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// SendRequestHeaders delivers the request headers.
func (s *Stream) SendRequestHeaders(headers [][2]string, endOfStream bool) Action {
	s.reqHeaders = newHeaderMap(headers)
	s.reqEnded = endOfStream
	act := s.callback("proxy_on_request_headers", uint64(len(headers)), boolArg(endOfStream))
	switch {
	case act == Continue:
		s.sendRequestHeaders()
	case s.vm.cfg.AllowOnHeadersStopIteration:
		s.req = reqHeadersHeld
	default:
		s.req = reqAllStopped
	}
	return act
}

func (s *Stream) sendRequestHeaders() {
	if s.req == reqHeadersSent {
		return
	}
	s.req = reqHeadersSent
	s.Upstream.Headers = s.reqHeaders.clone()
	if s.reqEnded && len(s.reqBody) == 0 {
		s.Upstream.Ended = true
	}
}

// SendRequestBody delivers one chunk of the request body. While the filter
// buffers (it paused), the callback sees the whole buffered body.
func (s *Stream) SendRequestBody(chunk []byte, endOfStream bool) Action {
	s.reqBody = append(s.reqBody, chunk...)
	s.reqEnded = endOfStream
	if s.req == reqAllStopped || s.Local != nil {
		return Pause
	}
	return s.deliverRequestBody()
}

func (s *Stream) deliverRequestBody() Action {
	s.reqBodyVisible = true
	act := s.callback("proxy_on_request_body", uint64(len(s.reqBody)), boolArg(s.reqEnded))
	s.reqBodyVisible = false
	if act == Continue {
		s.forwardRequestBody()
	}
	return act
}

func (s *Stream) forwardRequestBody() {
	s.sendRequestHeaders()
	s.Upstream.Body = append(s.Upstream.Body, s.reqBody...)
	s.reqBody = nil
	if s.reqEnded {
		s.Upstream.Ended = true
	}
}

// SendRequestTrailers delivers request trailers (and ends the request).
func (s *Stream) SendRequestTrailers(trailers [][2]string) Action {
	s.reqTrailers = newHeaderMap(trailers)
	s.reqEnded = true
	if s.req == reqAllStopped {
		return Pause
	}
	act := s.callback("proxy_on_request_trailers", uint64(len(trailers)))
	if act == Continue {
		s.forwardRequestBody()
	}
	return act
}

// continueRequest is proxy_continue_stream(HTTP_REQUEST), run after the VM
// call that asked for it. After StopAllIteration Envoy passes the headers on
// first and then re-runs the stopped filter's body callback on what it
// buffered; otherwise headers and buffered body go on together.
func (s *Stream) continueRequest() {
	switch s.req {
	case reqAllStopped:
		s.sendRequestHeaders()
		if len(s.reqBody) > 0 || s.reqEnded {
			s.deliverRequestBody()
		}
	default:
		s.forwardRequestBody()
	}
}

// SendResponseHeaders delivers the upstream's response headers.
func (s *Stream) SendResponseHeaders(headers [][2]string, endOfStream bool) Action {
	s.respHeaders = newHeaderMap(headers)
	act := s.callback("proxy_on_response_headers", uint64(len(headers)), boolArg(endOfStream))
	if act == Continue {
		s.Downstream.Headers = s.respHeaders.clone()
		s.Downstream.Ended = endOfStream
	}
	return act
}

// SendResponseBody delivers one chunk of the response body.
func (s *Stream) SendResponseBody(chunk []byte, endOfStream bool) Action {
	s.respBody = append(s.respBody, chunk...)
	s.respBodyVisible = true
	act := s.callback("proxy_on_response_body", uint64(len(s.respBody)), boolArg(endOfStream))
	s.respBodyVisible = false
	if act == Continue {
		if s.Downstream.Headers == nil {
			s.Downstream.Headers = s.respHeaders.clone()
		}
		s.Downstream.Body = append(s.Downstream.Body, s.respBody...)
		s.respBody = nil
		s.Downstream.Ended = endOfStream
	}
	return act
}

// Close ends the stream as Envoy does, whether it completed or was reset:
// proxy_on_done, proxy_on_log, proxy_on_delete.
func (s *Stream) Close() {
	if s.closed {
		return
	}
	s.closed = true
	s.callback("proxy_on_done")
	s.callback("proxy_on_log")
	s.callback("proxy_on_delete")
	delete(s.vm.streams, s.id)
}

// The hostcalls that act on a stream.

const (
	streamRequest  = 0
	streamResponse = 1
)

func envContinueStream(vm *VM, _ api.Module, stack []uint64) {
	s := vm.streams[vm.active]
	if s == nil {
		stack[0] = statusNotFound
		return
	}
	switch stack[0] {
	case streamRequest:
		vm.after = append(vm.after, s.continueRequest)
	case streamResponse:
	default:
		stack[0] = statusBadArgument
		return
	}
	stack[0] = statusOK
}

func envCloseStream(vm *VM, _ api.Module, stack []uint64) {
	s := vm.streams[vm.active]
	if s == nil {
		stack[0] = statusNotFound
		return
	}
	vm.after = append(vm.after, s.Close)
	stack[0] = statusOK
}

func envSendLocalResponse(vm *VM, mod api.Module, stack []uint64) {
	s := vm.streams[vm.active]
	body, ok1 := read(mod, stack[3], stack[4])
	hdrs, ok2 := read(mod, stack[5], stack[6])
	if !ok1 || !ok2 {
		stack[0] = statusInvalidMemoryAccess
		return
	}
	if s == nil || s.Downstream.Headers != nil {
		stack[0] = statusBadArgument
		return
	}
	local := &LocalResponse{Status: uint32(stack[0]), Body: body, Headers: unmarshalPairs(hdrs)}
	vm.after = append(vm.after, func() {
		s.Local = local
		s.req = reqHeadersSent // nothing more goes upstream
	})
	stack[0] = statusOK
}
