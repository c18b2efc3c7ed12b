package discovery

import (
	"context"
	"os"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"
)

// poolManifest decodes testdata/inferencepool.yaml.
func poolManifest(t *testing.T) *unstructured.Unstructured {
	t.Helper()
	b, err := os.ReadFile("testdata/inferencepool.yaml")
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(b, &u.Object); err != nil {
		t.Fatal(err)
	}
	return u
}

func pod(name, ip string, labels map[string]string, ready bool) *corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "llm", Labels: labels},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}},
	}
}

func TestParseInferencePool(t *testing.T) {
	spec, err := ParseInferencePool(poolManifest(t))
	if err != nil {
		t.Fatal(err)
	}
	if spec.Selector.MatchLabels["app"] != "vllm-qwen" || spec.TargetPorts[0].Number != 8000 || spec.EndpointPickerRef.Name != "qwen-epp" {
		t.Errorf("spec %+v", spec)
	}
	for name, edit := range map[string]func(spec map[string]any){
		"an unknown field":   func(s map[string]any) { s["targetPortz"] = []any{} },
		"no selector labels": func(s map[string]any) { s["selector"] = map[string]any{"matchLabels": map[string]any{}} },
		"two target ports": func(s map[string]any) {
			s["targetPorts"] = []any{map[string]any{"number": 1}, map[string]any{"number": 2}}
		},
		"a port out of range":   func(s map[string]any) { s["targetPorts"] = []any{map[string]any{"number": 70000}} },
		"a selector expression": func(s map[string]any) { s["selector"].(map[string]any)["matchExpressions"] = []any{} },
	} {
		u := poolManifest(t)
		edit(u.Object["spec"].(map[string]any))
		if _, err := ParseInferencePool(u); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestInferencePoolDiscovery(t *testing.T) {
	ctx := context.Background()
	sel := map[string]string{"app": "vllm-qwen"}
	terminating := pod("qwen-3", "10.0.0.4", sel, false)
	terminating.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	pending := pod("qwen-4", "", sel, false)
	pending.Status.Phase = corev1.PodPending
	client := fake.NewClientset(
		pod("qwen-0", "10.0.0.1", sel, true),
		pod("qwen-1", "10.0.0.2", sel, false), // not ready: left out
		pod("qwen-2", "fd00::3", sel, true),
		terminating,
		pending,
		pod("llama-0", "10.0.0.9", map[string]string{"app": "vllm-llama"}, true),
	)
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{InferencePoolResource: "InferencePoolList"}, poolManifest(t))
	p := &InferencePool{Dynamic: dyn, Client: client, Namespace: "llm", Name: "qwen", Events: EventPorts{Pub: 5557}, Logger: discard}
	out := runSource(t, p)

	ev := func(h string) []EventEndpoint { return []EventEndpoint{{Pub: "tcp://" + h + ":5557"}} }
	want := []Engine{
		{Addr: "10.0.0.1:8000", Name: "qwen-0", Events: ev("10.0.0.1")},
		{Addr: "10.0.0.4:8000", Name: "qwen-3", Events: ev("10.0.0.4"), Draining: true},
		{Addr: "[fd00::3]:8000", Name: "qwen-2", Events: ev("[fd00::3]")},
	}
	if got := next(t, out); !reflect.DeepEqual(got, want) {
		t.Fatalf("first set\ngot  %+v\nwant %+v", got, want)
	}

	// qwen-1 turns ready.
	pods := client.CoreV1().Pods("llm")
	if _, err := pods.Update(ctx, pod("qwen-1", "10.0.0.2", sel, true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := next(t, out); len(got) != 4 || got[1].Addr != "10.0.0.2:8000" {
		t.Fatalf("after qwen-1 turned ready: %+v", got)
	}

	// The pool moves to another port and selects the llama pods.
	pools := dyn.Resource(InferencePoolResource).Namespace("llm")
	u := poolManifest(t)
	spec := u.Object["spec"].(map[string]any)
	spec["selector"] = map[string]any{"matchLabels": map[string]any{"app": "vllm-llama"}}
	spec["targetPorts"] = []any{map[string]any{"number": int64(8080)}}
	if _, err := pools.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want = []Engine{{Addr: "10.0.0.9:8080", Name: "llama-0", Events: ev("10.0.0.9")}}
	if got := next(t, out); !reflect.DeepEqual(got, want) {
		t.Fatalf("after the pool changed\ngot  %+v\nwant %+v", got, want)
	}

	// An invalid pool keeps the last engines and counts an error.
	spec["targetPorts"] = []any{}
	if _, err := pools.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	quiet(t, out, 300*time.Millisecond)
	if p.Counters().Errors == 0 {
		t.Error("an invalid pool counted no error")
	}
	// Deleted, likewise.
	if err := pools.Delete(ctx, "qwen", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	quiet(t, out, 300*time.Millisecond)
}
