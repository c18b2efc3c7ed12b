package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"time"
)

// DefaultDNSInterval is how often DNS is asked again when
// DNS.Interval is zero.
const DefaultDNSInterval = 5 * time.Second

// DNS finds engines through the DNS records of a headless Service, asked
// again every Interval: the A and AAAA records of Name with a configured
// port, or, with Port 0, the SRV records of Name, which carry the port.
//
// An answer that the name does not exist (or has no such records) means
// there are no engines; any other failure keeps the engines last found, so
// that a DNS outage does not empty the index.
type DNS struct {
	// Name is looked up as given; a trailing dot skips the resolver's
	// search domains. For SRV, the usual form is _http._tcp.SERVICE.NS.svc.cluster.local.
	Name string
	// Port is the engines' HTTP port for A and AAAA records; 0 looks Name
	// up as SRV records instead.
	Port     int
	Events   EventPorts
	Interval time.Duration // 0 means DefaultDNSInterval
	// Resolver is the resolver to ask; nil means net.DefaultResolver.
	Resolver *net.Resolver
	Logger   *slog.Logger // nil means slog.Default()

	c counters
}

// Counters returns the source's running totals.
func (d *DNS) Counters() Counters { return d.c.load() }

// Run looks the name up now and every Interval until ctx ends.
func (d *DNS) Run(ctx context.Context, out chan<- []Engine) error {
	if d.Name == "" {
		return errors.New("discovery: dns: no name to look up")
	}
	if d.Port < 0 || d.Port > 65535 {
		return fmt.Errorf("discovery: dns: port %d out of range", d.Port)
	}
	if err := d.Events.Validate(); err != nil {
		return err
	}
	interval := d.Interval
	if interval <= 0 {
		interval = DefaultDNSInterval
	}
	log := d.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("discovery", "dns", "name", d.Name)
	snd := sender{out: out, c: &d.c}
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := false
	for {
		lctx, cancel := context.WithTimeout(ctx, interval)
		es, err := d.lookup(lctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			d.c.errors.Add(1)
			if !failing {
				log.Warn("lookup failed; keeping the engines last found", "err", err)
			}
			failing = true
		default:
			if failing {
				log.Info("lookup works again")
			}
			failing = false
			if !snd.send(ctx, es) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (d *DNS) resolver() *net.Resolver {
	if d.Resolver != nil {
		return d.Resolver
	}
	return net.DefaultResolver
}

// lookup returns the engines the records name now.
func (d *DNS) lookup(ctx context.Context) ([]Engine, error) {
	if d.Port != 0 {
		ips, err := d.ips(ctx, d.Name)
		if err != nil {
			return nil, err
		}
		es := make([]Engine, 0, len(ips))
		for _, ip := range ips {
			es = append(es, d.engine(ip, d.Port, d.Name))
		}
		return es, nil
	}
	_, srvs, err := d.resolver().LookupSRV(ctx, "", "", d.Name)
	if notFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("discovery: dns: SRV %s: %w", d.Name, err)
	}
	var es []Engine
	var errs []error
	for _, srv := range srvs {
		if srv.Port == 0 {
			continue // RFC 2782's way of saying no service here
		}
		ips, err := d.ips(ctx, srv.Target)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, ip := range ips {
			es = append(es, d.engine(ip, int(srv.Port), srv.Target))
		}
	}
	// A target that fails to resolve (rather than not existing) makes the
	// whole answer untrustworthy: dropping its engine would clear its index.
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return es, nil
}

// ips resolves name to addresses; a name that does not exist has none.
func (d *DNS) ips(ctx context.Context, name string) ([]netip.Addr, error) {
	ips, err := d.resolver().LookupNetIP(ctx, "ip", name)
	if notFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("discovery: dns: %s: %w", name, err)
	}
	for i := range ips {
		ips[i] = ips[i].Unmap()
	}
	return ips, nil
}

func (d *DNS) engine(ip netip.Addr, port int, name string) Engine {
	return Engine{
		Addr:   net.JoinHostPort(ip.String(), strconv.Itoa(port)),
		Name:   name,
		Events: d.Events.endpoints(ip),
	}
}

// notFound reports a lookup that succeeded in finding nothing.
func notFound(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de) && de.IsNotFound
}
