package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/e2e/llamacpp"
)

// TestMakeTargetsInstallWhatTheyNeed: on a fresh clone (no setup stamp),
// make test and make demo each install Envoy and the Python peers before
// anything that needs them, and make setup does nothing twice.
func TestMakeTargetsInstallWhatTheyNeed(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make is not installed")
	}
	stamp := filepath.Join(t.TempDir(), "setup-stamp")
	for _, tc := range []struct{ target, needs string }{
		{"test", "go test"},
		{"demo", "go run ./e2e/cmd/demo"},
	} {
		out, err := exec.Command("make", "-n", "-C", "..", tc.target, "SETUP_STAMP="+stamp).CombinedOutput()
		if err != nil {
			t.Fatalf("make -n %s: %v\n%s", tc.target, err, out)
		}
		s := string(out)
		install, use := strings.Index(s, "pip install"), strings.Index(s, tc.needs)
		if install < 0 || use < 0 || install > use {
			t.Errorf("make %s on a fresh clone: install at %d, %q at %d; want the install first:\n%s", tc.target, install, tc.needs, use, s)
		}
	}
	// Once the stamp exists, nothing is installed again.
	if out, err := exec.Command("make", "-C", "..", "SETUP_STAMP="+stamp, stamp, "PYTHON=true", "GO=true").CombinedOutput(); err != nil {
		t.Fatalf("make the stamp: %v\n%s", err, out)
	}
	out, err := exec.Command("make", "-n", "-C", "..", "setup", "SETUP_STAMP="+stamp).CombinedOutput()
	if err != nil || strings.Contains(string(out), "pip install") {
		t.Errorf("make setup with the stamp present: %v\n%s", err, out)
	}
}

// TestLlamaCppVersionAgrees: make llamacpp builds the version the Go side
// looks for by default.
func TestLlamaCppVersionAgrees(t *testing.T) {
	out, err := exec.Command("make", "-n", "-C", "..", "llamacpp", "LLAMACPP_DIR=/x").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n llamacpp: %v\n%s", err, out)
	}
	if want := "LLAMA_CPP_PYTHON=" + llamacpp.Version + " "; !strings.Contains(string(out), want) {
		t.Errorf("make llamacpp runs %q; want %s, e2e/llamacpp's Version", out, want)
	}
}
