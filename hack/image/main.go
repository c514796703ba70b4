// Command image builds the coder-k8s container image without a container
// engine: one image per platform from binaries built beforehand, gathered in
// an OCI image index and written as an OCI image layout (a directory that
// registries, crane, skopeo and containerd import).
//
//	go run ./hack/image --out bin/image --ref ghcr.io/coder/coder-k8s:0.2.0 \
//	    --binary linux/amd64=bin/image-build/linux-amd64/coder-k8s
//
// Each image is a base plus one layer holding /coder-k8s, running as user
// 65532 with no shell. The base is assembled here by default (passwd and
// group files naming nonroot, a home and /tmp, and the CA bundle of
// golang.org/x/crypto/x509roots/fallback, pinned by go.mod), so building
// needs no network; --base names a registry image instead (the release
// uses gcr.io/distroless/static-debian12:nonroot, which has the same
// layout). Layers and config carry --created as their time, so the same
// inputs give the same digests.
package main

import (
	"archive/tar"
	"bytes"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// The user the image runs as: distroless's nonroot.
const (
	uid      = 65532
	userName = "nonroot"
	// configPath is where the Helm chart mounts the configuration file.
	configPath = "/etc/coder-k8s/config.yaml"
)

// options are what an image is built from.
type options struct {
	// binaries maps a platform ("linux/amd64") to the binary for it.
	binaries map[string]string
	// base is a registry image to build on; empty assembles one.
	base        string
	created     time.Time
	version     string
	revision    string
	source      string
	licenses    string
	description string
}

func main() {
	var (
		o        options
		out, ref string
		created  string
		binaries multiFlag
	)
	flag.StringVar(&out, "out", "bin/image", "OCI image layout directory to write (replaced)")
	flag.StringVar(&ref, "ref", "", "the image's name and tag (repository:tag), recorded in the layout for tools that import it")
	flag.Var(&binaries, "binary", "platform=path of a static binary, e.g. linux/amd64=bin/coder-k8s (repeatable)")
	flag.StringVar(&o.base, "base", "", "base image in a registry (e.g. gcr.io/distroless/static-debian12:nonroot); empty assembles one here")
	flag.StringVar(&created, "created", "1970-01-01T00:00:00Z", "creation time of the image and its files (RFC 3339), e.g. the commit's")
	flag.StringVar(&o.version, "version", "", "org.opencontainers.image.version")
	flag.StringVar(&o.revision, "revision", "", "org.opencontainers.image.revision (the commit)")
	flag.StringVar(&o.source, "source", "https://github.com/coder/coder-k8s", "org.opencontainers.image.source")
	flag.StringVar(&o.licenses, "licenses", "NOASSERTION", "org.opencontainers.image.licenses (an SPDX expression)")
	flag.StringVar(&o.description, "description", "Kubernetes operator for Coder", "org.opencontainers.image.description")
	flag.Parse()

	if err := run(o, out, ref, created, binaries); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(o options, out, ref, created string, binaries multiFlag) error {
	t, err := time.Parse(time.RFC3339, created)
	if err != nil {
		return fmt.Errorf("--created: %w", err)
	}
	o.created = t
	o.binaries = map[string]string{}
	for _, b := range binaries {
		platform, path, ok := strings.Cut(b, "=")
		if !ok || platform == "" || path == "" {
			return fmt.Errorf("--binary %q: want platform=path", b)
		}
		o.binaries[platform] = path
	}
	if len(o.binaries) == 0 {
		return errors.New("no --binary given")
	}
	if o.version == "" || o.revision == "" {
		return errors.New("--version and --revision are required (they label the image)")
	}
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("--ref %q: want repository:tag: %w", ref, err)
	}
	idx, err := build(o)
	if err != nil {
		return err
	}
	if err := writeLayout(out, idx, tag); err != nil {
		return err
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("wrote %s: %s@%s\n", out, tag, d)
	return nil
}

// build returns the index of one image per platform of o.binaries.
func build(o options) (v1.ImageIndex, error) {
	platforms := slices.Sorted(maps.Keys(o.binaries))
	var adds []mutate.IndexAddendum
	for _, p := range platforms {
		platform, err := v1.ParsePlatform(p)
		if err != nil {
			return nil, fmt.Errorf("platform %q: %w", p, err)
		}
		img, err := buildImage(o, *platform, o.binaries[p])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: platform}})
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	return mutate.Annotations(idx, o.labels()).(v1.ImageIndex), nil
}

// labels are the image's OCI annotations and config labels.
func (o options) labels() map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "coder-k8s",
		"org.opencontainers.image.description": o.description,
		"org.opencontainers.image.source":      o.source,
		"org.opencontainers.image.version":     o.version,
		"org.opencontainers.image.revision":    o.revision,
		"org.opencontainers.image.licenses":    o.licenses,
		"org.opencontainers.image.created":     o.created.UTC().Format(time.RFC3339),
	}
}

func buildImage(o options, platform v1.Platform, binary string) (v1.Image, error) {
	base, err := baseImage(o, platform)
	if err != nil {
		return nil, err
	}
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, fmt.Errorf("read the binary: %w", err)
	}
	app, err := layer(o.created, []file{{name: "coder-k8s", mode: 0o755, data: bin}})
	if err != nil {
		return nil, err
	}
	img, err := mutate.Append(base, mutate.Addendum{Layer: app, MediaType: types.OCILayer,
		History: v1.History{Created: v1.Time{Time: o.created}, CreatedBy: "hack/image: /coder-k8s", Comment: "coder-k8s " + o.version}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Created = v1.Time{Time: o.created}
	cf.OS, cf.Architecture, cf.Variant = platform.OS, platform.Architecture, platform.Variant
	cf.Config.User = fmt.Sprintf("%d:%d", uid, uid)
	cf.Config.Entrypoint = []string{"/coder-k8s"}
	cf.Config.Cmd = []string{"--config", configPath}
	cf.Config.WorkingDir = "/home/" + userName
	cf.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"}
	cf.Config.Labels = o.labels()
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(img, o.labels()).(v1.Image), nil
}

// baseImage is o.base for platform, or the assembled base.
func baseImage(o options, platform v1.Platform) (v1.Image, error) {
	if o.base != "" {
		ref, err := name.ParseReference(o.base)
		if err != nil {
			return nil, fmt.Errorf("--base: %w", err)
		}
		img, err := remote.Image(ref, remote.WithPlatform(platform), remote.WithAuthFromKeychain(authn.DefaultKeychain))
		if err != nil {
			return nil, fmt.Errorf("pull the base %s: %w", o.base, err)
		}
		return img, nil
	}
	files, err := baseFiles()
	if err != nil {
		return nil, err
	}
	l, err := layer(o.created, files)
	if err != nil {
		return nil, err
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	return mutate.Append(img, mutate.Addendum{Layer: l, MediaType: types.OCILayer,
		History: v1.History{Created: v1.Time{Time: o.created}, CreatedBy: "hack/image: base (passwd, group, CA certificates)"}})
}

// baseFiles are the assembled base: what distroless static's nonroot
// variant gives a static Go binary, and nothing to run but it.
func baseFiles() ([]file, error) {
	var certs bytes.Buffer
	n := 0
	for r := range bundle.Roots() {
		// Roots with a distrust-after date are left out: a PEM file
		// cannot carry the constraint, and without it they would be
		// trusted for certificates issued after that date.
		if r.Constraint != nil {
			continue
		}
		if err := pem.Encode(&certs, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			return nil, err
		}
		n++
	}
	if n == 0 {
		return nil, errors.New("the CA bundle is empty")
	}
	return []file{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/passwd", mode: 0o644, data: fmt.Appendf(nil, "root:x:0:0:root:/root:/sbin/nologin\n%s:x:%d:%d:%s:/home/%s:/sbin/nologin\n", userName, uid, uid, userName, userName)},
		{name: "etc/group", mode: 0o644, data: fmt.Appendf(nil, "root:x:0:\n%s:x:%d:\n", userName, uid)},
		{name: "etc/nsswitch.conf", mode: 0o644, data: []byte("hosts: files dns\n")},
		{name: "etc/ssl/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: certs.Bytes()},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/" + userName + "/", mode: 0o700, dir: true, uid: uid},
		{name: "tmp/", mode: 0o1777, dir: true},
	}, nil
}

// file is one entry of a layer.
type file struct {
	name string
	mode int64
	dir  bool
	uid  int
	data []byte
}

// layer is a gzipped tar of files, in the order given, all dated t.
func layer(t time.Time, files []file) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.uid, ModTime: t, Format: tar.FormatPAX,
			Typeflag: tar.TypeReg, Size: int64(len(f.data))}
		if f.dir {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer))
}

// writeLayout writes idx as the only entry of a fresh OCI layout at dir,
// named tag: the OCI annotation holds the tag, containerd's the whole name
// (ctr images import, kind load image-archive).
func writeLayout(dir string, idx v1.ImageIndex, tag name.Tag) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("write %s: %w", dir, err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag.TagStr(),
		"io.containerd.image.name":          tag.Name(),
	})); err != nil {
		return fmt.Errorf("write %s: %w", dir, err)
	}
	return nil
}

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }
