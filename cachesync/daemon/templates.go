package daemon

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/cachesync/internal/index"
	"github.com/kvroute/kvroute/cachesync/internal/scrape"
	"github.com/kvroute/kvroute/cachesync/internal/verify"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// The chat-template check. A precise index is only as good as the gateways'
// render of the prompt: if an engine's template differs from the one the
// gateways render with, no request's blocks match what the engine cached.
// So each engine with KV events is asked now and then to tokenize the probe
// set (verify.Fetch), and its text is compared with what the gateways'
// template renders. An engine that disagrees is indexed approximately, from
// the gateways' own reports, which need no agreement; once it agrees again
// (the engine redeployed, or the gateways reconfigured) it is precise again.

// DefaultTemplateCheck is how often an engine's template is checked.
const DefaultTemplateCheck = time.Minute

// gatewayWindow is how long a template a gateway named counts as in use
// (Daemon.gatewayWindow, shorter in tests): longer than any gateway's
// snapshot interval (at most a minute).
const gatewayWindow = 2 * time.Minute

// templateTimeout bounds one engine's check.
const templateTimeout = 10 * time.Second

// templateState is one engine's check.
type templateState struct {
	rendering *verify.Rendering // the engine's last answer; nil before one
	// renders is the template that agrees with rendering, published in the
	// snapshot for gateways on auto; Plain when none does. custom is the
	// held template it is when that is prompt.Custom.
	renders prompt.Template
	custom  *prompt.Jinja
	// unsupported: the engine serves neither a chat render endpoint nor a
	// chat /tokenize, so nothing is known of its template.
	unsupported bool
	// unseen says why the probes could not show how the engine renders
	// chat completions, though they rendered: then it agrees with no
	// gateway, and is routed approximately. "" when they show it.
	unseen  string
	fetched time.Time // when the last check started
	running bool
	failure string // the last check's error, once logged; "" when it went through

	// The verdict: against which gateway templates it was reached, their
	// agreements, and whether the engine was made approximate for it.
	against  []prompt.Template
	agree    []verify.Agreement
	mismatch bool
}

// disagrees reports whether some target template disagrees.
func (s *templateState) disagrees() bool {
	for _, a := range s.agree {
		if a.Disagrees() {
			return true
		}
	}
	return false
}

// agrees reports whether every target template agrees.
func (s *templateState) agrees() bool {
	for _, a := range s.agree {
		if !a.Agrees() {
			return false
		}
	}
	return len(s.agree) > 0
}

// checkResult is a finished check, handed to the daemon's loop.
type checkResult struct {
	addr, model string
	rendering   *verify.Rendering
	err         error
}

// checkable reports whether e's template can be checked and matters: a
// precise index depends on it (and decodes the engine's tokens with the
// index's vocabulary), and a llama.cpp engine renders prompts to text for
// the asking, so its check needs no vocabulary; its index comes from
// reports either way, but gateways on auto render its model with what it
// is found to render.
func (d *Daemon) checkable(e *engine) bool {
	return d.cfg.TemplateCheck >= 0 && (d.eventful(e) || e.last.Kind == scrape.KindLlamaCpp)
}

// eventful reports whether e can be indexed from its KV events: what a
// template mismatch takes away.
func (d *Daemon) eventful(e *engine) bool { return d.vocab != nil && len(e.d.Events) > 0 }

// maybeCheck starts a check of e's template when one is due. Called on the
// loop's tick (scrapes arrive only when something changed), with d.mu held.
func (d *Daemon) maybeCheck(ctx context.Context, e *engine, models []string) {
	tc := &e.template
	interval := d.cfg.TemplateCheck
	if interval == 0 {
		interval = DefaultTemplateCheck
	}
	if !d.checkable(e) || tc.running || len(models) == 0 || (!tc.fetched.IsZero() && time.Since(tc.fetched) < interval) {
		return
	}
	tc.running, tc.fetched = true, time.Now()
	addr, model, applied := e.d.Addr, models[0], e.last.Kind == scrape.KindLlamaCpp
	go func() {
		fetchCtx, cancel := context.WithTimeout(ctx, templateTimeout)
		var r *verify.Rendering
		var err error
		if applied {
			r, err = verify.FetchApplied(fetchCtx, d.http, "http://"+addr, model)
		} else {
			r, err = verify.Fetch(fetchCtx, d.http, "http://"+addr, model, d.vocab)
		}
		cancel()
		select {
		case d.checks <- checkResult{addr: addr, model: model, rendering: r, err: err}:
		case <-ctx.Done():
		}
	}()
}

// applyCheck takes a finished check in. Called on the loop.
func (d *Daemon) applyCheck(ctx context.Context, res checkResult) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.engines[res.addr]
	if !ok {
		return
	}
	tc := &e.template
	tc.running = false
	unsupported := errors.Is(res.err, verify.ErrUnsupported)
	if res.err != nil && !unsupported {
		// The last verdict stands: an engine that is restarting fails its
		// checks for a while, and that is no news about its template.
		if msg := res.err.Error(); msg != tc.failure {
			tc.failure = msg
			d.log.Warn("checking the engine's chat template failed; will retry", "engine", res.addr, "err", res.err)
		}
		return
	}
	if unsupported && !tc.unsupported {
		d.log.Info("engine cannot be asked how it renders chat prompts (neither a chat render endpoint nor a chat /tokenize); its template is assumed to match a fixed chat_template of the gateways', and not to match plain", "engine", res.addr)
	}
	tc.failure, tc.unsupported = "", unsupported
	if unsupported {
		// No evidence about any template (no probe text), which judge
		// weighs as such.
		res.rendering = &verify.Rendering{Model: res.model}
	}
	tc.rendering = res.rendering
	tc.renders, tc.custom = prompt.Plain, nil
	// A named template first: gateways on auto render it without being
	// sent its source. Then those cachesync holds, which the snapshot
	// ships to them (shipTemplates).
	tc.unseen = ""
	if m := verify.Matching(res.rendering); len(m) > 0 {
		tc.renders = m[0]
		if tc.renders == prompt.GptOss && res.rendering.Path == verify.TokenizePath && e.last.Kind == scrape.KindVLLM {
			// vLLM renders gpt-oss chat completions through harmony,
			// whatever the template its /tokenize applies says; only
			// its render endpoint shows them. Gateways on auto render
			// the model as vLLM's chat completions do, and this engine
			// is indexed from their reports.
			tc.renders = prompt.Harmony
			tc.unseen = "vLLM renders gpt-oss chat completions through harmony, which its /tokenize does not show; a vLLM with " + verify.RenderPath + " shows it"
		}
	} else {
		for _, j := range d.customs {
			if verify.Compare(res.rendering, prompt.Custom, j).Agrees() {
				tc.renders, tc.custom = prompt.Custom, j
				break
			}
		}
	}
	tc.against = nil // evaluate afresh
	d.judge(ctx, e)
}

// rejudge re-evaluates every engine whose targets (targets) moved since
// its verdict: the gateways reconfigured, or, for gateways on auto, another
// engine of its model changed what the model renders with. Called on the
// loop's tick.
func (d *Daemon) rejudge(ctx context.Context) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fixed, auto := d.svc.GatewayTemplates(d.gatewayWindow)
	if u := d.svc.UnknownCustom(); u != "" && u != d.warnedCustom {
		d.warnedCustom = u
		d.log.Warn("a gateway renders with a custom chat template cachesync does not hold, so its engines cannot be checked against it: give cachesync the same template with -chat-template-file", "template", u, "held", d.customNames())
	}
	if len(fixed) > 1 && !slices.Equal(fixed, d.warnedTemplates) {
		d.warnedTemplates = fixed
		d.log.Warn("gateways render prompts with different chat templates; an engine agrees with one of them at most, and is routed approximately", "templates", names(fixed))
	}
	for _, e := range d.engines {
		if e.template.rendering != nil && !slices.Equal(e.template.against, d.targets(e, fixed, auto)) {
			d.judge(ctx, e)
		}
	}
	d.shipTemplates()
}

// modelTemplate is the template the snapshot names for a model or adapter:
// the one most engines serving it render with, as
// snapshot.Manifest.ModelTemplate tallies their rows; and, when that is
// prompt.Custom, the held template most of them were found to render (nil
// otherwise). With d.mu held.
func (d *Daemon) modelTemplate(name string) (prompt.Template, *prompt.Jinja) {
	var y prompt.Tally
	held := map[*prompt.Jinja]int{}
	var best *prompt.Jinja
	for _, e := range d.engines {
		if !slices.Contains(e.last.Models, name) && !slices.Contains(e.last.Adapters, name) {
			continue
		}
		y.Add(e.template.renders)
		if j := e.template.custom; j != nil {
			held[j]++
			if best == nil || held[j] > held[best] || held[j] == held[best] && j.Name() < best.Name() {
				best = j
			}
		}
	}
	if t := y.Winner(); t != prompt.Custom {
		return t, nil
	}
	return prompt.Custom, best
}

// shipTemplates puts in the snapshot, for every model (or adapter) the
// snapshot names custom, the source of the held template its engines
// render with, so that gateways on auto render those models as the engines
// do. With d.mu held.
func (d *Daemon) shipTemplates() {
	var ships []snapshot.ChatTemplate
	if len(d.customs) > 0 {
		names := map[string]bool{}
		for _, e := range d.engines {
			for _, n := range slices.Concat(e.last.Models, e.last.Adapters) {
				names[n] = true
			}
		}
		for _, n := range slices.Sorted(maps.Keys(names)) {
			if t, j := d.modelTemplate(n); t == prompt.Custom && j != nil {
				ships = append(ships, snapshot.ChatTemplate{Model: n, Source: j.Source(), Special: j.Special()})
			}
		}
	}
	if len(ships) > snapshot.MaxChatTemplates {
		ships = ships[:snapshot.MaxChatTemplates]
	}
	if err := d.ix.SetChatTemplates(ships); err != nil && err.Error() != d.warnedShip {
		d.warnedShip = err.Error()
		d.log.Warn("cannot ship the chat template to gateways on auto; they render those models plain", "err", err)
	}
}

// targets are the templates e must agree with: those the gateways name,
// and, when some gateway renders each model with the template the snapshot
// names for it, the one it will name for e's model (modelTemplate).
func (d *Daemon) targets(e *engine, fixed []prompt.Template, auto bool) []prompt.Template {
	if !auto {
		return fixed
	}
	t, _ := d.modelTemplate(e.template.rendering.Model)
	if slices.Contains(fixed, t) {
		return fixed
	}
	out := append(slices.Clone(fixed), t)
	slices.Sort(out)
	return out
}

// judge compares e's last rendering with the templates it must agree with
// and moves the engine between precise and approximate indexing. With d.mu
// held.
func (d *Daemon) judge(ctx context.Context, e *engine) {
	tc := &e.template
	fixed, auto := d.svc.GatewayTemplates(d.gatewayWindow)
	want := d.targets(e, fixed, auto)
	if len(want) == 0 {
		// No gateway has said how it renders yet: nothing to compare.
		return
	}
	wasAgreeing, first := tc.agrees(), tc.against == nil && tc.agree == nil
	tc.against = want
	tc.agree = tc.agree[:0]
	custom := d.customTarget(e, fixed, auto)
	for _, t := range want {
		tc.agree = append(tc.agree, verify.Compare(tc.rendering, t, custom))
	}
	// Gateways on auto render plain what no checked engine of the model
	// renders: an engine that could not be checked cannot agree with that.
	agrees, disagrees := tc.agrees() && tc.unseen == "", tc.disagrees() || tc.unsupported && slices.Contains(want, prompt.Plain) || tc.unseen != ""
	if !d.eventful(e) {
		// Indexed from reports, which hash the gateways' own render:
		// a different template costs nothing but is worth knowing.
		if disagrees != tc.mismatch || first {
			d.log.Info("engine's chat template, checked; it is indexed from the gateways' reports, which need no agreement", "engine", e.d.Addr,
				"model", tc.rendering.Model, "gateways", names(want), "agreement", agreements(tc.agree), "engine_renders_like", templateName(tc.renders, tc.custom))
		}
		tc.mismatch = disagrees
		return
	}
	switch {
	case disagrees && !tc.mismatch:
		like := "none of kvroute's templates"
		if tc.renders != prompt.Plain {
			like = templateName(tc.renders, tc.custom)
		}
		if tc.unseen != "" {
			d.log.Warn("engine's chat prompts cannot be checked: routing it approximately, from the gateways' reports",
				"engine", e.d.Addr, "model", tc.rendering.Model, "reason", tc.unseen, "engine_renders_like", like)
		} else {
			d.log.Warn("engine's chat template does not render prompts as the gateways do: routing it approximately, from the gateways' reports; set the gateways' chat_template to what the engine renders, or the engine's --chat-template",
				"engine", e.d.Addr, "model", tc.rendering.Model, "gateways", names(want), "differences", agreements(tc.agree), "engine_renders_like", like)
		}
		tc.mismatch = true
		if e.precise {
			d.demote(e)
		}
	case !disagrees && tc.mismatch:
		d.log.Info("engine's chat template no longer disagrees with the gateways': routing it precisely", "engine", e.d.Addr, "gateways", names(want), "agreement", agreements(tc.agree))
		tc.mismatch = false
		d.promote(ctx, e)
	case !agrees && !disagrees && first && !tc.unsupported:
		d.log.Info("engine renders none of the template-check probes (no chat template?): its chat prompts cannot be checked, and it stays precise", "engine", e.d.Addr, "model", tc.rendering.Model)
	case agrees && (first || !wasAgreeing):
		d.log.Info("engine's chat template agrees with the gateways'", "engine", e.d.Addr, "model", tc.rendering.Model, "agreement", agreements(tc.agree))
	}
}

// demote stops e's KV events and indexes it from reports.
func (d *Daemon) demote(e *engine) {
	d.stop(e)
	d.gone.add(e.stats())
	e.subs, e.bridges, e.started, e.silent = nil, nil, false, false
	e.precise = false
	if err := d.ix.SetMode(e.d.Addr, index.Approximate); err != nil {
		d.log.Error("set index mode", "engine", e.d.Addr, "err", err)
	}
}

// promote makes e precise again and follows its events.
func (d *Daemon) promote(ctx context.Context, e *engine) {
	e.precise = true
	if err := d.ix.SetMode(e.d.Addr, index.Precise); err != nil {
		d.log.Error("set index mode", "engine", e.d.Addr, "err", err)
	}
	if e.scraped && len(e.last.Models) > 0 {
		d.startEvents(ctx, e, e.last)
	}
}

// templateNotes are /readyz's lines about engines routed approximately for
// their templates.
func (d *Daemon) templateNotes() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for addr, e := range d.engines {
		if e.template.mismatch && d.eventful(e) {
			out = append(out, "engine "+addr+" is routed approximately: its chat template disagrees with the gateways' ("+agreements(e.template.agree)+")")
		}
	}
	slices.Sort(out)
	return out
}

func names(ts []prompt.Template) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.String()
	}
	return out
}

func agreements(as []verify.Agreement) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, "; ")
}

// newCheckClient is the HTTP client of template checks: its own, so that a
// slow engine never holds the scraper's connections.
func newCheckClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, IdleConnTimeout: time.Minute}}
}

// customTarget is the held template prompt.Custom stands for among e's
// targets: the one the gateways on chat_template custom named (the service
// counts a custom name as such only when cachesync holds it), else, on
// auto, the one e's model's engines render (shipped to the gateways). nil
// for neither, which no rendering agrees with. With d.mu held.
func (d *Daemon) customTarget(e *engine, fixed []prompt.Template, auto bool) *prompt.Jinja {
	if slices.Contains(fixed, prompt.Custom) {
		named := d.svc.GatewayCustom()
		for _, j := range d.customs {
			if j.Name() == named {
				return j
			}
		}
	}
	if auto {
		_, j := d.modelTemplate(e.template.rendering.Model)
		return j
	}
	return nil
}

// templateName names t as gateways do: custom by the held template's
// source hash.
func templateName(t prompt.Template, custom *prompt.Jinja) string {
	if t == prompt.Custom && custom != nil {
		return custom.Name()
	}
	return t.String()
}

// customNames names the custom templates cachesync holds.
func (d *Daemon) customNames() []string {
	out := make([]string, len(d.customs))
	for i, j := range d.customs {
		out[i] = j.Name()
	}
	return out
}
