package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// InferencePoolResource is the Gateway API Inference Extension's
// InferencePool, version v1.
var InferencePoolResource = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// InferencePoolSpec is the part of an InferencePool's spec that names its
// engines (inference.networking.k8s.io/v1): the pods of the pool's
// namespace its selector matches, on its target port. The endpoint picker
// it names is kvroute's to replace, and is read only to be ignored.
type InferencePoolSpec struct {
	Selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
	TargetPorts []struct {
		Number int32 `json:"number"`
	} `json:"targetPorts"`
	EndpointPickerRef struct {
		Group       *string `json:"group,omitempty"`
		Kind        string  `json:"kind,omitempty"`
		Name        string  `json:"name,omitempty"`
		PortNumber  *int32  `json:"portNumber,omitempty"`
		FailureMode string  `json:"failureMode,omitempty"`
	} `json:"endpointPickerRef"`
}

// ParseInferencePool decodes an InferencePool's spec strictly: an unknown
// field (a newer or older API version's) is an error, not a guess.
func ParseInferencePool(u *unstructured.Unstructured) (InferencePoolSpec, error) {
	var spec InferencePoolSpec
	raw, ok := u.Object["spec"].(map[string]any)
	if !ok {
		return spec, errors.New("inferencepool: no spec")
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(raw, &spec, true); err != nil {
		return spec, fmt.Errorf("inferencepool %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	switch {
	case len(spec.Selector.MatchLabels) == 0:
		return spec, fmt.Errorf("inferencepool %s/%s: selector.matchLabels is empty", u.GetNamespace(), u.GetName())
	case len(spec.TargetPorts) != 1 || spec.TargetPorts[0].Number < 1 || spec.TargetPorts[0].Number > 65535:
		return spec, fmt.Errorf("inferencepool %s/%s: want one target port in 1-65535", u.GetNamespace(), u.GetName())
	}
	return spec, nil
}

// InferencePool finds engines the way a Gateway API Inference Extension
// gateway does: it watches one InferencePool and the pods of its namespace,
// and the engines are the pods the pool's selector matches, at their pod
// IP and the pool's target port. A ready pod is an engine, a terminating
// one with an IP is a draining engine, any other is left out. A pool that
// is missing or invalid leaves the last good set in place (and counts an
// error) rather than dropping every engine.
type InferencePool struct {
	Dynamic   dynamic.Interface
	Client    kubernetes.Interface
	Namespace string
	Name      string
	Events    EventPorts
	// Resync replays the informers' caches this often; 0 turns it off.
	Resync time.Duration
	Logger *slog.Logger // nil means slog.Default()

	c counters
}

// Counters returns the source's running totals.
func (p *InferencePool) Counters() Counters { return p.c.load() }

// Run watches the pool and its pods until ctx ends. It sends the first
// set once both informers have listed.
func (p *InferencePool) Run(ctx context.Context, out chan<- []Engine) error {
	switch {
	case p.Dynamic == nil || p.Client == nil:
		return errors.New("discovery: inferencepool: no client")
	case p.Namespace == "" || p.Name == "":
		return errors.New("discovery: inferencepool: namespace and name are required")
	}
	if err := p.Events.Validate(); err != nil {
		return err
	}
	log := p.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("discovery", "inferencepool", "pool", p.Namespace+"/"+p.Name)

	changed := make(chan struct{}, 1)
	poke := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { signal(changed) },
		UpdateFunc: func(any, any) { signal(changed) },
		DeleteFunc: func(any) { signal(changed) },
	}
	watchErr := func(_ context.Context, _ *cache.Reflector, err error) {
		p.c.errors.Add(1)
		log.Warn("watch failed; retrying", "err", err)
	}
	pools := dynamicinformer.NewFilteredDynamicSharedInformerFactory(p.Dynamic, p.Resync, p.Namespace,
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", p.Name).String()
		})
	poolInformer := pools.ForResource(InferencePoolResource)
	pods := informers.NewSharedInformerFactoryWithOptions(p.Client, p.Resync, informers.WithNamespace(p.Namespace))
	podInformer := pods.Core().V1().Pods()
	for _, inf := range []cache.SharedIndexInformer{poolInformer.Informer(), podInformer.Informer()} {
		if _, err := inf.AddEventHandler(poke); err != nil {
			return fmt.Errorf("discovery: inferencepool: %w", err)
		}
		if err := inf.SetWatchErrorHandlerWithContext(watchErr); err != nil {
			return fmt.Errorf("discovery: inferencepool: %w", err)
		}
	}
	pools.Start(ctx.Done())
	pods.Start(ctx.Done())
	defer pools.Shutdown()
	defer pods.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), poolInformer.Informer().HasSynced, podInformer.Informer().HasSynced) {
		return nil
	}

	snd := sender{out: out, c: &p.c}
	var spec *InferencePoolSpec
	var lastErr string
	for {
		next, err := p.pool(poolInformer.Lister())
		switch {
		case err != nil && err.Error() != lastErr:
			p.c.errors.Add(1)
			log.Warn("pool unusable; keeping the last engines", "err", err)
		case err == nil:
			spec = &next
		}
		lastErr = ""
		if err != nil {
			lastErr = err.Error()
		}
		if spec != nil {
			list, err := podInformer.Lister().Pods(p.Namespace).List(labels.SelectorFromSet(spec.Selector.MatchLabels))
			if err != nil {
				return fmt.Errorf("discovery: inferencepool: listing pods: %w", err)
			}
			if !snd.send(ctx, p.engines(list, int(spec.TargetPorts[0].Number))) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

func signal(c chan<- struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// pool reads the watched pool's spec from the informer's cache.
func (p *InferencePool) pool(lister cache.GenericLister) (InferencePoolSpec, error) {
	obj, err := lister.ByNamespace(p.Namespace).Get(p.Name)
	if err != nil {
		return InferencePoolSpec{}, fmt.Errorf("inferencepool %s/%s: %w", p.Namespace, p.Name, err)
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return InferencePoolSpec{}, fmt.Errorf("inferencepool %s/%s: unexpected %T", p.Namespace, p.Name, obj)
	}
	return ParseInferencePool(u)
}

// engines maps the selected pods to engines, in name order.
func (p *InferencePool) engines(pods []*corev1.Pod, port int) []Engine {
	slices.SortFunc(pods, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	var es []Engine
	for _, pod := range pods {
		ip, err := netip.ParseAddr(pod.Status.PodIP)
		if err != nil || pod.Status.Phase != corev1.PodRunning {
			continue
		}
		terminating := pod.DeletionTimestamp != nil
		if !terminating && !podReady(pod) {
			continue
		}
		ip = ip.Unmap()
		es = append(es, Engine{
			Addr:     netip.AddrPortFrom(ip, uint16(port)).String(),
			Name:     pod.Name,
			Events:   p.Events.endpoints(ip),
			Draining: terminating,
		})
	}
	return es
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
