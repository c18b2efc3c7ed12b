package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Kubernetes finds engines through the EndpointSlices of a Service, with a
// client-go informer, so changes arrive as the API server makes them.
//
// Conditions map to engines as the EndpointSlice API defines them: a ready
// endpoint (ready unset counts as ready) is an engine; a terminating one is
// a draining engine, kept while the slice lists it so that its in-flight
// work still counts; an endpoint neither ready nor terminating (a pod
// starting or failing its readiness probe) is left out.
type Kubernetes struct {
	Client    kubernetes.Interface
	Namespace string
	Service   string
	// PortName picks the HTTP port among the slice's ports by name; ""
	// takes the slice's only port.
	PortName string
	Events   EventPorts
	// Resync replays the informer's cache this often as a safety net; 0
	// turns it off.
	Resync time.Duration
	Logger *slog.Logger // nil means slog.Default()

	c counters
}

// Counters returns the source's running totals.
func (k *Kubernetes) Counters() Counters { return k.c.load() }

// Run watches the Service's EndpointSlices until ctx ends. It sends the
// first set once the informer has listed the slices.
func (k *Kubernetes) Run(ctx context.Context, out chan<- []Engine) error {
	switch {
	case k.Client == nil:
		return errors.New("discovery: kubernetes: no client")
	case k.Namespace == "" || k.Service == "":
		return errors.New("discovery: kubernetes: namespace and service are required")
	}
	if err := k.Events.Validate(); err != nil {
		return err
	}
	log := k.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("discovery", "kubernetes", "service", k.Namespace+"/"+k.Service)

	selector := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: k.Service})
	factory := informers.NewSharedInformerFactoryWithOptions(k.Client, k.Resync,
		informers.WithNamespace(k.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector.String() }))
	slices := factory.Discovery().V1().EndpointSlices()
	informer := slices.Informer()
	changed := make(chan struct{}, 1)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(any, any) { poke() },
		DeleteFunc: func(any) { poke() },
	}); err != nil {
		return fmt.Errorf("discovery: kubernetes: %w", err)
	}
	if err := informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		k.c.errors.Add(1)
		log.Warn("watch failed; retrying", "err", err)
	}); err != nil {
		return fmt.Errorf("discovery: kubernetes: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return nil // ctx ended first
	}

	lister := slices.Lister().EndpointSlices(k.Namespace)
	snd := sender{out: out, c: &k.c}
	for {
		list, err := lister.List(selector)
		if err != nil {
			return fmt.Errorf("discovery: kubernetes: listing slices: %w", err)
		}
		if !snd.send(ctx, k.engines(list, log)) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// engines merges the slices' endpoints into one set.
func (k *Kubernetes) engines(list []*discoveryv1.EndpointSlice, log *slog.Logger) []Engine {
	var es []Engine
	for _, s := range list {
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		port, ok := k.port(s)
		if !ok {
			log.Warn("slice has no such port", "slice", s.Name, "port", k.PortName)
			continue
		}
		for _, ep := range s.Endpoints {
			ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			terminating := ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
			if len(ep.Addresses) == 0 || (!ready && !terminating) {
				continue
			}
			// All of an endpoint's addresses are the same pod; the API
			// asks consumers to use the first.
			ip, err := netip.ParseAddr(ep.Addresses[0])
			if err != nil {
				log.Warn("bad endpoint address", "slice", s.Name, "address", ep.Addresses[0])
				continue
			}
			ip = ip.Unmap()
			e := Engine{
				Addr:     netip.AddrPortFrom(ip, uint16(port)).String(),
				Events:   k.Events.endpoints(ip),
				Draining: terminating,
			}
			if ep.TargetRef != nil {
				e.Name = ep.TargetRef.Name
			}
			es = append(es, e)
		}
	}
	return es
}

// port finds the HTTP port of a slice.
func (k *Kubernetes) port(s *discoveryv1.EndpointSlice) (int, bool) {
	for _, p := range s.Ports {
		if p.Port == nil || *p.Port < 1 || *p.Port > 65535 {
			continue
		}
		if name := ptrString(p.Name); name == k.PortName || (k.PortName == "" && len(s.Ports) == 1) {
			return int(*p.Port), true
		}
	}
	return 0, false
}

func ptrString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
