package envoy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPathFromEnv(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "envoy")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	notExe := filepath.Join(dir, "envoy.txt")
	if err := os.WriteFile(notExe, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		env, want, wantErr string
	}{
		{exe, exe, ""},
		{notExe, "", "not an executable"},
		{dir, "", "not an executable"},
		{filepath.Join(dir, "missing"), "", "make setup"},
	}
	for _, c := range cases {
		t.Setenv(PathEnv, c.env)
		got, err := Path(t.Context())
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: error %v, want one containing %q", c.env, err, c.wantErr)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: Path = %q, %v", c.env, got, err)
		}
	}
}
