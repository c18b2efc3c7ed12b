// Command filter is kvroute's proxy-wasm HTTP filter: it reads an
// OpenAI-style request body, hashes the prompt into blocks, picks the
// endpoint holding the longest cached prefix until it saturates ("sticky
// until saturated", shared/policy), and sets it in
// x-gateway-destination-endpoint for Envoy's override-host load balancing.
//
// Build it with GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared.
package main

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/filter/internal/inflight"
	"github.com/kvroute/kvroute/filter/internal/placed"
	"github.com/kvroute/kvroute/filter/proxywasm"
	"github.com/kvroute/kvroute/filter/proxywasm/types"
	"github.com/kvroute/kvroute/shared/predict"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/report"
)

func main() {}

func init() { proxywasm.SetVMContext(vmContext{}) }

type vmContext struct{ types.DefaultVMContext }

func (vmContext) NewPluginContext(uint32) types.PluginContext { return &pluginContext{} }

// pluginContext is one worker VM's root context.
type pluginContext struct {
	types.DefaultPluginContext
	cfg     config
	router  *router
	sync    *syncer
	load    loadTracker
	m       *stats
	runtime *runtimeStats
	streams uint64
	// held are the streams paused in their request headers, waiting for
	// the body, by context id.
	held map[uint32]*httpContext
	// prefilling are the non-streamed requests whose prefill is still
	// counted as load, by context id (httpContext.prefillDue).
	prefilling map[uint32]*httpContext
	// body, named and record are reused across this VM's requests.
	body   []byte
	named  []byte
	record []byte
}

// runtimeStatsEvery is how many streams pass between runtime-stat updates.
const runtimeStatsEvery = 64

// upstreamAddress is the property naming the endpoint that served a request,
// after any retry.
var upstreamAddress = proxywasm.PropertyKey("upstream", "address")

func (p *pluginContext) OnPluginStart(size int) types.OnPluginStartStatus {
	data, err := proxywasm.GetPluginConfiguration()
	if err != nil && size > 0 {
		proxywasm.LogCritical("kvroute: read plugin configuration: " + err.Error())
		return types.OnPluginStartStatusFailed
	}
	if p.cfg, err = parseConfig(data); err != nil {
		proxywasm.LogCritical("kvroute: " + err.Error())
		return types.OnPluginStartStatusFailed
	}
	vm := rand.Uint64()
	if p.router, err = newRouter(p.cfg, vm); err != nil {
		proxywasm.LogCritical("kvroute: " + err.Error())
		return types.OnPluginStartStatusFailed
	}
	p.m = newStats()
	p.runtime = newRuntimeStats()
	p.load = newLoadTracker(vm, max(10*time.Second, 20*p.cfg.syncInterval), p.cfg.sessionTTL, p.cfg.syncInterval)
	p.held = map[uint32]*httpContext{}
	p.prefilling = map[uint32]*httpContext{}
	if p.sync, err = newSyncer(&p.cfg, vm, p.m); err != nil {
		proxywasm.LogCritical("kvroute: " + err.Error())
		return types.OnPluginStartStatusFailed
	}
	if err := proxywasm.SetTickPeriodMilliSeconds(uint32(p.cfg.syncInterval.Milliseconds())); err != nil {
		proxywasm.LogCritical("kvroute: set tick period: " + err.Error())
		return types.OnPluginStartStatusFailed
	}
	return types.OnPluginStartStatusOK
}

// OnTick refreshes the snapshot, beats this VM's in-flight row, gives back
// the prefill of non-streamed requests predicted to be past it, and frees
// requests whose body never began to come.
func (p *pluginContext) OnTick() {
	now := time.Now()
	p.sync.tick(now)
	p.load.change(0, inflight.Counts{})
	p.load.sample(now, p.sync.view.Manifest(), p.cfg.syncInterval)
	for _, h := range p.prefilling {
		if now.After(h.prefillDue) {
			h.givePrefillBack()
		}
	}
	for id, h := range p.held {
		if now.Sub(h.heldSince) < p.cfg.holdTimeout {
			continue
		}
		delete(p.held, id)
		h.routing = false
		p.m.outcomes[fallbackHeldTooLong].Increment(1)
		proxywasm.LogError("kvroute: a request waited " + p.cfg.holdTimeout.String() +
			" for its body; set allow_on_headers_stop_iteration: true in the Wasm PluginConfig")
		if proxywasm.SetEffectiveContext(id) == nil {
			proxywasm.ResumeHttpRequest()
		}
	}
}

func (p *pluginContext) NewHttpContext(id uint32) types.HttpContext {
	if p.streams%runtimeStatsEvery == 0 {
		p.runtime.update()
	}
	p.streams++
	return &httpContext{plugin: p, id: id}
}

type httpContext struct {
	types.DefaultHttpContext
	plugin *pluginContext
	id     uint32
	// routing is set while the filter holds the request to read its body.
	routing   bool
	heldSince time.Time
	decided   bool // the filter routed the request or fell back on it
	decision  decision
	// The load this stream added, released at its first response byte
	// (prefill done) and at its end.
	endpoint       uint64
	prefillPending int64
	requestPending bool
	// The request's own SLOs and whether it may be shed; when it was routed
	// (for the outcome its first byte reports).
	sloTTFT, sloTPOT time.Duration
	sheddable        bool
	subset           []string // from a trusted subset header
	session          uint64   // hash of the session header's value, 0 for none
	contentLength    bool     // the request came with a content-length header
	routedAt         time.Time
	outcomePending   bool
	// prefillDue is when a non-streamed request's prefill is predicted to
	// end. Its first response byte comes with its last token, so the tick
	// gives its prefill back at prefillDue instead (pluginContext.prefilling).
	prefillDue time.Time
	api        prompt.API
	// learning: a Responses API answer is being read for its id, which
	// head gathers, to pin to the endpoint that served it (served).
	learning bool
	head     []byte
	served   uint64
	// streaming: the response is a server-sent event stream, one event per
	// step of the engine whose hash is clock; lastToken is when its last
	// one came (Unix nanoseconds).
	streaming bool
	clock     uint64
	lastToken int64
	// stepLeft and stepLength are the clock of the endpoint as it was when
	// the request was routed (stepLength 0: not known, or not to learn
	// from), for its lead (stepClocks.learn).
	stepLeft, stepLength int64
}

func (h *httpContext) OnHttpRequestHeaders(_ int, endOfStream bool) types.Action {
	// One read of the whole map instead of a hostcall per header: the
	// owned headers are rarely there, and removing them is then free.
	var owned [len(ownedHeaders)]bool
	var post bool
	var path string
	err := proxywasm.VisitHttpRequestHeaders(func(k, v []byte) {
		switch string(k) {
		case ":method":
			post = string(v) == "POST"
		case ":path":
			path = string(v)
		case sloTTFTHeader:
			h.sloTTFT = headerMillis(v)
		case sloTPOTHeader:
			h.sloTPOT = headerMillis(v)
		case sheddableHeader:
			h.sheddable = string(v) == "true" || string(v) == "1"
		case subsetHeader:
			if h.plugin.cfg.trustSubset {
				h.subset = parseSubset(v)
			}
		case "content-length":
			h.contentLength = true
		}
		if len(v) > 0 && h.plugin.cfg.sessionHeader != "" && string(k) == h.plugin.cfg.sessionHeader {
			h.session = sessionHash(v)
		}
		for i, o := range ownedHeaders {
			if string(k) == o {
				owned[i] = true
			}
		}
	})
	if err != nil {
		// Cannot tell what is there: remove every owned header, route nothing.
		proxywasm.LogError("kvroute: read request headers: " + err.Error())
		for i := range owned {
			owned[i] = true
		}
		post = false
	}
	for i, k := range ownedHeaders {
		if owned[i] {
			if err := proxywasm.RemoveHttpRequestHeader(k); err != nil {
				proxywasm.LogError("kvroute: remove " + k + ": " + err.Error())
			}
		}
	}
	if !post || !h.plugin.cfg.routes("POST", path) {
		return types.ActionContinue
	}
	h.api = prompt.APIOf(path)
	if endOfStream {
		h.finish(decision{outcome: fallbackNoPrompt})
		return types.ActionContinue
	}
	// Hold the headers until the body has been read: the destination header
	// must be in place before the router filter picks a host.
	h.routing = true
	h.heldSince = time.Now()
	h.plugin.held[h.id] = h
	return types.ActionPause
}

func (h *httpContext) OnHttpRequestBody(bodySize int, endOfStream bool) types.Action {
	if !h.routing {
		return types.ActionContinue
	}
	p := h.plugin
	delete(p.held, h.id)
	if bodySize > p.cfg.maxBodyBytes {
		h.finish(decision{outcome: fallbackTooLarge})
		return types.ActionContinue
	}
	if !endOfStream {
		// The body is coming, however slowly: the hold timeout is for a
		// body that never does. Resuming a stream paused in its body
		// makes Envoy send what it buffered twice (the bytes so far, then
		// the whole body), so it is held to the end; Envoy's own timeouts
		// and max_body_bytes bound it.
		return types.ActionPause
	}
	if cap(p.body) < bodySize {
		p.body = make([]byte, bodySize)
	}
	body, err := proxywasm.ReadHttpRequestBody(p.body[:bodySize], 0)
	if err != nil {
		proxywasm.LogError("kvroute: read request body: " + err.Error())
		h.finish(decision{outcome: fallbackInvalidBody})
		return types.ActionContinue
	}
	view := p.sync.view
	stale := false
	if m := view.Manifest(); m != nil {
		stale = time.Since(m.Created()) > p.cfg.maxStaleness
	}
	d := p.router.route(body, view, p.load.locals, routeOptions{
		stale: stale && p.cfg.cachesync != nil, modelAgnostic: p.cfg.cachesync == nil,
		sloTTFT: h.sloTTFT, sloTPOT: h.sloTPOT, subset: h.subset, session: h.session,
		api: h.api, pinned: p.load.sessions.lookup,
	})
	if d.outcome == routed && !d.policy.MeetsSLO && h.sheddable && p.cfg.shed {
		d.outcome = shed
		return h.answer(d, 429, [][2]string{{"retry-after", "1"}},
			`{"error":{"message":"no endpoint can serve this request within its SLO","type":"overloaded","code":429}}`)
	}
	if d.outcome == fallbackNoEndpoints && p.cfg.failClosed {
		return h.answer(d, 503, nil,
			`{"error":{"message":"no inference endpoint is available","type":"unavailable","code":503}}`)
	}
	if d.outcome == routed {
		if err := proxywasm.ReplaceHttpRequestHeader(destinationHeader, d.destination); err != nil {
			proxywasm.LogError("kvroute: set " + destinationHeader + ": " + err.Error())
		}
		if d.named {
			h.nameSlot(body, &d)
		}
		h.account(&d)
		h.report(&d)
	}
	h.finish(d)
	return types.ActionContinue
}

// nameSlot rewrites the body to name the engine slot d chose, with its
// content-length; if Envoy refuses either, the request goes on as it came.
func (h *httpContext) nameSlot(body []byte, d *decision) {
	p := h.plugin
	named, ok := withSlot(p.named[:0], body, d.slot)
	if !ok {
		d.named = false
		return
	}
	p.named = named
	if h.contentLength {
		if err := proxywasm.ReplaceHttpRequestHeader("content-length", strconv.Itoa(len(named))); err != nil {
			proxywasm.LogError("kvroute: set content-length to name an engine slot: " + err.Error())
			d.named = false
			return
		}
	}
	if err := proxywasm.ReplaceHttpRequestBody(named); err != nil {
		proxywasm.LogError("kvroute: name an engine slot in the body: " + err.Error())
		d.named = false
		if h.contentLength {
			proxywasm.ReplaceHttpRequestHeader("content-length", strconv.Itoa(len(body)))
		}
	}
}

// answer ends the routing of a request with the filter's own JSON reply;
// if Envoy refuses it, the request goes on unrouted.
func (h *httpContext) answer(d decision, status int, headers [][2]string, body string) types.Action {
	h.finish(d)
	headers = append(headers, [2]string{"content-type", "application/json"})
	if err := proxywasm.SendHttpResponse(uint32(status), headers, []byte(body), -1); err != nil {
		proxywasm.LogError("kvroute: answer " + strconv.Itoa(status) + ": " + err.Error())
		return types.ActionContinue
	}
	return types.ActionPause
}

// finish ends the routing of a request: metrics, and the decision kept for
// the debug header.
func (h *httpContext) finish(d decision) {
	h.routing = false
	h.decided = true
	h.decision = d
	h.plugin.m.decided(&d)
}

// headerMillis parses a millisecond count, 0 for anything but 1 to an hour.
func headerMillis(v []byte) time.Duration {
	n, err := strconv.Atoi(string(v))
	if err != nil || n < 1 || n > 3_600_000 {
		return 0
	}
	return time.Duration(n) * time.Millisecond
}

// account adds the request to this gateway's in-flight load on its endpoint.
func (h *httpContext) account(d *decision) {
	h.routedAt = time.Now()
	// Outcomes feed cachesync's latency fit; local mode has none.
	h.outcomePending = d.reason != reasonRendezvous && d.reason != reasonResponse && h.plugin.cfg.cachesync != nil && h.plugin.sync.reporting()
	h.endpoint = endpointHash(d.endpoint)
	h.prefillPending = int64(d.policy.UncachedTokens)
	h.requestPending = true
	h.plugin.m.inflight.Add(1)
	h.plugin.load.change(h.endpoint, inflight.Counts{PrefillTokens: h.prefillPending, Requests: 1})
	if !d.stream && h.prefillPending > 0 && d.policy.Chosen.TTFT > 0 {
		h.prefillDue = h.routedAt.Add(d.policy.Chosen.TTFT)
		h.plugin.prefilling[h.id] = h
	}
	if d.policy.UncachedTokens <= maxLeadTokens {
		h.stepLeft, h.stepLength = h.plugin.load.steps.at(h.endpoint, h.routedAt.UnixNano())
	}
	// A prompt mostly new to its endpoint (a new prefix, or a copy) is
	// remembered for the requests sharing it that come before the snapshot
	// shows it. One mostly cached adds only its own tail, which the
	// requests that follow closely do not share.
	if r := h.plugin.router; d.reason != reasonRendezvous && 2*d.policy.Blocks < r.blocks && d.policy.Blocks+placed.Stride <= len(r.hashes) {
		h.plugin.load.placed.add(h.endpoint, r.hashes, r.blocks-d.policy.Blocks, d.policy.Blocks == 0, d.policy.Chosen.TTFT)
	}
	if h.session != 0 && d.reason != reasonRendezvous {
		h.plugin.load.sessions.pin(h.session, h.endpoint)
	}
}

// report queues the decision for the index: cachesync's (through the
// fetcher VM's tick) or the filter's own in local mode.
func (h *httpContext) report(d *decision) {
	p := h.plugin
	hashes := p.router.hashes
	if len(hashes) == 0 || !p.sync.reporting() {
		return
	}
	hashes = hashes[:min(len(hashes), p.cfg.reportBlocks)]
	rec := report.Record{Endpoint: d.endpoint, Model: d.model, Hashes: hashes, Cached: min(d.policy.Blocks, len(hashes)), Reason: d.reason,
		Output: min(max(d.output, 0), report.MaxOutput), Bytes: min(d.promptBytes, report.MaxBytes)}
	var err error
	if p.record, err = report.AppendRecord(p.record[:0], &rec); err != nil {
		return
	}
	p.sync.enqueueReport(p.record)
}

// releasePrefill gives back the stream's uncached prompt tokens: once the
// first response byte is out, its prefill is done. In a streamed answer it
// is also when the request's time to first token is known, which goes to
// cachesync with the terms the policy priced it by.
func (h *httpContext) releasePrefill() {
	if h.outcomePending {
		h.outcomePending = false
		h.reportOutcome(time.Since(h.routedAt))
	}
	h.givePrefillBack()
}

// givePrefillBack releases the stream's uncached prompt tokens from this
// gateway's in-flight load.
func (h *httpContext) givePrefillBack() {
	delete(h.plugin.prefilling, h.id)
	if h.prefillPending == 0 {
		return
	}
	h.plugin.load.change(h.endpoint, inflight.Counts{PrefillTokens: -h.prefillPending})
	h.prefillPending = 0
}

// reportOutcome queues what the request's first token took against what
// the policy predicted.
func (h *httpContext) reportOutcome(ttft time.Duration) {
	p, t := h.plugin, &h.decision.policy.Chosen
	o := report.Outcome{
		Endpoint: h.decision.endpoint,
		Features: predict.Features{Uncached: float64(t.UncachedTokens), Backlog: float64(t.Backlog),
			Running: float64(t.Running), Waiting: float64(t.Waiting), Wait: t.Wait.Seconds()},
		Predicted: t.TTFT.Seconds(), Observed: ttft.Seconds(),
	}
	var err error
	if p.record, err = report.AppendOutcome(p.record[:0], &o); err == nil {
		p.sync.enqueueReport(p.record)
	}
}

func (h *httpContext) OnHttpResponseHeaders(_ int, endOfStream bool) types.Action {
	if h.decided && h.plugin.cfg.debugHeader {
		proxywasm.ReplaceHttpResponseHeader(decisionHeader, h.decision.header())
	}
	var served []byte
	if h.decided && (h.decision.outcome == routed || h.api == prompt.Responses) {
		// Where a retry went is known only now, from Envoy.
		if addr, err := proxywasm.BorrowProperty(upstreamAddress); err == nil && len(addr) > 0 {
			served = addr
		}
	}
	if len(served) > 0 && h.decision.outcome == routed {
		proxywasm.ReplaceHttpResponseHeader(servedHeader, string(served))
	}
	if len(served) > 0 && h.api == prompt.Responses && !endOfStream {
		if status, err := proxywasm.GetHttpResponseHeader(":status"); err == nil && status == "200" {
			h.learning, h.served = true, endpointHash(string(served))
		}
	}
	if h.decided && h.decision.outcome == routed && !endOfStream {
		if ct, err := proxywasm.GetHttpResponseHeader("content-type"); err == nil && strings.HasPrefix(ct, "text/event-stream") {
			// The engine that answers, which a retry may have changed.
			h.streaming, h.clock = true, h.endpoint
			if len(served) > 0 {
				h.clock = endpointHash(string(served))
			}
		}
	}
	if !h.streaming {
		// The first byte of an answer that is not streamed comes with its
		// last token, and that of an error with no token at all: as times
		// to first token, either would teach the fit nonsense.
		h.outcomePending = false
	}
	if endOfStream {
		h.releasePrefill()
	}
	return types.ActionContinue
}

func (h *httpContext) OnHttpResponseBody(size int, endOfStream bool) types.Action {
	h.releasePrefill()
	if h.streaming && size > 0 {
		now := time.Now().UnixNano()
		if h.lastToken == 0 && h.clock == h.endpoint && h.stepLength > 0 {
			h.plugin.load.steps.learn(h.clock, h.stepLeft, h.stepLength, now-h.routedAt.UnixNano())
		}
		h.plugin.load.steps.token(h.clock, now, h.lastToken)
		h.lastToken = now
	}
	if h.learning {
		h.learnResponse(size, endOfStream)
	}
	return types.ActionContinue
}

// learnResponse reads a Responses API answer's head until it finds the
// response's id, and pins the id to the endpoint that served it.
func (h *httpContext) learnResponse(size int, endOfStream bool) {
	if n := min(size, responseHead-len(h.head)); n > 0 {
		chunk, err := proxywasm.GetHttpResponseBody(0, n)
		if err != nil {
			h.learning = false
			return
		}
		h.head = append(h.head, chunk...)
	}
	if id, ok := responseID(h.head); ok {
		h.plugin.load.sessions.pin(responseKey(string(id)), h.served)
	} else if !endOfStream && len(h.head) < responseHead {
		return
	}
	h.learning, h.head = false, nil
}

func (h *httpContext) OnHttpStreamDone() {
	delete(h.plugin.held, h.id)
	delete(h.plugin.prefilling, h.id)
	if !h.requestPending {
		return
	}
	h.requestPending = false
	h.plugin.m.inflight.Add(-1)
	h.plugin.load.change(h.endpoint, inflight.Counts{PrefillTokens: -h.prefillPending, Requests: -1})
	h.prefillPending = 0
}
