package istio

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	apinet "istio.io/api/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"

	"github.com/kvroute/kvroute/cachesync/daemon"
)

// TestCachesyncManifest checks cachesync.yaml against the daemon's own flag
// parser and against the rest of the install: the replicas the filter
// calls and that forward each other reports, the token the filter reads,
// the permissions discovery needs.
func TestCachesyncManifest(t *testing.T) {
	in := loadInstall(t)
	if len(in.statefulSets) != 1 || len(in.services) != 2 || len(in.roles) != 1 || len(in.roleBindings) != 1 || len(in.secrets) != 1 {
		t.Fatalf("cachesync.yaml: %d stateful sets, %d services, %d roles, %d bindings, %d secrets; want 1, 2, 1, 1, 1",
			len(in.statefulSets), len(in.services), len(in.roles), len(in.roleBindings), len(in.secrets))
	}
	dep := in.statefulSets[0]
	var peers *corev1.Service
	for _, svc := range in.services {
		if svc.Name == dep.Spec.ServiceName {
			peers = svc
		}
	}
	if peers == nil || peers.Spec.ClusterIP != corev1.ClusterIPNone || *dep.Spec.Replicas != 2 {
		t.Fatalf("want two replicas named through a headless Service, have %d and %+v", *dep.Spec.Replicas, peers)
	}
	c := dep.Spec.Template.Spec.Containers[0]

	// The arguments are what cachesync itself accepts; the token file is
	// the Secret's mount, replaced by a local file for the parser.
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	var args []string
	mount := ""
	for _, vm := range c.VolumeMounts {
		if vm.Name == "token" {
			mount = vm.MountPath
		}
	}
	for _, a := range c.Args {
		if f, ok := strings.CutPrefix(a, "-report-token-file="); ok {
			if filepath.Dir(f) != mount || filepath.Base(f) != "token" {
				t.Errorf("report token file %s is not the Secret's key under its mount %s", f, mount)
			}
			a = "-report-token-file=" + token
		}
		args = append(args, a)
	}
	cfg, err := daemon.ParseFlags(args, func(string) string { return "" })
	if err != nil {
		t.Fatalf("cachesync rejects its manifest's arguments: %v", err)
	}
	if cfg.ReportTokenFile != token || cfg.K8sService != "llm/vllm" {
		t.Errorf("parsed %+v: want the Secret's token file and the engines' Service llm/vllm", cfg)
	}

	// Each replica's name, as the StatefulSet and its headless Service
	// make it; the peers list both, and the filter's cluster has them as
	// its two priority levels.
	var names []string
	for i := range int(*dep.Spec.Replicas) {
		names = append(names, dep.Name+"-"+strconv.Itoa(i)+"."+peers.Name+"."+dep.Namespace+".svc.cluster.local:8080")
	}
	if !strings.HasSuffix(cfg.Listen, ":8080") || peers.Spec.Ports[0].Port != 8080 {
		t.Errorf("cachesync listens on %s, its Service port %d; want 8080 both", cfg.Listen, peers.Spec.Ports[0].Port)
	}
	if cfg.Peers != strings.Join(names, ",") {
		t.Errorf("-peers %q, want %q", cfg.Peers, strings.Join(names, ","))
	}
	_, plugin := in.wasm(t)
	var pc struct {
		Cachesync struct {
			Cluster        string `json:"cluster"`
			ReportTokenEnv string `json:"report_token_env"`
		} `json:"cachesync"`
	}
	var sv wrapperspb.StringValue
	if err := plugin.GetConfiguration().UnmarshalTo(&sv); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(sv.GetValue()), &pc); err != nil {
		t.Fatal(err)
	}
	var cluster *clusterv3.Cluster
	for _, p := range in.patches {
		if c, ok := p.value.(*clusterv3.Cluster); ok && p.spec.GetPatch().GetOperation() == apinet.EnvoyFilter_Patch_ADD {
			cluster = c
		}
	}
	if cluster == nil || pc.Cachesync.Cluster != cluster.GetName() {
		t.Fatalf("filter calls cluster %q, which no patch adds", pc.Cachesync.Cluster)
	}
	levels := cluster.GetLoadAssignment().GetEndpoints()
	var got []string
	for i, l := range levels {
		sa := l.GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		got = append(got, sa.GetAddress()+":"+strconv.Itoa(int(sa.GetPortValue())))
		if int(l.GetPriority()) != i || len(l.GetLbEndpoints()) != 1 {
			t.Errorf("level %d: priority %d, %d endpoints", i, l.GetPriority(), len(l.GetLbEndpoints()))
		}
	}
	if !slices.Equal(got, names) {
		t.Errorf("cluster levels %v, want the replicas %v in order", got, names)
	}
	// One failure ejects the primary, and ejecting it is allowed.
	od := cluster.GetOutlierDetection()
	if od.GetConsecutiveGatewayFailure().GetValue() != 1 || od.GetEnforcingConsecutiveGatewayFailure().GetValue() != 100 ||
		od.GetMaxEjectionPercent().GetValue() != 100 {
		t.Errorf("outlier detection %v", od)
	}
	keys := plugin.GetVmConfig().GetEnvironmentVariables().GetHostEnvKeys()
	if pc.Cachesync.ReportTokenEnv == "" || !slices.Contains(keys, pc.Cachesync.ReportTokenEnv) {
		t.Errorf("filter reads the token from %q, the VM's host_env_keys are %v", pc.Cachesync.ReportTokenEnv, keys)
	}

	// Discovery may read the engines' EndpointSlices, and nothing else.
	role, rb := in.roles[0], in.roleBindings[0]
	if role.Namespace != "llm" || len(role.Rules) != 1 || !slices.Equal(role.Rules[0].Resources, []string{"endpointslices"}) ||
		!slices.Equal(role.Rules[0].Verbs, []string{"get", "list", "watch"}) {
		t.Errorf("role %s/%s rules %+v", role.Namespace, role.Name, role.Rules)
	}
	if rb.RoleRef.Name != role.Name || rb.Subjects[0].Name != dep.Spec.Template.Spec.ServiceAccountName ||
		rb.Subjects[0].Namespace != dep.Namespace {
		t.Errorf("role binding %+v does not bind the replicas' service account", rb)
	}
}
