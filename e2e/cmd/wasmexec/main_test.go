package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRun builds testdata/probe for wasip1 and runs it through wasmexec: the
// program must see its arguments, the environment, the working directory and
// the host's files, and wasmexec must exit with the program's code.
func TestRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	dir := t.TempDir()
	build := func(out string, env []string, pkg string) {
		cmd := exec.Command("go", "build", "-o", out, pkg)
		cmd.Env = append(os.Environ(), env...)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, b)
		}
	}
	runner, probe := filepath.Join(dir, "wasmexec"), filepath.Join(dir, "probe.wasm")
	build(runner, []string{"GOOS=", "GOARCH="}, ".")
	build(probe, []string{"GOOS=wasip1", "GOARCH=wasm"}, "./testdata/probe")
	work := t.TempDir()
	if err := os.WriteFile(filepath.Join(work, "probe.txt"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		exit string
		want int
	}{
		{"success", "0", 0},
		{"failure code passes through", "3", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(runner, probe, "-x", "two words")
			cmd.Dir = work
			cmd.Env = append(os.Environ(), "PROBE=value", "PROBE_EXIT="+tt.exit, "WASMEXEC_CACHE="+filepath.Join(dir, "cache"))
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tt.want {
				t.Errorf("exit code %d, want %d; output:\n%s", code, tt.want, out.String())
			}
			want := `args=["-x" "two words"] env="value" wd=` + work + ` file="hello" err=<nil>`
			if got := strings.TrimSpace(out.String()); got != want {
				t.Errorf("probe saw\n%s\nwant\n%s", got, want)
			}
		})
	}

	if err := exec.Command(runner, filepath.Join(dir, "missing.wasm")).Run(); err == nil {
		t.Error("running a missing file succeeded")
	}
}
