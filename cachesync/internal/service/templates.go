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
	// customs are the names of the templates cachesync holds as source
	// (prompt.Jinja.Name), one of which a gateway on chat_template custom
	// names.
	customs []string
	mu      sync.Mutex
	seen    map[prompt.Template]time.Time
	auto    time.Time // when a gateway last named syncapi.AutoTemplate
	// named is the last held custom template a gateway named.
	named string
	// unknown is the last custom template a gateway named whose source
	// cachesync does not hold.
	unknown string
}

// GatewayCustom returns the name of the held custom template a gateway on
// chat_template custom last named, "" for none: the one prompt.Custom in
// GatewayTemplates stands for.
func (s *Server) GatewayCustom() string {
	g := &s.templates
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.named
}

// UnknownCustom returns the last custom template a gateway named that is
// none of those cachesync holds, "" for none.
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
	case slices.Contains(g.customs, name):
		t, g.named = prompt.Custom, name
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
