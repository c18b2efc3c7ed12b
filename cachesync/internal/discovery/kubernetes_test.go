package discovery

import (
	"context"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// endpoint is a slice endpoint for pod with the given conditions (nil:
// unset, as the API allows).
func endpoint(pod, ip string, ready, serving, terminating *bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: ready, Serving: serving, Terminating: terminating},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "llm", Name: pod},
	}
}

func slice(name, service string, family discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "llm", Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: family,
		Ports:       ports,
		Endpoints:   eps,
	}
}

func port(name string, n int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr.To(name), Port: ptr.To(n), Protocol: ptr.To(corev1.ProtocolTCP)}
}

var (
	yes = ptr.To(true)
	no  = ptr.To(false)
)

func TestKubernetesEndpointSlices(t *testing.T) {
	ctx := context.Background()
	ports := []discoveryv1.EndpointPort{port("metrics", 9000), port("http", 8000)}
	client := fake.NewClientset(
		slice("vllm-a", "vllm", discoveryv1.AddressTypeIPv4, ports,
			endpoint("vllm-0", "127.0.1.1", yes, yes, no),
			endpoint("vllm-1", "127.0.1.2", nil, nil, nil), // unset conditions: ready
			endpoint("vllm-2", "127.0.1.3", no, no, no),    // starting: left out
			endpoint("vllm-3", "127.0.1.4", no, yes, yes),  // terminating, still serving
			endpoint("vllm-4", "127.0.1.5", no, no, yes)),  // terminating
		slice("vllm-b", "vllm", discoveryv1.AddressTypeIPv6, []discoveryv1.EndpointPort{port("http", 8080)},
			endpoint("vllm-5", "fd00::5", yes, yes, no)),
		slice("vllm-c", "vllm", discoveryv1.AddressTypeFQDN, ports,
			endpoint("vllm-6", "vllm-6.example", yes, yes, no)), // not an IP slice
		slice("other", "other", discoveryv1.AddressTypeIPv4, ports,
			endpoint("other-0", "127.0.2.1", yes, yes, no)),
	)
	k := &Kubernetes{Client: client, Namespace: "llm", Service: "vllm", PortName: "http",
		Events: EventPorts{Pub: 5557}, Logger: discard}
	out := runSource(t, k)

	ev := func(h string) []EventEndpoint { return []EventEndpoint{{Pub: "tcp://" + h + ":5557"}} }
	want := []Engine{
		{Addr: "127.0.1.1:8000", Name: "vllm-0", Events: ev("127.0.1.1")},
		{Addr: "127.0.1.2:8000", Name: "vllm-1", Events: ev("127.0.1.2")},
		{Addr: "127.0.1.4:8000", Name: "vllm-3", Events: ev("127.0.1.4"), Draining: true},
		{Addr: "127.0.1.5:8000", Name: "vllm-4", Events: ev("127.0.1.5"), Draining: true},
		{Addr: "[fd00::5]:8080", Name: "vllm-5", Events: ev("[fd00::5]")},
	}
	if got := next(t, out); !reflect.DeepEqual(got, want) {
		t.Fatalf("first set\ngot  %+v\nwant %+v", got, want)
	}

	slices := client.DiscoveryV1().EndpointSlices("llm")
	// vllm-0 starts terminating; vllm-2 becomes ready; vllm-4 is gone.
	a, err := slices.Get(ctx, "vllm-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a.Endpoints = []discoveryv1.Endpoint{
		endpoint("vllm-0", "127.0.1.1", no, yes, yes),
		endpoint("vllm-1", "127.0.1.2", nil, nil, nil),
		endpoint("vllm-2", "127.0.1.3", yes, yes, no),
		endpoint("vllm-3", "127.0.1.4", no, yes, yes),
	}
	if _, err := slices.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want = []Engine{
		{Addr: "127.0.1.1:8000", Name: "vllm-0", Events: ev("127.0.1.1"), Draining: true},
		{Addr: "127.0.1.2:8000", Name: "vllm-1", Events: ev("127.0.1.2")},
		{Addr: "127.0.1.3:8000", Name: "vllm-2", Events: ev("127.0.1.3")},
		{Addr: "127.0.1.4:8000", Name: "vllm-3", Events: ev("127.0.1.4"), Draining: true},
		{Addr: "[fd00::5]:8080", Name: "vllm-5", Events: ev("[fd00::5]")},
	}
	if got := next(t, out); !reflect.DeepEqual(got, want) {
		t.Fatalf("after an update\ngot  %+v\nwant %+v", got, want)
	}

	// A slice of another service changes: nothing to send.
	o, err := slices.Get(ctx, "other", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	o.Endpoints = nil
	if _, err := slices.Update(ctx, o, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The IPv6 slice goes; a new slice brings an endpoint that also sits,
	// terminating, in vllm-a (a pod moving between slices): the ready
	// listing wins.
	if err := slices.Delete(ctx, "vllm-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := slices.Create(ctx, slice("vllm-d", "vllm", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port("http", 8000)},
		endpoint("vllm-3", "127.0.1.4", yes, yes, no)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want = []Engine{
		{Addr: "127.0.1.1:8000", Name: "vllm-0", Events: ev("127.0.1.1"), Draining: true},
		{Addr: "127.0.1.2:8000", Name: "vllm-1", Events: ev("127.0.1.2")},
		{Addr: "127.0.1.3:8000", Name: "vllm-2", Events: ev("127.0.1.3")},
		{Addr: "127.0.1.4:8000", Name: "vllm-3", Events: ev("127.0.1.4")},
	}
	var got []Engine
	// The delete and the create may arrive as one change or as two.
	for got = next(t, out); !reflect.DeepEqual(got, want) && len(got) == 4; got = next(t, out) {
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("after a delete and a create\ngot  %+v\nwant %+v", got, want)
	}

	// Every slice gone: no engines.
	for _, name := range []string{"vllm-a", "vllm-c", "vllm-d"} {
		if err := slices.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for got = next(t, out); len(got) != 0; got = next(t, out) {
	}
	quiet(t, out, 50*time.Millisecond)
}

func TestKubernetesPortChoice(t *testing.T) {
	tests := []struct {
		name     string
		portName string
		ports    []discoveryv1.EndpointPort
		want     []Engine
	}{
		{"the only port, unnamed", "", []discoveryv1.EndpointPort{{Port: ptr.To[int32](8000)}},
			[]Engine{{Addr: "127.0.1.1:8000", Name: "vllm-0"}}},
		{"the only port, named", "", []discoveryv1.EndpointPort{port("http", 8001)},
			[]Engine{{Addr: "127.0.1.1:8001", Name: "vllm-0"}}},
		{"two ports and no name", "", []discoveryv1.EndpointPort{port("http", 8000), port("metrics", 9000)}, nil},
		{"by name", "metrics", []discoveryv1.EndpointPort{port("http", 8000), port("metrics", 9000)},
			[]Engine{{Addr: "127.0.1.1:9000", Name: "vllm-0"}}},
		{"name missing", "grpc", []discoveryv1.EndpointPort{port("http", 8000)}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset(slice("s", "vllm", discoveryv1.AddressTypeIPv4, tt.ports,
				endpoint("vllm-0", "127.0.1.1", yes, yes, no)))
			k := &Kubernetes{Client: client, Namespace: "llm", Service: "vllm", PortName: tt.portName, Logger: discard}
			if got := next(t, runSource(t, k)); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestKubernetesConfigErrors(t *testing.T) {
	client := fake.NewClientset()
	for _, k := range []*Kubernetes{
		{Namespace: "llm", Service: "vllm"},
		{Client: client, Service: "vllm"},
		{Client: client, Namespace: "llm", Service: "vllm", Events: EventPorts{Pub: 70000}},
		{Client: client, Namespace: "llm", Service: "vllm", Events: EventPorts{Pub: 5557, Listen: "tcp://*:5557"}},
	} {
		if err := k.Run(context.Background(), nil); err == nil {
			t.Errorf("Run(%+v) started", k)
		}
	}
}
