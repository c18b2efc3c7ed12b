package proxywasm

import (
	"testing"

	"github.com/kvroute/kvroute/filter/proxywasm/types"
)

type testVM struct {
	types.DefaultVMContext
	plugin *testPlugin
}

func (v testVM) NewPluginContext(uint32) types.PluginContext { return v.plugin }

type testPlugin struct {
	types.DefaultPluginContext
	panicOnStart bool
	streams      []*testStream
}

func (p *testPlugin) OnPluginStart(int) types.OnPluginStartStatus {
	if p.panicOnStart {
		panic("bad configuration path")
	}
	return types.OnPluginStartStatusOK
}

func (p *testPlugin) NewHttpContext(uint32) types.HttpContext {
	s := &testStream{}
	p.streams = append(p.streams, s)
	return s
}

type testStream struct {
	types.DefaultHttpContext
	headerCalls, bodyCalls, doneCalls int
	panicInHeaders, panicInDone       bool
}

func (s *testStream) OnHttpRequestHeaders(int, bool) types.Action {
	s.headerCalls++
	if s.panicInHeaders {
		var m map[string]int
		//lint:ignore SA5000 the point: a real runtime panic, not a string
		m["boom"]++
	}
	return types.ActionPause
}

func (s *testStream) OnHttpRequestBody(int, bool) types.Action {
	s.bodyCalls++
	return types.ActionPause
}

func (s *testStream) OnHttpStreamDone() {
	s.doneCalls++
	if s.panicInDone {
		panic("done")
	}
}

func withVM(t *testing.T, p *testPlugin) {
	t.Helper()
	saved := current
	current = newState()
	SetVMContext(testVM{plugin: p})
	t.Cleanup(func() { current = saved })
}

func requestHeaders(id uint32) uint32 {
	return streamAction("test", id, func(h types.HttpContext) types.Action { return h.OnHttpRequestHeaders(0, false) })
}

func requestBody(id uint32) uint32 {
	return streamAction("test", id, func(h types.HttpContext) types.Action { return h.OnHttpRequestBody(0, true) })
}

func TestPanickingStreamFallsBackToPassThrough(t *testing.T) {
	p := &testPlugin{}
	withVM(t, p)
	onContextCreate(1, 0)
	if onConfigure(1, 0) != 1 {
		t.Fatal("configure failed")
	}
	onContextCreate(2, 1)
	p.streams[0].panicInHeaders = true
	if got := requestHeaders(2); got != uint32(types.ActionContinue) {
		t.Errorf("panicking headers callback returned %d, want Continue", got)
	}
	if got := requestBody(2); got != uint32(types.ActionContinue) || p.streams[0].bodyCalls != 0 {
		t.Errorf("after a panic the stream's context was called again (action %d, body calls %d)", got, p.streams[0].bodyCalls)
	}
	// Other streams of the VM are unaffected.
	onContextCreate(3, 1)
	if got := requestHeaders(3); got != uint32(types.ActionPause) {
		t.Errorf("healthy stream returned %d, want Pause", got)
	}
}

func TestStreamDoneRunsOnceHoweverTheStreamEnds(t *testing.T) {
	p := &testPlugin{}
	withVM(t, p)
	onContextCreate(1, 0)
	onConfigure(1, 0)
	onContextCreate(2, 1) // ends normally: log, then delete
	onContextCreate(3, 1) // reset: delete without log
	onContextCreate(4, 1) // its done callback panics
	p.streams[2].panicInDone = true
	onLog(2)
	onDelete(2)
	onDelete(3)
	onLog(4)
	onDelete(4)
	for i, s := range p.streams {
		if s.doneCalls != 1 {
			t.Errorf("stream %d: OnHttpStreamDone ran %d times, want 1", i+2, s.doneCalls)
		}
	}
	if len(current.streams) != 0 {
		t.Errorf("%d streams still registered after delete", len(current.streams))
	}
}

func TestPanickingConfigureRejectsConfiguration(t *testing.T) {
	withVM(t, &testPlugin{panicOnStart: true})
	onContextCreate(1, 0)
	if onConfigure(1, 0) != 0 {
		t.Error("a panicking OnPluginStart was accepted")
	}
}

func TestArenaAllocation(t *testing.T) {
	enter()
	defer leave()
	a := allocate(10)
	b := allocate(3)
	if !inArena(a) || !inArena(b) {
		t.Fatal("small allocations did not come from the arena")
	}
	dst := make([]byte, 1<<20)
	reserve(dst)
	if p := allocate(1 << 19); p != &dst[0] {
		t.Error("a reserved buffer was not used for an allocation that fits")
	}
	if p := allocate(1 << 20); inArena(p) || p == &dst[0] {
		t.Error("an allocation larger than the arena must spill to the heap, and a reservation serves once")
	}
	if got := owned(a, 10); &got[0] == a {
		t.Error("owned returned arena memory that the next callback will overwrite")
	}
}
