package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestNotStale(t *testing.T) {
	t0 := time.Now().Add(-time.Hour)
	tests := []struct {
		name  string
		files map[string]time.Duration // path to its mtime after t0
		want  string                   // "" for no error, else a part of it
	}{
		{"built after its sources", map[string]time.Duration{"bin": 2, "src/a.go": 1, "src/sub/b.go": 1}, ""},
		{"a source edited since", map[string]time.Duration{"bin": 2, "src/a.go": 1, "src/sub/b.go": 3}, filepath.Join("src", "sub", "b.go") + ": run make"},
		{"a newer test or other file does not count", map[string]time.Duration{"bin": 2, "src/a_test.go": 3, "src/notes.md": 3}, ""},
		{"not built", map[string]time.Duration{"src/a.go": 1}, "make wasm build/cachesync"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for path, at := range tt.files {
				full := filepath.Join(dir, path)
				if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(full, nil, 0o644); err != nil {
					t.Fatal(err)
				}
				when := t0.Add(at * time.Minute)
				if err := os.Chtimes(full, when, when); err != nil {
					t.Fatal(err)
				}
			}
			err := notStale(filepath.Join(dir, "bin"), filepath.Join(dir, "src"))
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("notStale: %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("notStale: %v, want an error saying %q", err, tt.want)
			}
		})
	}
}
