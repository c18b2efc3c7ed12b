package service

import (
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/shared/prompt"
)

// gatewayTemplates remembers the chat templates gateways render with: each
// names its own in its snapshot requests (syncapi.TemplateParam), and
// cachesync checks the engines against them. Only names kvroute knows are
// kept, so a stranger's query cannot grow the set.
type gatewayTemplates struct {
	mu   sync.Mutex
	seen map[prompt.Template]time.Time
}

func (g *gatewayTemplates) saw(name string, now time.Time) {
	t, err := prompt.ParseTemplate(name)
	if err != nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.seen == nil {
		g.seen = make(map[prompt.Template]time.Time)
	}
	g.seen[t] = now
}

// GatewayTemplates returns, in order, the chat templates gateways named in
// authorised snapshot requests within the last window.
func (s *Server) GatewayTemplates(window time.Duration) []prompt.Template {
	g := &s.templates
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []prompt.Template
	for t, at := range g.seen {
		if time.Since(at) <= window {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out
}
