package istio

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	faultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	wasmfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	apinet "istio.io/api/networking/v1alpha3"

	"github.com/kvroute/kvroute/e2e/envoy"
	"github.com/kvroute/kvroute/e2e/wasmhost"
)

// There is no Istio here, so this test does by hand what istiod and
// istio-agent would do with the manifests on a gateway, and runs the result
// in real Envoy with the real module: it builds the gateway's listener,
// route and engines cluster in the shape istiod generates them (reduced to
// what upstream Envoy has: Istio's own filters such as istio.stats are left
// out), applies the EnvoyFilter patches with Istio's semantics (proto merge
// for MERGE, insertion before the router for INSERT_BEFORE), and serves the
// ECDS extension inline with its remote code replaced by a local file, as
// istio-agent does after fetching the image. Engines are httptest servers.
func TestPatchedGatewayInEnvoy(t *testing.T) {
	in := loadInstall(t)
	engines := startEngines(t, 3)

	module, err := wasmhost.BuildFilter(context.Background(), "..", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	boot := gatewayBootstrap(t, in, module, engines)
	// What the gateway Deployment passes to istio-proxy from the Secret; the
	// filter reads it through the VM's host_env_keys.
	t.Setenv("KVROUTE_REPORT_TOKEN", "token-from-the-secret")
	b, err := protojson.Marshal(boot)
	if err != nil {
		t.Fatal(err)
	}
	p, err := envoy.Start(context.Background(), envoy.Options{Config: b, Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("start Envoy: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("stop Envoy: %v", err)
		}
		if f := p.WasmFailures(); len(f) > 0 {
			t.Errorf("Envoy logged Wasm failures:\n%s", strings.Join(f, "\n"))
		}
	})
	url, err := p.ListenerURL(context.Background(), gatewayListener)
	if err != nil {
		t.Fatal(err)
	}

	client := &http.Client{Timeout: time.Minute}
	post := func(body []byte, header http.Header) engineReply {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header = header
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r engineReply
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d, reply: %v", resp.StatusCode, err)
		}
		r.Decision = resp.Header.Get("x-kvroute-decision")
		return r
	}

	seen := map[string]bool{}
	for i := range 30 {
		r := post(chat("tenant "+strconv.Itoa(i)+" "+strings.Repeat("system prompt text ", 60)), nil)
		// The header lists the choice, then the fallbacks for retries.
		if chosen, _, _ := strings.Cut(r.Destination, ","); chosen == "" || chosen != r.Server {
			t.Fatalf("request %d: filter chose %q, Envoy sent it to %s", i, r.Destination, r.Server)
		}
		seen[r.Server] = true
	}
	if len(seen) != len(engines) {
		t.Errorf("30 prompts reached %d of %d engines", len(seen), len(engines))
	}
	// A client cannot pick an engine, and a body past max_body_bytes still
	// gets an answer (the route's request_body_buffer_limit).
	body := chat(strings.Repeat("steer ", 200))
	home := post(body, nil).Server
	// Let the filter's local index (rebuilt every 100 ms) learn the prompt.
	time.Sleep(time.Second)
	for _, e := range engines {
		if r := post(body, http.Header{"X-Gateway-Destination-Endpoint": {e.addr}}); r.Server != home {
			t.Errorf("a client header naming %s moved the prompt from %s to %s (destination %q, decision %q)",
				e.addr, home, r.Server, r.Destination, r.Decision)
		}
	}
	big := chat(strings.Repeat("x", 12<<20))
	for range 4 {
		if r := post(big, nil); r.Destination != "" || r.BodyBytes != int64(len(big)) {
			t.Errorf("12 MiB body: destination %q, %d bytes arrived", r.Destination, r.BodyBytes)
		}
	}
}

const gatewayListener = "0.0.0.0_80"

type engine struct{ addr string }

type engineReply struct {
	Server      string `json:"server"`
	Destination string `json:"destination"`
	BodyBytes   int64  `json:"body_bytes"`
	Decision    string `json:"-"`
}

func startEngines(t testing.TB, n int) []engine {
	var out []engine
	for range n {
		var e engine
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, _ := io.Copy(io.Discard, r.Body)
			json.NewEncoder(w).Encode(engineReply{Server: e.addr, Destination: r.Header.Get(destinationHeader), BodyBytes: n})
		}))
		t.Cleanup(srv.Close)
		e.addr = srv.Listener.Addr().String()
		out = append(out, e)
	}
	return out
}

func chat(text string) []byte {
	b, _ := json.Marshal(map[string]any{"model": "qwen", "messages": []map[string]string{{"role": "user", "content": text}}})
	return b
}

// gatewayBootstrap is the gateway's Envoy configuration after the patches.
func gatewayBootstrap(t testing.TB, in *install, module string, engines []engine) *bootstrapv3.Bootstrap {
	t.Helper()
	route, dest := in.engineRoute(t)
	clusterName := fmt.Sprintf("outbound|%d||%s", dest.GetPort().GetNumber(), dest.GetHost())

	cluster := istioCluster(t, clusterName, engines)
	routeCfg := &routev3.Route{
		Name:  route.GetName(),
		Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: route.GetMatch()[0].GetUri().GetPrefix()}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: clusterName},
			Timeout:          route.GetTimeout(),
		}},
	}
	filters := []*hcmv3.HttpFilter{
		typedFilter(t, "envoy.filters.http.fault", &faultv3.HTTPFault{}),
		typedFilter(t, "envoy.filters.http.cors", &corsv3.Cors{}),
		typedFilter(t, "envoy.filters.http.router", &routerv3.Router{}),
	}
	var extension *corev3.TypedExtensionConfig
	var added []*clusterv3.Cluster
	for _, p := range in.patches {
		switch p.spec.GetApplyTo() {
		case apinet.EnvoyFilter_EXTENSION_CONFIG:
			extension = fetched(t, p.value.(*corev3.TypedExtensionConfig), module, engines)
		case apinet.EnvoyFilter_CLUSTER:
			switch {
			case p.spec.GetPatch().GetOperation() == apinet.EnvoyFilter_Patch_ADD:
				// cachesync's replicas: Envoy must take the cluster (its
				// cluster-local names do not resolve here).
				added = append(added, p.value.(*clusterv3.Cluster))
			case p.spec.GetMatch().GetCluster().GetService() == dest.GetHost():
				proto.Merge(cluster, p.value)
			}
		case apinet.EnvoyFilter_HTTP_ROUTE:
			if p.spec.GetMatch().GetRouteConfiguration().GetVhost().GetRoute().GetName() == routeCfg.GetName() {
				proto.Merge(routeCfg, p.value)
			}
		case apinet.EnvoyFilter_HTTP_FILTER:
			filters = insertBefore(t, filters, p)
		}
	}
	// Serve the ECDS extension inline, as Envoy holds it once ADS has
	// delivered it.
	for i, f := range filters {
		if cd := f.GetConfigDiscovery(); cd != nil {
			if extension == nil || extension.GetName() != f.GetName() {
				t.Fatalf("HTTP filter %s discovers an extension no patch defines", f.GetName())
			}
			filters[i] = &hcmv3.HttpFilter{Name: f.GetName(), ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: extension.GetTypedConfig()}}
		}
	}
	for _, c := range append([]*clusterv3.Cluster{cluster}, added...) {
		if err := validate(c); err != nil {
			t.Fatalf("cluster %s: %v", c.GetName(), err)
		}
	}
	if err := validate(routeCfg); err != nil {
		t.Fatalf("patched route: %v", err)
	}

	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: "outbound_0.0.0.0_80",
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			Name:         "http.80",
			VirtualHosts: []*routev3.VirtualHost{{Name: "*:80", Domains: []string{"*"}, Routes: []*routev3.Route{routeCfg}}},
		}},
		HttpFilters: filters,
	}
	return &bootstrapv3.Bootstrap{
		Admin: &bootstrapv3.Admin{Address: loopback(0)},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{
			Listeners: []*listenerv3.Listener{{
				Name:    gatewayListener,
				Address: loopback(0),
				FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
					Name:       "envoy.filters.network.http_connection_manager",
					ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, hcm)},
				}}}},
			}},
			Clusters: append([]*clusterv3.Cluster{cluster}, added...),
		},
	}
}

// istioCluster is an outbound cluster as istiod builds it for a Service
// port (EDS, least-request, unlimited circuit breakers, Istio metadata),
// with the EDS endpoints given statically.
func istioCluster(t testing.TB, name string, engines []engine) *clusterv3.Cluster {
	t.Helper()
	var lbEndpoints []*endpointv3.LbEndpoint
	for _, e := range engines {
		ap := netip.MustParseAddrPort(e.addr)
		lbEndpoints = append(lbEndpoints, &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{
			Endpoint: &endpointv3.Endpoint{Address: socket(ap.Addr().String(), uint32(ap.Port()))},
		}})
	}
	max := wrapperspb.UInt32(4294967295)
	meta, err := structpb.NewStruct(map[string]any{"services": []any{map[string]any{"host": name, "name": "vllm", "namespace": "llm"}}})
	if err != nil {
		t.Fatal(err)
	}
	return &clusterv3.Cluster{
		Name:                 name,
		AltStatName:          name + ";",
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:       durationpb.New(10 * time.Second),
		LbPolicy:             clusterv3.Cluster_LEAST_REQUEST,
		CommonLbConfig:       &clusterv3.Cluster_CommonLbConfig{},
		CircuitBreakers: &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{{
			MaxConnections: max, MaxPendingRequests: max, MaxRequests: max, MaxRetries: max, TrackRemaining: true,
		}}},
		Metadata:       &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"istio": meta}},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: lbEndpoints}}},
	}
}

// fetched is the extension after istio-agent fetched its module: the code
// is a local file. The plugin's endpoint list names the test engines, as
// the engines' pod addresses would be in a cluster, and the decision header
// is on so that a failure can say why the filter chose what it chose.
func fetched(t testing.TB, ext *corev3.TypedExtensionConfig, module string, engines []engine) *corev3.TypedExtensionConfig {
	t.Helper()
	ext = proto.Clone(ext).(*corev3.TypedExtensionConfig)
	var w wasmfilterv3.Wasm
	if err := ext.GetTypedConfig().UnmarshalTo(&w); err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(module)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(abs); err != nil {
		t.Fatal(err)
	}
	w.Config.GetVmConfig().Code = &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Local{
		Local: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: abs}},
	}}
	var sv wrapperspb.StringValue
	if err := w.Config.GetConfiguration().UnmarshalTo(&sv); err != nil {
		t.Fatal(err)
	}
	var plugin map[string]any
	if err := json.Unmarshal([]byte(sv.GetValue()), &plugin); err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, e := range engines {
		addrs = append(addrs, e.addr)
	}
	plugin["endpoints"] = addrs
	plugin["debug_header"] = true
	b, err := json.Marshal(plugin)
	if err != nil {
		t.Fatal(err)
	}
	w.Config.Configuration = mustAny(t, wrapperspb.String(string(b)))
	ext.TypedConfig = mustAny(t, &w)
	return ext
}

// insertBefore applies an HTTP_FILTER INSERT_BEFORE patch.
func insertBefore(t testing.TB, filters []*hcmv3.HttpFilter, p patch) []*hcmv3.HttpFilter {
	t.Helper()
	if op := p.spec.GetPatch().GetOperation(); op != apinet.EnvoyFilter_Patch_INSERT_BEFORE {
		t.Fatalf("HTTP_FILTER patch %v: this test applies INSERT_BEFORE only", op)
	}
	before := p.spec.GetMatch().GetListener().GetFilterChain().GetFilter().GetSubFilter().GetName()
	for i, f := range filters {
		if f.GetName() == before {
			return append(filters[:i:i], append([]*hcmv3.HttpFilter{p.value.(*hcmv3.HttpFilter)}, filters[i:]...)...)
		}
	}
	t.Fatalf("no HTTP filter %q to insert before", before)
	return nil
}

func typedFilter(t testing.TB, name string, cfg proto.Message) *hcmv3.HttpFilter {
	return &hcmv3.HttpFilter{Name: name, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, cfg)}}
}

func mustAny(t testing.TB, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func loopback(port uint32) *corev3.Address { return socket("127.0.0.1", port) }

func socket(addr string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: addr, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}
