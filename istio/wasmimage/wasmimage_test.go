package wasmimage

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func fakeModule(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return append([]byte("\x00asm\x01\x00\x00\x00"), b...)
}

// pluginOf extracts the module the way Istio's fetcher treats a "compat"
// image: an OCI (or Docker) manifest whose last layer is a gzipped tar
// holding plugin.wasm.
func pluginOf(img v1.Image) ([]byte, error) {
	m, err := img.Manifest()
	if err != nil {
		return nil, err
	}
	if m.MediaType != types.OCIManifestSchema1 && m.MediaType != types.DockerManifestSchema2 {
		return nil, fmt.Errorf("manifest media type %q", m.MediaType)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) == 0 {
		return nil, fmt.Errorf("no layers: %v", err)
	}
	last := layers[len(layers)-1]
	if mt, err := last.MediaType(); err != nil || (mt != types.OCILayer && mt != types.DockerLayer) {
		return nil, fmt.Errorf("last layer media type %q, %v", mt, err)
	}
	rc, err := last.Uncompressed()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("no " + FileName + " in the last layer")
		}
		if err != nil {
			return nil, err
		}
		if h.Name == FileName && h.Typeflag == tar.TypeReg {
			return io.ReadAll(tr)
		}
	}
}

func TestImageThroughRegistry(t *testing.T) {
	srv := httptest.NewServer(registry.New())
	t.Cleanup(srv.Close)
	module := fakeModule(t, 3<<20)
	img, err := New(module)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(strings.TrimPrefix(srv.URL, "http://") + "/kvroute/kvroute-wasm:test")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	pulled, err := remote.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := pulled.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want the single layer of the compat variant", len(layers), err)
	}
	got, err := pluginOf(pulled)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, module) {
		t.Fatalf("pulled plugin.wasm differs from the module (%d vs %d bytes)", len(got), len(module))
	}
	want, _ := img.Digest()
	if d, _ := pulled.Digest(); d != want {
		t.Errorf("registry digest %s, built %s", d, want)
	}
}

func TestImageIsReproducible(t *testing.T) {
	module := fakeModule(t, 1<<10)
	a, err := New(module)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(bytes.Clone(module))
	if err != nil {
		t.Fatal(err)
	}
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db {
		t.Errorf("same module, digests %s and %s", da, db)
	}
	c, err := New(append(bytes.Clone(module), 0))
	if err != nil {
		t.Fatal(err)
	}
	if dc, _ := c.Digest(); dc == da {
		t.Error("different modules, same digest")
	}
}

func TestNotAModule(t *testing.T) {
	for _, b := range [][]byte{nil, []byte("\x00asm"), []byte("#!/bin/sh\necho not wasm\n")} {
		if _, err := New(b); err == nil {
			t.Errorf("New(%q) succeeded", b)
		}
	}
}
