package wasmhost

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	guestOnce sync.Once
	guestDir  string
	guestErr  error
)

// guest builds one of the testdata guests (all in one go, once per binary).
func guest(t *testing.T, name string) []byte {
	t.Helper()
	guestOnce.Do(func() {
		guestDir, guestErr = os.MkdirTemp("", "wasmhost-guests")
		for _, g := range []string{"quirks", "initcall"} {
			if guestErr != nil {
				return
			}
			cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", filepath.Join(guestDir, g+".wasm"), "./testdata/"+g)
			cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
			if out, err := cmd.CombinedOutput(); err != nil {
				guestErr = err
				t.Logf("%s", out)
			}
		}
	})
	if guestErr != nil {
		t.Fatalf("build guests: %v", guestErr)
	}
	b, err := os.ReadFile(filepath.Join(guestDir, name+".wasm"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func startGuest(t *testing.T, name string, sem Semantics, vmConfig string) (*VM, error) {
	t.Helper()
	h, err := New(context.Background(), guest(t, name), sem)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	return h.NewVM(context.Background(), VMConfig{VMID: "t", VMConfiguration: []byte(vmConfig)})
}

// The Go runtime sleeps through poll_oneoff. Legacy hosts answer ENOSYS and
// the runtime aborts, failing the VM; fixed hosts let it through.
func TestPollOneoffSemantics(t *testing.T) {
	vm, err := startGuest(t, "quirks", Legacy, "sleep")
	if err == nil {
		t.Fatal("a sleeping guest survived a legacy host")
	}
	if !strings.Contains(vm.LogText(), "poll_oneoff") {
		t.Errorf("legacy failure does not mention poll_oneoff: %v\n%s", err, vm.LogText())
	}
	if _, err := startGuest(t, "quirks", Fixed, "sleep"); err != nil {
		t.Errorf("a sleeping guest failed on a fixed host: %v", err)
	}
}

func TestRestrictedCalls(t *testing.T) {
	cases := []struct {
		name, guest, vmConfig, where string
	}{
		{"hostcall during _initialize", "initcall", "", "_initialize"},
		{"hostcall inside the allocator", "quirks", "alloc-call", "the allocator"},
	}
	for _, c := range cases {
		for _, sem := range []Semantics{Fixed, Legacy} {
			vm, err := startGuest(t, c.guest, sem, c.vmConfig)
			if err == nil {
				t.Errorf("%s (%v): VM started", c.name, sem)
				continue
			}
			if !strings.Contains(err.Error(), "restricted_callback") || !strings.Contains(vm.LogText(), c.where) {
				t.Errorf("%s (%v): err %v, log %q; want restricted_callback during %s", c.name, sem, err, vm.LogText(), c.where)
			}
		}
	}
	if _, err := startGuest(t, "quirks", Legacy, "plain"); err != nil {
		t.Errorf("the same guest without the forbidden call failed: %v", err)
	}
}

func TestSharedDataCAS(t *testing.T) {
	h := &Host{shared: map[string]map[string]*sharedValue{}}
	steps := []struct {
		vmID, key string
		cas       uint32
		want      uint32
	}{
		{"a", "k", 99, statusOK},         // a missing key accepts any cas
		{"a", "k", 0, statusOK},          // cas 0 always writes
		{"a", "k", 1, statusCasMismatch}, // stale cas
		{"a", "k", 2, statusOK},          // current cas
		{"b", "k", 7, statusOK},          // vm ids are separate namespaces
		{"a", "k", 2, statusCasMismatch}, // the previous write moved the cas on
		{"a", "k", 3, statusOK},
	}
	for i, s := range steps {
		if got := h.setShared(s.vmID, s.key, []byte{byte(i)}, s.cas); got != s.want {
			t.Errorf("step %d: set(%s/%s, cas %d) = %d, want %d", i, s.vmID, s.key, s.cas, got, s.want)
		}
	}
	if v, _ := h.SharedData("a", "k"); len(v) != 1 || v[0] != 6 {
		t.Errorf("a/k = %v, want the last successful write", v)
	}
}

func TestPairsStrictParser(t *testing.T) {
	good := marshalPairs([][2]string{{"a", "1"}, {"b", ""}})
	if got := unmarshalPairs(good); len(got) != 2 || got[0] != [2]string{"a", "1"} || got[1] != [2]string{"b", ""} {
		t.Fatalf("round trip = %q", got)
	}
	for name, b := range map[string][]byte{
		"trailing byte":   append(append([]byte{}, good...), 0),
		"missing NUL":     append(append([]byte{}, good[:len(good)-1]...), 'x'),
		"short":           good[:3],
		"count overflows": {0xff, 0xff, 0xff, 0x1f},
	} {
		if got := unmarshalPairs(b); got != nil {
			t.Errorf("%s: parsed %q, want an empty map", name, got)
		}
	}
}
