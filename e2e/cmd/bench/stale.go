package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// notStale returns an error when a Go source under dirs (tests aside), or
// go.mod, is newer than the built file bin: `go run ./e2e/cmd/bench`
// measures the binaries make built last, and a run of a stale one reads as
// a measurement of the code beside it.
func notStale(bin string, dirs ...string) error {
	st, err := os.Stat(bin)
	if err != nil {
		return fmt.Errorf("%s: %w (make wasm build/cachesync builds it)", bin, err)
	}
	built := st.ModTime()
	newer := ""
	check := func(path string, info fs.FileInfo) {
		if info.ModTime().After(built) && newer == "" {
			newer = path
		}
	}
	if info, err := os.Stat("go.mod"); err == nil {
		check("go.mod", info)
	}
	for _, dir := range dirs {
		err := filepath.Walk(dir, func(path string, info fs.FileInfo, err error) error {
			if err != nil || newer != "" {
				return err
			}
			if !info.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
				check(path, info)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("checking %s against %s: %w", bin, dir, err)
		}
	}
	if newer != "" {
		return fmt.Errorf("%s is older than %s: run make wasm build/cachesync (make bench does), or it measures old code", bin, newer)
	}
	return nil
}
