// Command wasmimage packages kvroute's module as the OCI image Istio pulls
// (see package wasmimage) and pushes it to a registry, with the credentials
// of the local Docker configuration, or writes it as an OCI image layout
// directory for other tools to push:
//
//	wasmimage -module build/kvroute.wasm -push ghcr.io/kvroute/kvroute-wasm:v0.1.0
//	wasmimage -module build/kvroute.wasm -layout build/kvroute-oci
//
// It prints the image digest and the module's SHA-256 (the sha256 to pin in
// istio/kvroute.yaml).
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kvroute/kvroute/istio/wasmimage"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "wasmimage:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("wasmimage", flag.ContinueOnError)
	module := fs.String("module", "build/kvroute.wasm", "the compiled filter")
	push := fs.String("push", "", "push the image to this reference (registry/repository:tag)")
	dir := fs.String("layout", "", "write the image to this OCI image layout directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if (*push == "") == (*dir == "") {
		return errors.New("give exactly one of -push and -layout")
	}
	code, err := os.ReadFile(*module)
	if err != nil {
		return err
	}
	img, err := wasmimage.New(code)
	if err != nil {
		return err
	}
	if *push != "" {
		ref, err := name.ParseReference(*push)
		if err != nil {
			return err
		}
		if err := remote.Write(ref, img, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return fmt.Errorf("push %s: %w", ref, err)
		}
	} else {
		p, err := layout.Write(*dir, empty.Index)
		if err != nil {
			return err
		}
		if err := p.AppendImage(img); err != nil {
			return err
		}
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	sum := sha256.Sum256(code)
	_, err = fmt.Fprintf(stdout, "image digest %s\nmodule sha256 %s\n", digest, hex.EncodeToString(sum[:]))
	return err
}
