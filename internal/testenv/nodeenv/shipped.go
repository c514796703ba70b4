package nodeenv

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/coder/coder-k8s/internal/testenv"
)

// ShippedImage is the image index `make image` wrote to bin/image once its
// image for this machine's platform holds, as /coder-k8s, the binary
// testenv.ShippedBinary returns; otherwise the error names `make image`.
func ShippedImage() (v1.ImageIndex, error) {
	dir, err := testenv.BinDir()
	if err != nil {
		return nil, err
	}
	bin, err := testenv.ShippedBinary()
	if err != nil {
		return nil, err
	}
	shipped, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	p, err := layout.FromPath(filepath.Join(dir, "image"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s not found: run `make image`", filepath.Join(dir, "image"))
	}
	if err != nil {
		return nil, err
	}
	top, err := p.ImageIndex()
	if err != nil {
		return nil, err
	}
	m, err := top.IndexManifest()
	if err != nil || len(m.Manifests) != 1 {
		return nil, fmt.Errorf("bin/image: %v, %d entries, want the one `make image` writes", err, len(m.Manifests))
	}
	idx, err := top.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, d := range im.Manifests {
		if d.Platform == nil || d.Platform.OS != runtime.GOOS || d.Platform.Architecture != runtime.GOARCH {
			continue
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			return nil, err
		}
		inImage, err := fileInImage(img, "coder-k8s")
		if err != nil {
			return nil, fmt.Errorf("bin/image: %w", err)
		}
		if !bytes.Equal(inImage, shipped) {
			return nil, fmt.Errorf("bin/image's /coder-k8s (%d bytes) is not %s (%d bytes): run `make image`", len(inImage), bin, len(shipped))
		}
		return idx, nil
	}
	return nil, fmt.Errorf("bin/image has no image for %s/%s: run `make image`", runtime.GOOS, runtime.GOARCH)
}

// fileInImage returns the content of path in img's file system.
func fileInImage(img v1.Image, path string) ([]byte, error) {
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("the image has no %s", path)
		}
		if err != nil {
			return nil, err
		}
		if strings.TrimPrefix(h.Name, "/") == path {
			return io.ReadAll(tr)
		}
	}
}
