package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvroute/kvroute/e2e/wasmhost"
)

// wasmPath is the compiled filter every test in this package uses.
var wasmPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvroute-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
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
