package wasmhost

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// ModuleEnv names the environment variable that points the tests at an
// already built module (for example `make wasm`'s build/kvroute.wasm) instead
// of building one.
const ModuleEnv = "KVROUTE_WASM"

// BuildFilter returns the path of kvroute's compiled filter: $KVROUTE_WASM if
// set, otherwise a fresh build of the filter package at repoRoot/filter into
// dir, with the same command as `make wasm`.
func BuildFilter(ctx context.Context, repoRoot, dir string) (string, error) {
	if p := os.Getenv(ModuleEnv); p != "" {
		return p, nil
	}
	out := filepath.Join(dir, "kvroute.wasm")
	cmd := exec.CommandContext(ctx, "go", "build", "-buildmode=c-shared", "-o", out, "./filter")
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build filter: %w\n%s", err, b)
	}
	return out, nil
}
