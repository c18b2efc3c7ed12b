// Command wasmexec runs a GOOS=wasip1 program under wazero with full WASI
// (arguments, environment, the host file system mounted at /, clocks, random)
// and exits with the program's exit code. It exists so that `go test -exec`
// can run test binaries, and so measure benchmarks, inside Wasm:
//
//	go build -o bin/wasmexec ./e2e/cmd/wasmexec
//	GOOS=wasip1 GOARCH=wasm go test -exec $PWD/bin/wasmexec -run '^$' -bench . ./shared/blockhash
//
// or in one line, building it for the host rather than for wasip1:
//
//	GOOS=wasip1 GOARCH=wasm go test -exec "env GOOS= GOARCH= go run github.com/kvroute/kvroute/e2e/cmd/wasmexec" ./shared/prompt
//
// go test runs the -exec command in each package's directory, so a relative
// path (./e2e/cmd/wasmexec) does not resolve there.
//
// It compiles with wazero's optimizing compiler and caches compiled modules
// in $WASMEXEC_CACHE (default: a wasmexec directory in the user cache
// directory), so repeated runs of the same binary skip compilation.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: wasmexec program.wasm [args...]")
		os.Exit(2)
	}
	os.Exit(run(os.Args[1], os.Args[2:]))
}

func run(path string, args []string) int {
	bin, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "wasmexec:", err)
		return 1
	}
	ctx := context.Background()
	cfg := wazero.NewRuntimeConfigCompiler()
	if cache, err := wazero.NewCompilationCacheWithDir(cacheDir()); err == nil {
		cfg = cfg.WithCompilationCache(cache)
	} else {
		fmt.Fprintln(os.Stderr, "wasmexec: compiling without a cache:", err)
	}
	rt := wazero.NewRuntimeWithConfig(ctx, cfg)
	defer rt.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)

	mod, err := rt.CompileModule(ctx, bin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "wasmexec: compiling %s: %v\n", path, err)
		return 1
	}
	if err := stubProxyWasm(ctx, rt, mod); err != nil {
		fmt.Fprintln(os.Stderr, "wasmexec:", err)
		return 1
	}
	conf := wazero.NewModuleConfig().
		WithArgs(append([]string{path}, args...)...).
		WithStdin(os.Stdin).
		WithStdout(os.Stdout).
		WithStderr(os.Stderr).
		WithRandSource(rand.Reader).
		WithSysWalltime().
		WithSysNanotime().
		WithSysNanosleep().
		WithFSConfig(wazero.NewFSConfig().WithDirMount("/", "/"))
	for _, kv := range environ() {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			conf = conf.WithEnv(k, v)
		}
	}
	_, err = rt.InstantiateModule(ctx, mod, conf)
	var exit *sys.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return int(exit.ExitCode())
	default:
		fmt.Fprintf(os.Stderr, "wasmexec: running %s: %v\n", path, err)
		return 1
	}
}

// environ is the host environment with PWD set to the working directory:
// Go's wasip1 port takes its working directory from PWD, and go test runs
// each test binary in its package directory.
func environ() []string {
	wd, err := os.Getwd()
	if err != nil {
		return os.Environ()
	}
	env := []string{"PWD=" + wd}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PWD=") {
			env = append(env, kv)
		}
	}
	return env
}

func cacheDir() string {
	if dir := os.Getenv("WASMEXEC_CACHE"); dir != "" {
		return dir
	}
	if dir, err := os.UserCacheDir(); err == nil {
		return filepath.Join(dir, "wasmexec")
	}
	return filepath.Join(os.TempDir(), "wasmexec")
}

// unimplemented is the proxy-wasm status a stubbed hostcall answers.
const unimplemented = 12

// stubProxyWasm satisfies the module's proxy-wasm imports (module "env")
// with functions that answer "unimplemented", as the ABI layer's native
// build does: the filter's own tests and benchmarks then run compiled to
// Wasm, as long as they make no hostcall.
func stubProxyWasm(ctx context.Context, rt wazero.Runtime, mod wazero.CompiledModule) error {
	b := rt.NewHostModuleBuilder("env")
	n := 0
	for _, f := range mod.ImportedFunctions() {
		m, name, _ := f.Import()
		if m != "env" {
			continue
		}
		n++
		results := f.ResultTypes()
		b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(_ context.Context, _ api.Module, stack []uint64) {
			for i := range results {
				stack[i] = 0
			}
			if len(results) == 1 {
				stack[0] = unimplemented
			}
		}), f.ParamTypes(), results).Export(name)
	}
	if n == 0 {
		return nil
	}
	_, err := b.Instantiate(ctx)
	return err
}
