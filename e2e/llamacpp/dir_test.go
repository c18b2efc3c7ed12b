package llamacpp

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The bench and the tests look for the server where build.sh puts it: a
// direct go run after make llamacpp must find it.
func TestDirIsWhereBuildPutsIt(t *testing.T) {
	script, err := os.ReadFile("build.sh")
	if err != nil {
		t.Fatal(err)
	}
	var defaults []string
	for _, line := range strings.Split(string(script), "\n") {
		if strings.HasPrefix(line, "LLAMA_CPP_PYTHON=") || strings.HasPrefix(line, "cache=") {
			defaults = append(defaults, line)
		}
	}
	if len(defaults) != 2 {
		t.Fatalf("build.sh's version and cache defaults: found %q", defaults)
	}
	for _, xdg := range []string{"", "/var/cache/ci"} {
		t.Setenv("KVROUTE_LLAMACPP_DIR", "")
		t.Setenv("XDG_CACHE_HOME", xdg)
		t.Setenv("LLAMA_CPP_PYTHON", "")
		out, err := exec.Command("bash", "-c", "set -eu; set --; "+strings.Join(defaults, "; ")+`; printf %s "$cache"`).Output()
		if err != nil {
			t.Fatalf("evaluating build.sh's defaults: %v", err)
		}
		if got := Dir(); got != string(out) {
			t.Errorf("XDG_CACHE_HOME=%q: Dir() = %s, build.sh builds into %s", xdg, got, out)
		}
	}
}
