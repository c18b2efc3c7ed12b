package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestFilterLinksNoFmtLogOrOs: no package of this module that the Wasm
// filter links imports fmt, log or os. Each pulls in more of the runtime
// than a proxy-wasm module should carry, and os makes the module's behaviour
// depend on the host's WASI (proxywasm.md, gotcha 1). Third-party code the
// filter links (gjson reaches os through encoding/json) is outside this
// rule and measured by the legacy-host tests instead.
func TestFilterLinksNoFmtLogOrOs(t *testing.T) {
	// go test puts its own toolchain's bin first on the test's PATH.
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", ".")
	cmd.Env = append(cmd.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const module = "github.com/kvroute/kvroute"
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, " ")
		if pkg != "command-line-arguments" && !strings.HasPrefix(pkg, module) {
			continue
		}
		checked++
		for _, imp := range strings.Fields(imports) {
			switch imp {
			case "fmt", "log", "log/slog", "os":
				t.Errorf("%s imports %s", pkg, imp)
			}
		}
	}
	if checked < 5 {
		t.Fatalf("checked %d of the module's packages; go list printed:\n%s", checked, out)
	}
}
