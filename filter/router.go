package main

import (
	"errors"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/shared/blockhash"
	"github.com/kvroute/kvroute/shared/policy"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// destinationHeader carries the chosen endpoint to Envoy's override-host
// load-balancing policy (the Gateway API Inference Extension's name for it).
const destinationHeader = "x-gateway-destination-endpoint"

// decisionHeader explains the choice on the response when debug_header is on.
const decisionHeader = "x-kvroute-decision"

// subsetHeader narrows the choice to the endpoints it lists, when a
// trusted filter in front sets it (trust_subset_header); it is removed
// from every request, trusted or not.
const subsetHeader = "x-gateway-destination-endpoint-subset"

// servedHeader names, on the response, the endpoint that served the
// request (the Endpoint Picker Protocol's report of a retry's outcome).
const servedHeader = "x-gateway-destination-endpoint-served"

// A request's own SLOs, in milliseconds, and whether it may be shed (429)
// when no endpoint is predicted to meet them. A trusted filter before this
// one sets them; the filter removes them before the request goes upstream.
const (
	sloTTFTHeader   = "x-kvroute-slo-ttft-ms"
	sloTPOTHeader   = "x-kvroute-slo-tpot-ms"
	sheddableHeader = "x-kvroute-sheddable"
)

// ownedHeaders are removed from every request before anything else happens:
// each of them can steer the upstream or fake a decision, and only the
// filter may set them.
var ownedHeaders = [...]string{
	destinationHeader,
	subsetHeader,
	decisionHeader,
	sloTTFTHeader,
	sloTPOTHeader,
	sheddableHeader,
	// ORIGINAL_DST clusters read this one by default.
	"x-envoy-original-dst-host",
}

// outcome is what routing made of one request; every outcome other than
// routed is a fallback to Envoy's own load balancing.
type outcome uint8

const (
	routed outcome = iota
	fallbackInvalidBody
	fallbackNoPrompt
	fallbackTooLarge
	fallbackNoEndpoints
	fallbackHeldTooLong
	fallbackUnsupported
	shed
	numOutcomes
)

var outcomeNames = [numOutcomes]string{
	routed:              "routed",
	fallbackInvalidBody: "invalid_body",
	fallbackNoPrompt:    "no_prompt",
	fallbackTooLarge:    "body_too_large",
	fallbackNoEndpoints: "no_endpoints",
	fallbackHeldTooLong: "held_too_long",
	fallbackUnsupported: "unsupported",
	shed:                "shed",
}

func (o outcome) String() string { return outcomeNames[o] }

// reasonRendezvous marks a choice made without a snapshot.
const reasonRendezvous = "rendezvous"

// decision is what the router made of one request.
type decision struct {
	outcome  outcome
	endpoint string
	// reason is the policy's reason code, or reasonRendezvous.
	reason string
	policy policy.Decision
	// model is the requested model; prompt tokens are estimated from the
	// text's length.
	model        string
	template     prompt.Template // the chat template the prompt was rendered with
	promptTokens int
	// promptBytes is the rendered prompt's length; 0 when the engine's
	// prompt is more than was rendered (a conversation continued there).
	promptBytes int
	// output is the tokens the request asks to generate at most, 0 when
	// it does not say.
	output int
	// stream: the request asks for its answer streamed.
	stream bool
	// runner is the runner-up endpoint's address, "" if none.
	runner string
	// destination is the destination header's value: endpoint, then the
	// fallbacks configured, comma-separated.
	destination string
	// named: the request is to name slot, the endpoint's engine slot
	// holding its prefix (policy.Picker.Slot), in its body.
	named bool
	slot  int
}

// routeOptions are what the request's headers and the snapshot's age
// bring to the decision.
type routeOptions struct {
	// stale: the snapshot's load figures are too old to trust.
	stale bool
	// modelAgnostic: the filter's own index does not know which endpoint
	// serves which model (local mode).
	modelAgnostic    bool
	sloTTFT, sloTPOT time.Duration
	// subset: the endpoints a trusted filter allows, nil for all.
	subset []string
	// session names the request's session (session_header), 0 for none.
	session uint64
	// api is the request's format, told by its path.
	api prompt.API
	// pinned looks up the endpoint a key of the sessions table is pinned
	// to (nil: none is).
	pinned func(key uint64) (endpoint uint64, ok bool)
}

// router turns a request body into an endpoint. One router serves a whole VM
// (one Envoy worker thread), so its buffers are reused across requests.
type router struct {
	cfg      config
	renderer prompt.Renderer
	text     []byte
	hashes   []uint64 // the last prompt's block hashes, its head at least
	blocks   int      // the last prompt's full blocks, at most max_blocks
	picker   *policy.Picker
	rng      uint64 // xorshift state for the policy's tie breaks
	ranked   []int  // fallback slots, reused
	dest     []byte // destination header value, reused
	allowed  []bool // the subset's slots, reused
	// shipped holds the chat templates the snapshot ships (on auto), parsed
	// on first use, by model; nil for one that does not parse. shippedID
	// is the view's TemplatesID they were parsed from.
	shipped   map[string]*prompt.Jinja
	shippedID uint64
	// addrs are the endpoint addresses last returned by slot, and addrBuf
	// the scratch to compare the snapshot's with (addr).
	addrs   []string
	addrBuf []byte
}

func newRouter(cfg config, seed uint64) (*router, error) {
	p, err := policy.New(cfg.policy)
	if err != nil {
		return nil, err
	}
	rt := &router{cfg: cfg, picker: p, rng: seed | 1}
	rt.renderer.Custom = cfg.custom
	return rt, nil
}

// loads fills the gateway's own in-flight load per slot of the view's
// endpoint table, for the prompt of chained block hashes and its session
// (0 for none).
type loads func(v *snapshot.View, hashes []uint64, session uint64) []policy.Local

// route picks the endpoint for a complete request body: by policy over the
// snapshot when the view holds one, by rendezvous over the configured
// endpoints otherwise. local reports the gateway's own load.
func (r *router) route(body []byte, view *snapshot.View, local loads, o routeOptions) decision {
	defer r.trim()
	var m *snapshot.Manifest
	if view != nil && view.Loaded() {
		m = view.Manifest()
	}
	p, tmpl, err := r.render(body, view, m, o.api)
	if errors.Is(err, prompt.ErrNoPrompt) {
		return decision{outcome: fallbackNoPrompt}
	}
	if id := r.renderer.PreviousResponse(); id != "" && o.pinned != nil && (err == nil || errors.Is(err, prompt.ErrUnsupported)) {
		// The conversation is on one engine; what the request adds to it
		// need not be rendered to send it there.
		if ep, ok := o.pinned(responseKey(id)); ok {
			if d, ok := r.toPinned(ep, view, m, local, o, p, tmpl); ok {
				return d
			}
		}
	}
	switch {
	case errors.Is(err, prompt.ErrUnsupported):
		return decision{outcome: fallbackUnsupported}
	case err != nil:
		return decision{outcome: fallbackInvalidBody}
	}
	r.text = p.Text[:0]
	seed := blockhash.Salted(blockhash.Seed(p.Model, ""), p.CacheSalt)
	// Only the head is hashed at first: what reports, recent placements
	// and rendezvous use. Most prompts end there, and a longer one is
	// hashed on only while some endpoint holds every block hashed so far.
	bs := r.cfg.hashing.Size()
	r.blocks = min(len(p.Text)/bs, r.cfg.hashing.Max())
	r.hashes = blockhash.Append(r.hashes[:0], seed, p.Text[:min(r.blocks, r.cfg.hashAhead())*bs], r.cfg.hashing)
	d := decision{model: p.Model, template: tmpl, promptTokens: policy.Tokens(len(p.Text), m), promptBytes: len(p.Text),
		output: p.MaxTokens, stream: p.Stream}

	if m != nil {
		req := policy.Request{
			Model:        p.Model,
			Hashes:       r.hashes,
			Blocks:       r.blocks,
			PromptTokens: d.promptTokens,
			OutputTokens: p.MaxTokens,
			SLOTTFT:      o.sloTTFT,
			SLOTPOT:      o.sloTPOT,
			Local:        local(view, r.hashes, o.session),
			Stale:        o.stale,
			Random:       r.next(),
			Now:          time.Now(),
		}
		if o.modelAgnostic {
			req.Model = ""
		}
		if o.subset != nil {
			req.Allowed = r.allowedSlots(m, o.subset)
		}
		d.policy = r.picker.Pick(view, &req)
		for n := len(r.hashes); d.policy.Deepest == n && n < r.blocks; n = len(r.hashes) {
			// Some endpoint holds every block hashed so far: hash twice
			// as many, on from the last, and look again.
			r.hashes = blockhash.Append(r.hashes, r.hashes[n-1], p.Text[n*bs:min(2*n, r.blocks)*bs], r.cfg.hashing)
			req.Hashes = r.hashes
			d.policy = r.picker.Pick(view, &req)
		}
		if d.policy.Endpoint >= 0 {
			d.endpoint = r.addr(m, d.policy.Endpoint)
			d.reason = d.policy.Reason.String()
			if slot := r.picker.Slot(view, &d.policy, &req); slot >= 0 {
				d.named, d.slot = true, slot
			}
			if ru := d.policy.RunnerUp.Endpoint; ru >= 0 {
				d.runner = r.addr(m, ru)
			}
			d.destination = d.endpoint
			if n := r.cfg.fallbackEndpoints; n > 0 {
				// An ordered list: override-host tries them in turn, so a
				// retry goes to the next best instead of anywhere.
				r.dest = append(r.dest[:0], d.endpoint...)
				r.ranked = r.picker.Fallbacks(r.ranked[:0], &d.policy, n)
				for _, slot := range r.ranked {
					r.dest = m.Endpoint(slot).AppendAddr(append(r.dest, ','))
				}
				d.destination = string(r.dest)
			}
			return d
		}
	}
	candidates := r.cfg.endpoints
	if o.subset != nil {
		candidates = o.subset
	}
	if len(candidates) == 0 {
		d.outcome = fallbackNoEndpoints
		return d
	}
	r.ranked = policy.Rendezvous(r.ranked[:0], r.affinityKey(seed, p.Text), candidates, 1+r.cfg.fallbackEndpoints)
	d.endpoint = candidates[r.ranked[0]]
	d.destination = d.endpoint
	if len(r.ranked) > 1 {
		r.dest = append(r.dest[:0], d.endpoint...)
		for _, i := range r.ranked[1:] {
			r.dest = append(append(r.dest, ','), candidates[i]...)
		}
		d.destination = string(r.dest)
	}
	d.reason = reasonRendezvous
	d.policy = policy.Decision{Endpoint: -1, UncachedTokens: d.promptTokens}
	return d
}

// addr returns the address of slot i of m. It converts it to a string only
// when it differs from the one it last returned for the slot: a routed
// request would otherwise allocate two, the chosen and the runner-up.
func (r *router) addr(m *snapshot.Manifest, i int) string {
	if i >= len(r.addrs) {
		r.addrs = append(r.addrs, make([]string, i+1-len(r.addrs))...)
	}
	r.addrBuf = m.Endpoint(i).AppendAddr(r.addrBuf[:0])
	if string(r.addrBuf) != r.addrs[i] {
		r.addrs[i] = string(r.addrBuf)
	}
	return r.addrs[i]
}

// keptText bounds the rendered text a router keeps for the next request:
// an ordinary prompt's is a few KiB, a hostile one's max_body_bytes.
const keptText = 1 << 20

// trim ends a request: a huge one's buffers are not kept for the VM's life
// (prompt.Renderer.Trim).
func (r *router) trim() {
	r.renderer.Trim()
	if cap(r.text) > keptText {
		r.text = nil
	}
}

// render renders body with the configured template or, on auto, with the
// one the snapshot m names for its model (the configured fallback, plain,
// when m is nil or names none): a custom one from the view's shipped
// templates.
func (r *router) render(body []byte, view *snapshot.View, m *snapshot.Manifest, api prompt.API) (prompt.Prompt, prompt.Template, error) {
	if err := r.renderer.ParseAPI(body, api); err != nil {
		return prompt.Prompt{}, 0, err
	}
	t := r.cfg.template
	if r.cfg.autoTemplate && m != nil {
		if id := m.Model(r.renderer.Model()); id >= 0 {
			t = m.ModelTemplate(id)
		}
		if t == prompt.Custom {
			r.renderer.Custom = r.shippedTemplate(view, r.renderer.Model())
		}
	}
	p, err := r.renderer.RenderParsed(r.text[:0], t)
	return p, t, err
}

// shippedTemplate returns model's template as the view ships it, parsed
// once per worker per change of the shipped templates; nil when none is
// shipped or it does not parse, which renders as ErrUnsupported: routed by
// load, as a request this gateway cannot render.
func (r *router) shippedTemplate(view *snapshot.View, model string) *prompt.Jinja {
	if id := view.TemplatesID(); id != r.shippedID || r.shipped == nil {
		r.shipped, r.shippedID = map[string]*prompt.Jinja{}, id
	}
	j, ok := r.shipped[model]
	if !ok {
		if ct, found := view.ChatTemplate(model); found {
			j, _ = prompt.ParseJinja(ct.Source, ct.Special)
		}
		r.shipped[model] = j
	}
	return j
}

// toPinned routes a request continuing a previous response to the
// endpoint that served it (hash ep), when that endpoint is eligible in the
// snapshot or, before the first snapshot, configured. Its text is only
// what the request adds to a conversation the engine holds, so it is not
// hashed, reported or placed.
func (r *router) toPinned(ep uint64, view *snapshot.View, m *snapshot.Manifest, local loads, o routeOptions, p prompt.Prompt, tmpl prompt.Template) (decision, bool) {
	r.hashes, r.blocks = r.hashes[:0], 0
	d := decision{model: p.Model, template: tmpl, promptTokens: policy.Tokens(len(p.Text), m), reason: reasonResponse, stream: p.Stream}
	if m != nil {
		n := m.NumEndpoints()
		if cap(r.allowed) < n {
			r.allowed = make([]bool, n)
		}
		r.allowed = r.allowed[:n]
		found := false
		for i := range r.allowed {
			e := m.Endpoint(i)
			r.allowed[i] = !e.Vacant() && endpointHash(e.Addr()) == ep && (o.subset == nil || slices.Contains(o.subset, e.Addr()))
			found = found || r.allowed[i]
		}
		if !found {
			return d, false
		}
		req := policy.Request{Model: p.Model, PromptTokens: d.promptTokens, OutputTokens: p.MaxTokens,
			Local: local(view, nil, 0), Stale: o.stale, Allowed: r.allowed, Random: r.next()}
		if o.modelAgnostic {
			req.Model = ""
		}
		d.policy = r.picker.Pick(view, &req)
		if d.policy.Endpoint < 0 {
			return d, false
		}
		d.endpoint = r.addr(m, d.policy.Endpoint)
		d.destination = d.endpoint
		return d, true
	}
	candidates := r.cfg.endpoints
	if o.subset != nil {
		candidates = o.subset
	}
	for _, c := range candidates {
		if endpointHash(c) == ep {
			d.endpoint, d.destination = c, c
			d.policy = policy.Decision{Endpoint: -1, UncachedTokens: d.promptTokens}
			return d, true
		}
	}
	return d, false
}

// allowedSlots marks the slots of m's endpoint table that subset names.
func (r *router) allowedSlots(m *snapshot.Manifest, subset []string) []bool {
	n := m.NumEndpoints()
	if cap(r.allowed) < n {
		r.allowed = make([]bool, n)
	}
	r.allowed = r.allowed[:n]
	for i := range r.allowed {
		e := m.Endpoint(i)
		r.allowed[i] = !e.Vacant() && slices.Contains(subset, e.Addr())
	}
	return r.allowed
}

// parseSubset reads a subset header's comma-separated ip:port list; nil
// when none of it parses, so that a malformed header narrows nothing.
func parseSubset(v []byte) []string {
	var out []string
	for part := range strings.SplitSeq(string(v), ",") {
		if ap, err := netip.ParseAddrPort(strings.TrimSpace(part)); err == nil {
			out = append(out, ap.String())
		}
	}
	return out
}

// affinityKey names the prompt's leading span of cfg.affinityBlocks blocks
// (or all its full blocks if it has fewer). Not just the first block: chat
// templates open every prompt with the same boilerplate (Qwen's default
// system prompt fills more than one block), so the first block alone would
// send every request to one endpoint.
func (r *router) affinityKey(seed uint64, text []byte) uint64 {
	if n := len(r.hashes); n > 0 {
		return r.hashes[min(n, r.cfg.affinityBlocks)-1]
	}
	if len(text) > 0 {
		// A prompt shorter than one block still deserves a stable home.
		return blockhash.Next(seed, text)
	}
	return seed
}

// next is xorshift64*: fresh tie-break entropy per request without
// crypto/rand or a lock.
func (r *router) next() uint64 {
	r.rng ^= r.rng >> 12
	r.rng ^= r.rng << 25
	r.rng ^= r.rng >> 27
	return r.rng * 2685821657736338717
}

// header renders a decision for the debug response header.
func (d *decision) header() string {
	if d.outcome != routed {
		return "fallback=" + d.outcome.String()
	}
	b := make([]byte, 0, 160)
	b = append(b, "endpoint="...)
	b = append(b, d.endpoint...)
	b = append(b, "; reason="...)
	b = append(b, d.reason...)
	if d.reason != reasonRendezvous {
		b = append(b, "; blocks="...)
		b = strconv.AppendInt(b, int64(d.policy.Blocks), 10)
		b = append(b, "; gpu_blocks="...)
		b = strconv.AppendInt(b, int64(d.policy.GPUBlocks), 10)
		b = appendTerms(b, "", &d.policy.Chosen)
		b = append(b, "; eligible="...)
		b = strconv.AppendInt(b, int64(d.policy.Eligible), 10)
		b = append(b, "; decode_saturated_endpoints="...)
		b = strconv.AppendInt(b, int64(d.policy.DecodeSaturated), 10)
		if d.runner != "" {
			b = append(b, "; runner_up="...)
			b = append(b, d.runner...)
			b = appendTerms(b, "runner_up_", &d.policy.RunnerUp)
		}
	}
	b = append(b, "; uncached_tokens="...)
	b = strconv.AppendInt(b, int64(d.policy.UncachedTokens), 10)
	if d.named {
		b = append(b, "; engine_slot="...)
		b = strconv.AppendInt(b, int64(d.slot), 10)
	}
	b = append(b, "; template="...)
	b = append(b, d.template.String()...)
	return string(b)
}

// appendTerms renders a candidate's priced terms.
func appendTerms(b []byte, prefix string, t *policy.Terms) []byte {
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"ttft_ms", t.TTFT.Milliseconds()}, {"step_wait_us", t.Wait.Microseconds()}, {"itl_us", t.ITL.Microseconds()}, {"others_ms", t.Others.Milliseconds()},
		{"eviction_ms", t.Eviction.Milliseconds()}, {"copy_margin_ms", t.CopyMargin.Milliseconds()},
		{"price_ms", t.Price.Milliseconds()}, {"backlog_tokens", int64(t.Backlog)}, {"running", int64(t.Running)},
		{"prefixes", int64(t.Prefixes)}, {"fill_pct", int64(t.FillPercent)}, {"decode_saturated", b2i(t.DecodeSaturated)},
	} {
		b = append(b, "; "...)
		b = append(b, prefix...)
		b = append(b, f.name...)
		b = append(b, '=')
		b = strconv.AppendInt(b, f.v, 10)
	}
	return b
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
