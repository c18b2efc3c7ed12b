package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Static is a fixed list of engines.
type Static struct {
	Engines []Engine
	c       counters
}

// Run sends the list once and waits for ctx to end.
func (s *Static) Run(ctx context.Context, out chan<- []Engine) error {
	snd := sender{out: out, c: &s.c}
	if snd.send(ctx, clone(s.Engines)) {
		<-ctx.Done()
	}
	return nil
}

// Counters returns the source's running totals.
func (s *Static) Counters() Counters { return s.c.load() }

// ParseStatic parses a list of engines separated by commas or white space.
// Each engine is its HTTP address, optionally followed by options in URL
// query form:
//
//	ip:port[?events=PORT|tcp://HOST:PORT|listen|listen:tcp://HOST:PORT][&replay=PORT|tcp://HOST:PORT][&dp=N]
//
// events and replay give rank 0's PUB and replay sockets, as a port on
// the engine's IP or as an endpoint of their own, for engines whose
// publisher binds. events=listen is for an engine whose publisher
// connects: cachesync binds def.Listen (listen:ENDPOINT names another),
// shared by every such engine and told apart by topic. events=0 turns
// events off for that engine. dp is the number of data-parallel ranks;
// rank r uses both ports plus r. Options not given come from def.
// Examples:
//
//	10.0.0.1:8000,10.0.0.2:8000
//	10.0.0.1:8000?events=5557&replay=5600&dp=2
//	[fd00::7]:8000?events=tcp://[fd00::7]:6000
//	10.0.0.3:8000?events=listen:tcp://0.0.0.0:5557&replay=5558
func ParseStatic(spec string, def EventPorts) ([]Engine, error) {
	if err := def.Validate(); err != nil {
		return nil, err
	}
	var es []Engine
	seen := map[string]bool{}
	for _, item := range strings.FieldsFunc(spec, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' }) {
		e, err := parseEngine(item, def)
		if err != nil {
			return nil, err
		}
		if seen[e.Addr] {
			return nil, fmt.Errorf("discovery: engine %s listed twice", e.Addr)
		}
		seen[e.Addr] = true
		es = append(es, e)
	}
	if len(es) == 0 {
		return nil, errors.New("discovery: no engines in the static list")
	}
	return normalize(es), nil
}

func parseEngine(item string, def EventPorts) (Engine, error) {
	addr, opts, _ := strings.Cut(item, "?")
	ap, err := parseAddr(addr)
	if err != nil {
		return Engine{}, fmt.Errorf("discovery: %w", err)
	}
	q, err := url.ParseQuery(opts)
	if err != nil {
		return Engine{}, fmt.Errorf("discovery: engine %s: options %q: %w", addr, opts, err)
	}
	host := ap.Addr().String()
	s, err := def.sockets(ap.Addr())
	if err != nil {
		return Engine{}, fmt.Errorf("discovery: %w", err)
	}
	for k, vs := range q {
		if len(vs) != 1 {
			return Engine{}, fmt.Errorf("discovery: engine %s: option %s given %d times", addr, k, len(vs))
		}
		v := vs[0]
		switch k {
		case "events":
			if v == "0" {
				s.pub = 0
				if !q.Has("replay") {
					s.replay = 0 // the default replay port goes with the events
				}
				continue
			}
			if ep, ok := strings.CutPrefix(v, "listen"); ok {
				s.listen = true
				switch {
				case ep == "" && def.Listen == "":
					err = errors.New("events=listen: no events listen endpoint is configured (-events-listen); name one with events=listen:tcp://HOST:PORT")
				case ep == "":
					s.pubHost, s.pub, err = listenEndpoint(def.Listen)
				case strings.HasPrefix(ep, ":"):
					s.pubHost, s.pub, err = listenEndpoint(ep[1:])
				default:
					err = fmt.Errorf("events=%s: want listen or listen:tcp://HOST:PORT", v)
				}
			} else {
				s.listen = false
				s.pubHost, s.pub, err = socket(v, host)
			}
		case "replay":
			s.replayHost, s.replay, err = socket(v, host)
		case "dp":
			s.dp, err = strconv.Atoi(v)
			if err == nil && (s.dp < 1 || s.dp > 1024) {
				err = fmt.Errorf("dp=%d: want 1 to 1024", s.dp)
			}
		default:
			err = fmt.Errorf("unknown option %q (want events, replay or dp)", k)
		}
		if err != nil {
			return Engine{}, fmt.Errorf("discovery: engine %s: %w", addr, err)
		}
	}
	if err := s.validate(); err != nil {
		return Engine{}, fmt.Errorf("discovery: engine %s: %w", addr, err)
	}
	return Engine{Addr: ap.String(), Events: s.endpoints()}, nil
}

// socket parses an events or replay option: a port on host, or a
// tcp://HOST:PORT endpoint.
func socket(v, host string) (string, int, error) {
	if !strings.Contains(v, "://") {
		port, err := portOf(v)
		return host, port, err
	}
	u, err := url.Parse(v)
	if err != nil || u.Scheme != "tcp" || u.Hostname() == "" || u.Path != "" || u.RawQuery != "" {
		return "", 0, fmt.Errorf("endpoint %q: want tcp://HOST:PORT", v)
	}
	port, err := portOf(u.Port())
	if err != nil {
		return "", 0, fmt.Errorf("endpoint %q: %w", v, err)
	}
	return u.Hostname(), port, nil
}

// validate checks one engine's sockets as EventPorts.Validate does, when
// they share a host.
func (s sockets) validate() error {
	n := max(s.dp, 1)
	switch {
	case s.pub == 0 && s.replay != 0:
		return errors.New("a replay socket needs an events socket")
	case s.pub+n-1 > 65535 || s.replay+n-1 > 65535:
		return fmt.Errorf("ports %d and %d with %d ranks: out of range", s.pub, s.replay, n)
	case s.replay != 0 && sameHost(s.pubHost, s.replayHost) && s.replay < s.pub+n && s.pub < s.replay+n:
		return fmt.Errorf("events ports %d.. and replay ports %d.. overlap across %d ranks", s.pub, s.replay, n)
	}
	return nil
}

func sameHost(a, b string) bool {
	if ia, ib := net.ParseIP(a), net.ParseIP(b); ia != nil && ib != nil {
		return ia.Equal(ib)
	}
	return strings.EqualFold(a, b)
}
