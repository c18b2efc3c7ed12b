// Package wasmimage packages a proxy-wasm module as the OCI image Istio's
// Wasm fetcher (istio-agent) pulls for an oci:// module URL.
//
// The fetcher accepts a Docker or OCI image whose last layer is a gzipped tar
// holding a file named plugin.wasm (the "compat" variant, which is what
// `FROM scratch` + `COPY kvroute.wasm ./plugin.wasm` builds), or a two-layer
// Wasm artifact. New builds the compat variant with a single layer, so it is
// the last layer too, and builds it reproducibly: the same module always
// gives the same image digest.
package wasmimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// FileName is the name the fetcher looks for in the layer.
const FileName = "plugin.wasm"

// New returns the image holding module as /plugin.wasm.
func New(module []byte) (v1.Image, error) {
	if len(module) < 8 || !bytes.Equal(module[:4], []byte("\x00asm")) {
		return nil, fmt.Errorf("wasmimage: not a Wasm module (no \\0asm magic)")
	}
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	if err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg,
		Name:     FileName,
		Mode:     0o444,
		Size:     int64(len(module)),
		Format:   tar.FormatPAX,
	}); err != nil {
		return nil, fmt.Errorf("wasmimage: %w", err)
	}
	if _, err := tw.Write(module); err != nil {
		return nil, fmt.Errorf("wasmimage: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("wasmimage: %w", err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("wasmimage: layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: "wasm",
		OS:           "wasip1",
		RootFS:       v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, fmt.Errorf("wasmimage: config: %w", err)
	}
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, MediaType: types.OCILayer})
	if err != nil {
		return nil, fmt.Errorf("wasmimage: %w", err)
	}
	return img, nil
}
