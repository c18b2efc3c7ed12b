package istio

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	wasmfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	apinet "istio.io/api/networking/v1alpha3"
	netv1 "istio.io/client-go/pkg/apis/networking/v1"
	netv1alpha3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	// The fallback policy's type, for protojson's Any.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
)

const (
	wasmType          = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
	destinationHeader = "x-gateway-destination-endpoint"
)

// install is everything the manifests declare, decoded strictly into the
// API types Istio and Envoy use.
type install struct {
	gateways         []*netv1.Gateway
	virtualServices  []*netv1.VirtualService
	destinationRules []*netv1.DestinationRule
	envoyFilters     []*netv1alpha3.EnvoyFilter
	// cachesync.yaml's Kubernetes objects.
	statefulSets    []*appsv1.StatefulSet
	services        []*corev1.Service
	serviceAccounts []*corev1.ServiceAccount
	secrets         []*corev1.Secret
	roles           []*rbacv1.Role
	roleBindings    []*rbacv1.RoleBinding
	// patches holds each EnvoyFilter patch value decoded into the Envoy
	// type its applyTo names, in file order.
	patches []patch
}

type patch struct {
	filter string // the EnvoyFilter's name
	spec   *apinet.EnvoyFilter_EnvoyConfigObjectPatch
	value  proto.Message
}

// loadInstall reads every manifest in the package directory.
func loadInstall(t testing.TB) *install {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	in := &install{}
	for _, f := range files {
		if f == "kustomization.yaml" {
			continue // kustomize's, not the cluster's: kustomize_test.go
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range splitDocuments(b) {
			if err := in.add(doc); err != nil {
				t.Fatalf("%s, document %d: %v", f, i+1, err)
			}
		}
	}
	return in
}

// splitDocuments splits a YAML stream at its "---" lines, dropping
// documents that hold only comments.
func splitDocuments(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(append([]byte("\n"), b...), []byte("\n---\n")) {
		for _, line := range bytes.Split(d, []byte("\n")) {
			if l := bytes.TrimSpace(line); len(l) > 0 && l[0] != '#' {
				docs = append(docs, d)
				break
			}
		}
	}
	return docs
}

func (in *install) add(doc []byte) error {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return err
	}
	switch head.APIVersion + " " + head.Kind {
	case "networking.istio.io/v1 Gateway":
		var g netv1.Gateway
		if err := decode(doc, &g, &g.Spec); err != nil {
			return err
		}
		in.gateways = append(in.gateways, &g)
	case "networking.istio.io/v1 VirtualService":
		var vs netv1.VirtualService
		if err := decode(doc, &vs, &vs.Spec); err != nil {
			return err
		}
		in.virtualServices = append(in.virtualServices, &vs)
	case "networking.istio.io/v1 DestinationRule":
		var dr netv1.DestinationRule
		if err := decode(doc, &dr, &dr.Spec); err != nil {
			return err
		}
		in.destinationRules = append(in.destinationRules, &dr)
	case "networking.istio.io/v1alpha3 EnvoyFilter":
		var ef netv1alpha3.EnvoyFilter
		if err := decode(doc, &ef, &ef.Spec); err != nil {
			return err
		}
		in.envoyFilters = append(in.envoyFilters, &ef)
		for i, p := range ef.Spec.GetConfigPatches() {
			v, err := envoyValue(p)
			if err != nil {
				return fmt.Errorf("EnvoyFilter %s, patch %d (%s): %w", ef.Name, i, p.GetApplyTo(), err)
			}
			in.patches = append(in.patches, patch{filter: ef.Name, spec: p, value: v})
		}
	case "apps/v1 StatefulSet":
		return strict(doc, &in.statefulSets)
	case "v1 Service":
		return strict(doc, &in.services)
	case "v1 ServiceAccount":
		return strict(doc, &in.serviceAccounts)
	case "v1 Secret":
		return strict(doc, &in.secrets)
	case "rbac.authorization.k8s.io/v1 Role":
		return strict(doc, &in.roles)
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		return strict(doc, &in.roleBindings)
	default:
		return fmt.Errorf("unexpected %s %s", head.APIVersion, head.Kind)
	}
	return nil
}

// strict decodes a Kubernetes object into a new T, rejecting unknown fields,
// and appends it to list.
func strict[T any](doc []byte, list *[]*T) error {
	v := new(T)
	if err := yaml.UnmarshalStrict(doc, v); err != nil {
		return err
	}
	*list = append(*list, v)
	return nil
}

// decode unmarshals a Kubernetes object strictly. Istio's generated types
// decode spec leniently (they allow unknown fields), so the spec is decoded
// a second time with protojson, which rejects them.
func decode(doc []byte, obj any, spec proto.Message) error {
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return err
	}
	var raw struct {
		Spec json.RawMessage `json:"spec"`
	}
	if err := yaml.Unmarshal(doc, &raw); err != nil {
		return err
	}
	if len(raw.Spec) == 0 {
		return fmt.Errorf("no spec")
	}
	if err := protojson.Unmarshal(raw.Spec, spec); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	return nil
}

// envoyValue decodes a patch's value into the Envoy message its applyTo
// patches, rejecting unknown fields and unresolvable Any types. Complete
// objects (anything but a MERGE) must also pass Envoy's field constraints;
// a MERGE value is checked once merged (see envoy_test.go).
func envoyValue(p *apinet.EnvoyFilter_EnvoyConfigObjectPatch) (proto.Message, error) {
	var msg proto.Message
	switch p.GetApplyTo() {
	case apinet.EnvoyFilter_EXTENSION_CONFIG:
		msg = &corev3.TypedExtensionConfig{}
	case apinet.EnvoyFilter_HTTP_FILTER:
		msg = &hcmv3.HttpFilter{}
	case apinet.EnvoyFilter_HTTP_ROUTE:
		msg = &routev3.Route{}
	case apinet.EnvoyFilter_CLUSTER:
		msg = &clusterv3.Cluster{}
	default:
		return nil, fmt.Errorf("no Envoy type known for this patch")
	}
	if p.GetPatch().GetValue() == nil {
		return nil, fmt.Errorf("patch has no value")
	}
	b, err := protojson.Marshal(p.GetPatch().GetValue())
	if err != nil {
		return nil, err
	}
	if err := protojson.Unmarshal(b, msg); err != nil {
		return nil, err
	}
	if p.GetPatch().GetOperation() != apinet.EnvoyFilter_Patch_MERGE {
		if err := validate(msg); err != nil {
			return nil, err
		}
	}
	return msg, nil
}

// validate runs the protoc-gen-validate rules Envoy enforces on load.
func validate(m proto.Message) error {
	v, ok := m.(interface{ ValidateAll() error })
	if !ok {
		return fmt.Errorf("%T has no validation rules", m)
	}
	return v.ValidateAll()
}

// only returns the single patch of kind applyTo.
func (in *install) only(t testing.TB, applyTo apinet.EnvoyFilter_ApplyTo) patch {
	t.Helper()
	var found []patch
	for _, p := range in.patches {
		if p.spec.GetApplyTo() == applyTo {
			found = append(found, p)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d %s patches, want 1", len(found), applyTo)
	}
	return found[0]
}

// merged returns the one patch of kind applyTo that merges into an object
// istiod makes (not one that adds its own).
func (in *install) merged(t testing.TB, applyTo apinet.EnvoyFilter_ApplyTo) patch {
	t.Helper()
	var found []patch
	for _, p := range in.patches {
		if p.spec.GetApplyTo() == applyTo && p.spec.GetPatch().GetOperation() == apinet.EnvoyFilter_Patch_MERGE {
			found = append(found, p)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d %s MERGE patches, want 1", len(found), applyTo)
	}
	return found[0]
}

// wasm returns the Wasm extension the EXTENSION_CONFIG patch defines.
func (in *install) wasm(t testing.TB) (*corev3.TypedExtensionConfig, *wasmv3.PluginConfig) {
	t.Helper()
	ext := in.only(t, apinet.EnvoyFilter_EXTENSION_CONFIG).value.(*corev3.TypedExtensionConfig)
	var w wasmfilterv3.Wasm
	if err := ext.GetTypedConfig().UnmarshalTo(&w); err != nil {
		t.Fatalf("extension %s: %v", ext.GetName(), err)
	}
	return ext, w.GetConfig()
}

// engineRoute returns the VirtualService's HTTP route and its destination.
func (in *install) engineRoute(t testing.TB) (*apinet.HTTPRoute, *apinet.Destination) {
	t.Helper()
	if len(in.virtualServices) != 1 {
		t.Fatalf("%d VirtualServices, want 1", len(in.virtualServices))
	}
	routes := in.virtualServices[0].Spec.GetHttp()
	if len(routes) != 1 || len(routes[0].GetRoute()) != 1 {
		t.Fatalf("want one HTTP route with one destination, have %v", routes)
	}
	return routes[0], routes[0].GetRoute()[0].GetDestination()
}

func TestManifestsDecodeStrictly(t *testing.T) {
	in := loadInstall(t)
	if len(in.gateways) != 1 || len(in.virtualServices) != 1 || len(in.envoyFilters) != 2 {
		t.Fatalf("manifests declare %d Gateways, %d VirtualServices, %d EnvoyFilters; want 1, 1, 2",
			len(in.gateways), len(in.virtualServices), len(in.envoyFilters))
	}
	// The decoder must actually be strict, or this test proves nothing.
	bad := []string{
		"apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: x}\nspec: {configPatchez: []}\n",
		"apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: x, labelz: {}}\nspec: {}\n",
		"apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: x}\nspec: {configPatches: [{applyTo: CLUSTER, patch: {operation: MERGE, value: {lb_polcy: ROUND_ROBIN}}}]}\n",
		"apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: x}\nspec: {configPatches: [{applyTo: HTTP_FILTER, patch: {operation: INSERT_BEFORE, value: {name: f, typed_config: {'@type': type.googleapis.com/no.such.Type}}}}]}\n",
		"apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: x}\nspec: {configPatches: [{applyTo: HTTP_FILTER, patch: {operation: INSERT_BEFORE, value: {typed_config: {'@type': type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm}}}}]}\n",
		"apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: x}\nspec: {http: [{rout: []}]}\n",
	}
	for _, doc := range bad {
		if err := (&install{}).add([]byte(doc)); err == nil {
			t.Errorf("accepted:\n%s", doc)
		}
	}
}

func TestWasmExtension(t *testing.T) {
	in := loadInstall(t)
	ext, pc := in.wasm(t)
	if !pc.GetAllowOnHeadersStopIteration().GetValue() {
		t.Error("allow_on_headers_stop_iteration is not true: Envoy would never hand the filter the body")
	}
	if got := pc.GetVmConfig().GetRuntime(); got != "envoy.wasm.runtime.v8" {
		t.Errorf("runtime %q, want V8 (the only one in official builds)", got)
	}
	if pc.GetFailurePolicy() != wasmv3.FailurePolicy_FAIL_RELOAD {
		t.Errorf("failure_policy %v, want FAIL_RELOAD", pc.GetFailurePolicy())
	}
	uri := pc.GetVmConfig().GetCode().GetRemote().GetHttpUri().GetUri()
	if !strings.HasPrefix(uri, "oci://") {
		t.Errorf("module URL %q: istio-agent fetches oci:// images", uri)
	}
	var sv wrapperspb.StringValue
	if err := pc.GetConfiguration().UnmarshalTo(&sv); err != nil {
		t.Fatalf("plugin configuration: %v (the filter reads a JSON string)", err)
	}
	if !json.Valid([]byte(sv.GetValue())) {
		t.Errorf("plugin configuration is not JSON: %s", sv.GetValue())
	}

	filter := in.only(t, apinet.EnvoyFilter_HTTP_FILTER)
	hf := filter.value.(*hcmv3.HttpFilter)
	if hf.GetName() != ext.GetName() {
		t.Errorf("HTTP filter %q does not name the extension %q", hf.GetName(), ext.GetName())
	}
	cd := hf.GetConfigDiscovery()
	if cd.GetConfigSource().GetAds() == nil || len(cd.GetTypeUrls()) != 1 || cd.GetTypeUrls()[0] != wasmType {
		t.Errorf("HTTP filter's config_discovery %v: want ADS serving %s", cd, wasmType)
	}
	if filter.spec.GetPatch().GetOperation() != apinet.EnvoyFilter_Patch_INSERT_BEFORE ||
		filter.spec.GetMatch().GetListener().GetFilterChain().GetFilter().GetSubFilter().GetName() != "envoy.filters.http.router" {
		t.Errorf("the filter is not inserted before the router: %v", filter.spec)
	}
}

// TestRouteRetriesRefusedConnections: the route retries what an engine
// refused before reading it, which is what makes the filter's ordered
// destination list useful, and nothing that may have generated tokens.
func TestRouteRetriesRefusedConnections(t *testing.T) {
	route, _ := loadInstall(t).engineRoute(t)
	r := route.GetRetries()
	if r.GetAttempts() != 1 || r.GetRetryOn() != "connect-failure,refused-stream,reset-before-request" {
		t.Errorf("route retries %v: want one attempt on refused connections only", r)
	}
}

func TestPatchesMatchTheRoute(t *testing.T) {
	in := loadInstall(t)
	route, dest := in.engineRoute(t)
	gw := in.gateways[0]
	for _, ef := range in.envoyFilters {
		if got, want := ef.Spec.GetWorkloadSelector().GetLabels(), gw.Spec.GetSelector(); !sameLabels(got, want) {
			t.Errorf("EnvoyFilter %s selects %v, the Gateway %v", ef.Name, got, want)
		}
		if ef.Namespace != gw.Namespace {
			t.Errorf("EnvoyFilter %s is in namespace %q, the gateway in %q", ef.Name, ef.Namespace, gw.Namespace)
		}
	}
	for _, p := range in.patches {
		if p.spec.GetApplyTo() != apinet.EnvoyFilter_EXTENSION_CONFIG && p.spec.GetMatch().GetContext() != apinet.EnvoyFilter_GATEWAY {
			t.Errorf("%s patch of %s has context %v, want GATEWAY", p.spec.GetApplyTo(), p.filter, p.spec.GetMatch().GetContext())
		}
	}

	cl := in.merged(t, apinet.EnvoyFilter_CLUSTER)
	m := cl.spec.GetMatch().GetCluster()
	if m.GetService() != dest.GetHost() || m.GetPortNumber() != dest.GetPort().GetNumber() {
		t.Errorf("cluster patch matches %s:%d, the route goes to %s:%d",
			m.GetService(), m.GetPortNumber(), dest.GetHost(), dest.GetPort().GetNumber())
	}
	policies := cl.value.(*clusterv3.Cluster).GetLoadBalancingPolicy().GetPolicies()
	if len(policies) != 1 {
		t.Fatalf("cluster patch sets %d load-balancing policies, want override_host alone", len(policies))
	}
	var oh overridehostv3.OverrideHost
	if err := policies[0].GetTypedExtensionConfig().GetTypedConfig().UnmarshalTo(&oh); err != nil {
		t.Fatalf("cluster policy: %v", err)
	}
	if src := oh.GetOverrideHostSources(); len(src) != 1 || src[0].GetHeader() != destinationHeader {
		t.Errorf("override_host reads %v, want the header %s", src, destinationHeader)
	}
	if fb := oh.GetFallbackPolicy().GetPolicies(); len(fb) != 1 || fb[0].GetTypedExtensionConfig().GetName() != "envoy.load_balancing_policies.least_request" {
		t.Errorf("override_host falls back to %v, want least_request", fb)
	}

	rp := in.only(t, apinet.EnvoyFilter_HTTP_ROUTE)
	if got := rp.spec.GetMatch().GetRouteConfiguration().GetVhost().GetRoute().GetName(); got != route.GetName() {
		t.Errorf("route patch matches route %q, the VirtualService's route is %q", got, route.GetName())
	}
	_, pc := in.wasm(t)
	var sv wrapperspb.StringValue
	if err := pc.GetConfiguration().UnmarshalTo(&sv); err != nil {
		t.Fatal(err)
	}
	var plugin struct {
		MaxBodyBytes uint64 `json:"max_body_bytes"`
	}
	if err := json.Unmarshal([]byte(sv.GetValue()), &plugin); err != nil {
		t.Fatal(err)
	}
	// The stream limit must hold max_body_bytes and the read that crosses
	// it (up to Envoy's default 1 MiB per-connection buffer).
	limit := rp.value.(*routev3.Route).GetRequestBodyBufferLimit().GetValue()
	if plugin.MaxBodyBytes == 0 || limit < plugin.MaxBodyBytes+1<<20 {
		t.Errorf("request_body_buffer_limit %d, want at least max_body_bytes (%d) + 1 MiB", limit, plugin.MaxBodyBytes)
	}
}

func sameLabels(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestEnginesIdleTimeout: the gateway closes idle connections to the
// engines before they do (5 s, uvicorn's and cpp-httplib's keep-alive), so
// no request is sent down a connection the engine is closing.
func TestEnginesIdleTimeout(t *testing.T) {
	in := loadInstall(t)
	_, dest := in.engineRoute(t)
	if len(in.destinationRules) != 1 {
		t.Fatalf("%d DestinationRules, want 1", len(in.destinationRules))
	}
	dr := in.destinationRules[0]
	if dr.Spec.GetHost() != dest.GetHost() {
		t.Errorf("DestinationRule for %q, the route goes to %q", dr.Spec.GetHost(), dest.GetHost())
	}
	idle := dr.Spec.GetTrafficPolicy().GetConnectionPool().GetHttp().GetIdleTimeout().AsDuration()
	if idle <= 0 || idle >= 5*time.Second {
		t.Errorf("idle timeout %v, want under the engines' 5 s", idle)
	}
}
