package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvroute/kvroute/e2e/wasmhost"
)

// wasmPath is the compiled filter every test in this package uses, and
// workDir the directory built binaries go to, removed at the end.
var wasmPath, workDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvroute-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	workDir = dir
	root, _ := filepath.Abs("..")
	wasmPath, err = wasmhost.BuildFilter(context.Background(), root, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
