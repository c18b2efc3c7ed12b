package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func TestPushAndLayout(t *testing.T) {
	dir := t.TempDir()
	module := filepath.Join(dir, "kvroute.wasm")
	code := append([]byte("\x00asm\x01\x00\x00\x00"), bytes.Repeat([]byte{7}, 4096)...)
	if err := os.WriteFile(module, code, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(code)

	srv := httptest.NewServer(registry.New())
	t.Cleanup(srv.Close)
	target := strings.TrimPrefix(srv.URL, "http://") + "/kvroute/kvroute-wasm:v0"
	var out bytes.Buffer
	if err := run([]string{"-module", module, "-push", target}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "module sha256 "+hex.EncodeToString(sum[:])) {
		t.Errorf("output lacks the module's sha256:\n%s", out.String())
	}
	ref, _ := name.ParseReference(target)
	img, err := remote.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	digest, _ := img.Digest()
	if !strings.Contains(out.String(), "image digest "+digest.String()) {
		t.Errorf("output does not name the pushed digest %s:\n%s", digest, out.String())
	}

	oci := filepath.Join(dir, "oci")
	out.Reset()
	if err := run([]string{"-module", module, "-layout", oci}, &out); err != nil {
		t.Fatal(err)
	}
	p, err := layout.FromPath(oci)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Image(digest); err != nil {
		t.Errorf("layout lacks the image pushed above (%s): %v", digest, err)
	}

	for _, args := range [][]string{
		{"-module", module},
		{"-module", module, "-push", target, "-layout", oci},
		{"-module", filepath.Join(dir, "missing.wasm"), "-layout", oci},
	} {
		if err := run(args, &out); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}
