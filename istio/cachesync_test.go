package istio

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kvroute/kvroute/cachesync/daemon"
)

// TestCachesyncManifest checks cachesync.yaml against the daemon's own flag
// parser and against the rest of the install: the Service the filter calls,
// the token the filter reads, the permissions discovery needs.
func TestCachesyncManifest(t *testing.T) {
	in := loadInstall(t)
	if len(in.deployments) != 1 || len(in.services) != 1 || len(in.roles) != 1 || len(in.roleBindings) != 1 || len(in.secrets) != 1 {
		t.Fatalf("cachesync.yaml: %d deployments, %d services, %d roles, %d bindings, %d secrets; want one each",
			len(in.deployments), len(in.services), len(in.roles), len(in.roleBindings), len(in.secrets))
	}
	dep, svc := in.deployments[0], in.services[0]
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

	// The filter's cachesync cluster is istiod's outbound cluster of the Service.
	want := "outbound|" + "8080" + "||" + svc.Name + "." + svc.Namespace + ".svc.cluster.local"
	if svc.Spec.Ports[0].Port != 8080 || !strings.HasSuffix(cfg.Listen, ":8080") {
		t.Errorf("Service port %d, cachesync listens on %s; want 8080 both", svc.Spec.Ports[0].Port, cfg.Listen)
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
	if pc.Cachesync.Cluster != want {
		t.Errorf("filter calls cluster %q, want %q", pc.Cachesync.Cluster, want)
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
		t.Errorf("role binding %+v does not bind the Deployment's service account", rb)
	}
}
