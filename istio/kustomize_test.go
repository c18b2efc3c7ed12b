package istio

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	extensions "istio.io/api/extensions/v1alpha1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// build runs kustomize, as kubectl apply -k does, over this directory in
// memory, with edit applied to kustomization.yaml first; it returns the
// documents built.
func build(t *testing.T, edit func(string) string) [][]byte {
	t.Helper()
	fs := filesys.MakeFsInMemory()
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range append(files, "inferencepool/kustomization.yaml") {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if f == "kustomization.yaml" && edit != nil {
			b = []byte(edit(string(b)))
		}
		if err := fs.WriteFile(filepath.Join("/istio", f), b); err != nil {
			t.Fatal(err)
		}
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, "/istio")
	if err != nil {
		t.Fatal(err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return splitDocuments(out)
}

// objects keys documents by kind, namespace and name, decoded to JSON
// values, so that two renderings of a manifest compare by what they mean.
func objects(t *testing.T, docs [][]byte) map[string]any {
	t.Helper()
	out := map[string]any{}
	for _, d := range docs {
		var v map[string]any
		if err := yaml.Unmarshal(d, &v); err != nil {
			t.Fatal(err)
		}
		meta, _ := v["metadata"].(map[string]any)
		out[v["kind"].(string)+" "+str(meta["namespace"])+"/"+str(meta["name"])] = v
	}
	return out
}

func str(v any) string { s, _ := v.(string); return s }

// TestKustomizeBuildsTheManifests: kustomize build of the kustomization as
// shipped gives exactly the manifests the other tests validate, and
// nothing else (its own ConfigMap stays local).
func TestKustomizeBuildsTheManifests(t *testing.T) {
	built := build(t, nil)
	var files [][]byte
	names, _ := filepath.Glob("*.yaml")
	for _, f := range names {
		if f == "kustomization.yaml" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, splitDocuments(b)...)
	}
	got, want := objects(t, built), objects(t, files)
	if len(got) != len(want) {
		t.Errorf("built %d objects, the manifests hold %d", len(got), len(want))
	}
	for k, w := range want {
		if !reflect.DeepEqual(got[k], w) {
			t.Errorf("%s built differs:\n got %v\nwant %v", k, got[k], w)
		}
	}
}

// engines edits the kustomization's values as a user would.
func engines(namespace, service, pool string, component bool) func(string) string {
	return func(k string) string {
		k = strings.Replace(k, "- namespace=llm", "- namespace="+namespace, 1)
		k = strings.Replace(k, "- service=vllm", "- service="+service, 1)
		k = strings.Replace(k, "- pool=vllm", "- pool="+pool, 1)
		if component {
			k = strings.Replace(k, "# components:\n# - inferencepool", "components:\n- inferencepool", 1)
		}
		return k
	}
}

// TestKustomizeNamesTheEngines: the two values are the only edits needed:
// every place the manifests name the engines follows them, and the result
// still decodes strictly into Istio's and Kubernetes' types.
func TestKustomizeNamesTheEngines(t *testing.T) {
	docs := build(t, engines("serving", "qwen", "unused", false))
	in := &install{}
	for i, d := range docs {
		if err := in.add(d); err != nil {
			t.Fatalf("document %d: %v", i+1, err)
		}
		if strings.Contains(string(d), "vllm") {
			t.Errorf("document %d still names vllm:\n%s", i+1, d)
		}
	}
	const host = "qwen.serving.svc.cluster.local"
	_, dest := in.engineRoute(t)
	if dest.GetHost() != host || in.destinationRules[0].Spec.GetHost() != host {
		t.Errorf("route to %q, DestinationRule for %q; want %s", dest.GetHost(), in.destinationRules[0].Spec.GetHost(), host)
	}
	clusterPatched := false
	for _, ef := range in.envoyFilters {
		for _, cp := range ef.Spec.GetConfigPatches() {
			if c := cp.GetMatch().GetCluster(); c != nil {
				clusterPatched = c.GetService() == host
			}
		}
	}
	if !clusterPatched {
		t.Error("the cluster patch does not match the engines' Service")
	}
	args := in.statefulSets[0].Spec.Template.Spec.Containers[0].Args
	if args[1] != "-k8s-service" || args[2] != "serving/qwen" {
		t.Errorf("cachesync args %v", args)
	}
	for _, ns := range []string{in.roles[0].Namespace, in.roleBindings[0].Namespace} {
		if ns != "serving" {
			t.Errorf("RBAC in namespace %q, want serving", ns)
		}
	}
}

// TestKustomizeInferencePool: with the component, cachesync discovers the
// engines from the pool, with the RBAC that needs.
func TestKustomizeInferencePool(t *testing.T) {
	in := &install{}
	for i, d := range build(t, engines("serving", "qwen", "qwen-pool", true)) {
		if err := in.add(d); err != nil {
			t.Fatalf("document %d: %v", i+1, err)
		}
	}
	args := in.statefulSets[0].Spec.Template.Spec.Containers[0].Args
	if args[1] != "-k8s-inference-pool" || args[2] != "serving/qwen-pool" || strings.Contains(strings.Join(args, " "), "-k8s-port") {
		t.Errorf("cachesync args %v", args)
	}
	var resources []string
	for _, r := range in.roles[0].Rules {
		resources = append(resources, r.Resources...)
	}
	if strings.Join(resources, ",") != "inferencepools,pods" || in.roles[0].Namespace != "serving" {
		t.Errorf("role in %s for %v", in.roles[0].Namespace, resources)
	}
}

// TestNoWasmPluginField is why the filter is installed with EnvoyFilters:
// neither of Istio's extension APIs (as of istio.io/api v1.32) can set
// allow_on_headers_stop_iteration, which the filter needs to hold the
// headers until it has read the body.
func TestNoWasmPluginField(t *testing.T) {
	seen := map[protoreflect.FullName]bool{}
	var walk func(md protoreflect.MessageDescriptor)
	walk = func(md protoreflect.MessageDescriptor) {
		if seen[md.FullName()] {
			return
		}
		seen[md.FullName()] = true
		fields := md.Fields()
		for i := range fields.Len() {
			f := fields.Get(i)
			if strings.Contains(string(f.Name()), "stop_iteration") || strings.Contains(string(f.Name()), "allow_on_headers") {
				t.Errorf("%s has %s: a WasmPlugin could carry the filter now", md.FullName(), f.Name())
			}
			if f.Message() != nil {
				walk(f.Message())
			}
		}
	}
	walk((&extensions.WasmPlugin{}).ProtoReflect().Descriptor())
	walk((&extensions.TrafficExtension{}).ProtoReflect().Descriptor())
	if len(seen) < 4 {
		t.Fatalf("walked %d messages", len(seen))
	}
}
