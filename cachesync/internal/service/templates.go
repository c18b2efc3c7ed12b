package service

import (
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/syncapi"
)

// gatewayTemplates remembers the chat templates gateways render with: each
// names its own in its snapshot requests (syncapi.TemplateParam), and
// cachesync checks the engines against them. Only names kvroute knows are
// kept, so a stranger's query cannot grow the set.
type gatewayTemplates struct {
	// custom is the name of the template cachesync holds as source
	// (prompt.Jinja.Name), which a gateway on chat_template custom names.
	custom string
	mu     sync.Mutex
	seen   map[prompt.Template]time.Time
	auto   time.Time // when a gateway last named syncapi.AutoTemplate
	// unknown is the last custom template a gateway named whose source
	// cachesync does not hold.
	unknown string
}

// UnknownCustom returns the last custom template a gateway named that is
// not the one cachesync holds, "" for none.
func (s *Server) UnknownCustom() string {
	g := &s.templates
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.unknown
}

func (g *gatewayTemplates) saw(name string, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if name == syncapi.AutoTemplate {
		g.auto = now
		return
	}
	t, err := prompt.ParseTemplate(name)
	switch {
	case g.custom != "" && name == g.custom:
		t = prompt.Custom
	case err != nil || t == prompt.Custom:
		// A custom template whose source cachesync does not hold is
		// one it cannot check against.
		if strings.HasPrefix(name, prompt.CustomPrefix) {
			g.unknown = name
		}
		return
	}
	if g.seen == nil {
		g.seen = make(map[prompt.Template]time.Time)
	}
	g.seen[t] = now
}

// GatewayTemplates returns, in order, the chat templates gateways named in
// authorised snapshot requests within the last window, and whether some
// gateway named syncapi.AutoTemplate in it.
func (s *Server) GatewayTemplates(window time.Duration) (fixed []prompt.Template, auto bool) {
	g := &s.templates
	g.mu.Lock()
	defer g.mu.Unlock()
	for t, at := range g.seen {
		if time.Since(at) <= window {
			fixed = append(fixed, t)
		}
	}
	slices.Sort(fixed)
	return fixed, !g.auto.IsZero() && time.Since(g.auto) <= window
}
