package daemon

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/cachesync/internal/index"
	"github.com/kvroute/kvroute/cachesync/internal/verify"
	"github.com/kvroute/kvroute/shared/prompt"
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
	fetched   time.Time         // when the last check started
	running   bool
	failure   string // the last check's error, once logged; "" when it went through

	// The verdict: against which gateway templates it was reached, their
	// agreements, and whether the engine was made approximate for it.
	against  []prompt.Template
	agree    []verify.Agreement
	mismatch bool
}

// agrees reports whether every template the gateways use agrees.
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
	addr      string
	rendering *verify.Rendering
	err       error
}

// checkable reports whether e's template matters: only a precise index
// depends on it.
func (d *Daemon) checkable(e *engine) bool {
	return d.vocab != nil && len(e.d.Events) > 0 && d.cfg.TemplateCheck >= 0
}

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
	addr, model := e.d.Addr, models[0]
	go func() {
		fetchCtx, cancel := context.WithTimeout(ctx, templateTimeout)
		r, err := verify.Fetch(fetchCtx, d.http, "http://"+addr, model, d.vocab)
		cancel()
		select {
		case d.checks <- checkResult{addr: addr, rendering: r, err: err}:
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
	if res.err != nil {
		// The last verdict stands: an engine that is restarting fails its
		// checks for a while, and that is no news about its template.
		if msg := res.err.Error(); msg != tc.failure {
			tc.failure = msg
			if errors.Is(res.err, verify.ErrUnsupported) {
				d.log.Info("engine cannot be asked how it renders chat prompts (no chat /tokenize); its template is assumed to match the gateways'", "engine", res.addr)
			} else {
				d.log.Warn("checking the engine's chat template failed; will retry", "engine", res.addr, "err", res.err)
			}
		}
		return
	}
	tc.failure = ""
	tc.rendering = res.rendering
	tc.against = nil // evaluate afresh
	d.judge(ctx, e)
}

// rejudge re-evaluates every engine whose verdict was reached against other
// gateway templates than those in use now. Called on the loop's tick.
func (d *Daemon) rejudge(ctx context.Context) {
	d.mu.Lock()
	defer d.mu.Unlock()
	want := d.svc.GatewayTemplates(d.gatewayWindow)
	if len(want) > 1 && !slices.Equal(want, d.warnedTemplates) {
		d.warnedTemplates = want
		d.log.Warn("gateways render prompts with different chat templates; an engine can agree with one of them at most, and is routed approximately", "templates", names(want))
	}
	for _, e := range d.engines {
		if e.template.rendering != nil && !slices.Equal(e.template.against, want) {
			d.judge(ctx, e)
		}
	}
}

// judge compares e's last rendering with the gateways' templates and moves
// the engine between precise and approximate indexing. With d.mu held.
func (d *Daemon) judge(ctx context.Context, e *engine) {
	tc := &e.template
	want := d.svc.GatewayTemplates(d.gatewayWindow)
	if len(want) == 0 {
		// No gateway has said how it renders yet: nothing to compare.
		return
	}
	wasAgreeing, first := tc.agrees(), tc.against == nil && tc.agree == nil
	tc.against = want
	tc.agree = tc.agree[:0]
	for _, t := range want {
		tc.agree = append(tc.agree, verify.Compare(tc.rendering, t))
	}
	agrees := tc.agrees()
	switch {
	case !agrees && !tc.mismatch:
		like := "none of kvroute's templates"
		if m := verify.Matching(tc.rendering); len(m) > 0 {
			like = strings.Join(names(m), ", ")
		}
		d.log.Warn("engine's chat template does not render prompts as the gateways do: routing it approximately, from the gateways' reports; set the gateways' chat_template to what the engine renders, or the engine's --chat-template",
			"engine", e.d.Addr, "model", tc.rendering.Model, "gateways", names(want), "differences", agreements(tc.agree), "engine_renders_like", like)
		tc.mismatch = true
		if e.precise {
			d.demote(e)
		}
	case agrees && tc.mismatch:
		d.log.Info("engine's chat template agrees with the gateways' again: routing it precisely", "engine", e.d.Addr, "gateways", names(want))
		tc.mismatch = false
		d.promote(ctx, e)
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
		if e.template.mismatch {
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
