package main

import (
	"archive/tar"
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestImage builds the image for two platforms from stand-in binaries and
// reads it back from the OCI layout as a registry or containerd would:
// one image per platform, running the binary as 65532 with nothing else
// to run, labelled, and the same digests from the same inputs.
func TestImage(t *testing.T) {
	dir := t.TempDir()
	bins := map[string][]byte{"linux/amd64": []byte("amd64 binary"), "linux/arm64": []byte("arm64 binary")}
	var flags multiFlag
	for p, data := range bins {
		path := filepath.Join(dir, strings.ReplaceAll(p, "/", "-"))
		if err := os.WriteFile(path, data, 0o755); err != nil {
			t.Fatal(err)
		}
		flags = append(flags, p+"="+path)
	}
	o := options{version: "v1.2.3", revision: "abc1234", source: "https://example.com/src", licenses: "NOASSERTION", description: "d"}
	out := filepath.Join(dir, "layout")
	if err := run(o, out, "registry.example.com/team/coder-k8s:1.2.3", "2026-11-26T10:00:00Z", flags); err != nil {
		t.Fatal(err)
	}

	p, err := layout.FromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || !maps.Equal(im.Manifests[0].Annotations, map[string]string{
		"org.opencontainers.image.ref.name": "1.2.3", "io.containerd.image.name": "registry.example.com/team/coder-k8s:1.2.3"}) {
		t.Fatalf("layout index: %+v, want one entry named registry.example.com/team/coder-k8s:1.2.3", im.Manifests)
	}
	idx, err := top.ImageIndex(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	if mt, _ := idx.MediaType(); mt != types.OCIImageIndex {
		t.Errorf("index media type %s, want %s", mt, types.OCIImageIndex)
	}
	manifest, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	wantLabels := map[string]string{
		"org.opencontainers.image.title": "coder-k8s", "org.opencontainers.image.description": "d",
		"org.opencontainers.image.source": "https://example.com/src", "org.opencontainers.image.version": "v1.2.3",
		"org.opencontainers.image.revision": "abc1234", "org.opencontainers.image.licenses": "NOASSERTION",
		"org.opencontainers.image.created": "2026-11-26T10:00:00Z",
	}
	if !maps.Equal(manifest.Annotations, wantLabels) {
		t.Errorf("index annotations %v, want %v", manifest.Annotations, wantLabels)
	}
	var platforms []string
	for _, d := range manifest.Manifests {
		platform := d.Platform.OS + "/" + d.Platform.Architecture
		platforms = append(platforms, platform)
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		checkImage(t, platform, img, bins[platform], wantLabels)
	}
	if want := slices.Sorted(maps.Keys(bins)); !slices.Equal(platforms, want) {
		t.Errorf("platforms %v, want %v", platforms, want)
	}

	// Reproducible: the same inputs give the same index; another time does not.
	again, err := build(withBinaries(t, o, flags, "2026-11-26T10:00:00Z"))
	if err != nil {
		t.Fatal(err)
	}
	later, err := build(withBinaries(t, o, flags, "2026-11-27T10:00:00Z"))
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := idx.Digest()
	d2, _ := again.Digest()
	d3, _ := later.Digest()
	if d1 != d2 || d1 == d3 {
		t.Errorf("digests: written %s, rebuilt %s (want equal), another time %s (want different)", d1, d2, d3)
	}
}

func withBinaries(t *testing.T, o options, flags multiFlag, created string) options {
	t.Helper()
	o.created, _ = time.Parse(time.RFC3339, created)
	o.binaries = map[string]string{}
	for _, f := range flags {
		p, path, _ := strings.Cut(f, "=")
		o.binaries[p] = path
	}
	return o
}

func checkImage(t *testing.T, platform string, img v1.Image, binary []byte, labels map[string]string) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if cf.OS+"/"+cf.Architecture != platform || c.User != "65532:65532" || !slices.Equal(c.Entrypoint, []string{"/coder-k8s"}) ||
		!slices.Equal(c.Cmd, []string{"--config", "/etc/coder-k8s/config.yaml"}) || !maps.Equal(c.Labels, labels) {
		t.Errorf("%s config: os/arch %s/%s, user %q, entrypoint %q, cmd %q, labels %v", platform, cf.OS, cf.Architecture, c.User, c.Entrypoint, c.Cmd, c.Labels)
	}
	if mt, _ := img.MediaType(); mt != types.OCIManifestSchema1 {
		t.Errorf("%s manifest media type %s", platform, mt)
	}

	// The file system as a runtime unpacks it.
	files := map[string]*tar.Header{}
	contents := map[string][]byte{}
	tr := tar.NewReader(mutate.Extract(img))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimSuffix(h.Name, "/")
		files[name] = h
		contents[name], _ = io.ReadAll(tr)
	}
	want := []string{"coder-k8s", "etc", "etc/group", "etc/nsswitch.conf", "etc/passwd", "etc/ssl", "etc/ssl/certs",
		"etc/ssl/certs/ca-certificates.crt", "home", "home/nonroot", "tmp"}
	if got := slices.Sorted(maps.Keys(files)); !slices.Equal(got, want) {
		t.Fatalf("%s files %q, want %q (no shell, nothing else to run)", platform, got, want)
	}
	if h := files["coder-k8s"]; h.Mode != 0o755 || !bytes.Equal(contents["coder-k8s"], binary) {
		t.Errorf("%s /coder-k8s: mode %o, content %q", platform, h.Mode, contents["coder-k8s"])
	}
	for name, h := range files {
		if h.Typeflag == tar.TypeReg && h.Mode&0o111 != 0 && name != "coder-k8s" {
			t.Errorf("%s: %s is executable", platform, name)
		}
	}
	if !strings.Contains(string(contents["etc/passwd"]), "nonroot:x:65532:65532:") || files["home/nonroot"].Uid != 65532 || files["tmp"].Mode != 0o1777 {
		t.Errorf("%s: passwd %q, home owner %d, /tmp mode %o", platform, contents["etc/passwd"], files["home/nonroot"].Uid, files["tmp"].Mode)
	}
	n, rest := 0, contents["etc/ssl/certs/ca-certificates.crt"]
	for {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if _, err := x509.ParseCertificate(b.Bytes); b.Type != "CERTIFICATE" || err != nil {
			t.Fatalf("%s: CA bundle entry %d: %s block, %v", platform, n, b.Type, err)
		}
		n++
	}
	if n < 100 || len(bytes.TrimSpace(rest)) != 0 {
		t.Errorf("%s: the CA bundle holds %d certificates and %d bytes of something else, want at least 100 and nothing else", platform, n, len(rest))
	}
}

func TestRunRefusesIncompleteInput(t *testing.T) {
	o := options{version: "v1", revision: "r"}
	for _, tc := range []struct {
		name    string
		o       options
		created string
		flags   multiFlag
		want    string
	}{
		{"no binary", o, "2026-01-01T00:00:00Z", nil, "no --binary given"},
		{"a binary without its platform", o, "2026-01-01T00:00:00Z", multiFlag{"bin/coder-k8s"}, "want platform=path"},
		{"no version", options{revision: "r"}, "2026-01-01T00:00:00Z", multiFlag{"linux/amd64=x"}, "--version and --revision are required"},
		{"a bad time", o, "yesterday", multiFlag{"linux/amd64=x"}, "--created"},
		{"a missing binary", o, "2026-01-01T00:00:00Z", multiFlag{"linux/amd64=" + filepath.Join(t.TempDir(), "none")}, "read the binary"},
		{"no tag", o, "2026-01-01T00:00:00Z", multiFlag{"linux/amd64=x"}, "want repository:tag"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref := "example.com/coder-k8s:1"
			if tc.name == "no tag" {
				ref = "example.com/coder-k8s"
			}
			err := run(tc.o, filepath.Join(t.TempDir(), "out"), ref, tc.created, tc.flags)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
