package nodeenv

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/coder/coder-k8s/internal/testenv"
)

// Registry is an OCI registry (go-containerregistry's, in memory) on
// loopback. For a node it also listens on the host's end of the node's
// network, on the same port: containerd on the node maps the loopback name
// to that address (a registry mirror), so one image name works for helm and
// kubectl on the host and for the kubelet.
type Registry struct {
	// Host is 127.0.0.1:PORT, the registry part of image names.
	Host string
	// NodeEndpoint is http://<host IP>:PORT when the registry serves a
	// node, else empty.
	NodeEndpoint string

	srv *http.Server
}

// StartRegistry serves a new, empty registry on 127.0.0.1 and on also.
func StartRegistry(also net.IP) (*Registry, error) {
	r := &Registry{srv: &http.Server{
		Handler:           registry.New(registry.Logger(log.New(io.Discard, "", 0))),
		ReadHeaderTimeout: 10 * time.Second,
	}}
	for attempt := 1; ; attempt++ {
		lo, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("registry: %w", err)
		}
		port := lo.Addr().(*net.TCPAddr).Port
		listeners := []net.Listener{lo}
		if also != nil {
			l, err := net.Listen("tcp", net.JoinHostPort(also.String(), strconv.Itoa(port)))
			if err != nil {
				lo.Close()
				if attempt < 5 {
					continue // the port is taken there: try another
				}
				return nil, fmt.Errorf("registry on %s: %w", also, err)
			}
			listeners = append(listeners, l)
			r.NodeEndpoint = "http://" + l.Addr().String()
		}
		r.Host = lo.Addr().String()
		for _, l := range listeners {
			go func() { _ = r.srv.Serve(l) }() // ends at Close
		}
		return r, nil
	}
}

// Close stops the registry.
func (r *Registry) Close() { _ = r.srv.Close() }

// Tag is the reference to repository:tag in this registry (plain HTTP).
func (r *Registry) Tag(repoTag string) (name.Tag, error) {
	return name.NewTag(r.Host+"/"+repoTag, name.Insecure)
}

// PushIndex pushes an image index as repository:tag and returns its name.
func (r *Registry) PushIndex(ctx context.Context, repoTag string, idx v1.ImageIndex) (string, error) {
	ref, err := r.Tag(repoTag)
	if err != nil {
		return "", err
	}
	if err := remote.WriteIndex(ref, idx, remote.WithContext(ctx)); err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	return ref.String(), nil
}

// PushImage pushes an image as repository:tag and returns its name.
func (r *Registry) PushImage(ctx context.Context, repoTag string, img v1.Image) (string, error) {
	ref, err := r.Tag(repoTag)
	if err != nil {
		return "", err
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	return ref.String(), nil
}

// binaryImage is an image of one static binary at /name, its entrypoint,
// for this machine's platform, running as user.
func binaryImage(path, name string, user int) (v1.Image, error) {
	return newImage([]imageFile{{path: name, src: path, mode: 0o755}},
		v1.Config{Entrypoint: []string{"/" + name}, User: strconv.Itoa(user)})
}

// CoderImage is coderd's image laid out as Coder's release image is: the
// coder binary the stack runs (bin/coder, static) at /opt/coder, the
// entrypoint, OpenTofu (bin/terraform) as terraform on PATH and a POSIX
// shell (bin/gosh) as /bin/sh, the login shell of user coder (1000), which
// it runs as with a writable /tmp as HOME. Workspace pods run `coder agent`
// from it too. Its Terraform CLI
// configuration is an empty file (see testenv's Coder.environment), so templates
// without providers build with no network.
func CoderImage() (v1.Image, error) {
	coder, err := testenv.Binary("coder")
	if err != nil {
		return nil, err
	}
	tofu, err := testenv.Binary("terraform")
	if err != nil {
		return nil, err
	}
	sh, err := testenv.Binary("gosh")
	if err != nil {
		return nil, err
	}
	return newImage([]imageFile{
		{path: "opt/coder", src: coder, mode: 0o755},
		{path: "usr/local/bin/terraform", src: tofu, mode: 0o755},
		{path: "bin/sh", src: sh, mode: 0o755},
		// The agent runs scripts and sessions with the user's login shell
		// from /etc/passwd, as in Coder's image (user coder, 1000).
		{path: "etc/passwd", content: "root:x:0:0:root:/root:/bin/sh\ncoder:x:1000:1000:coder:/tmp:/bin/sh\n", mode: 0o644},
		{path: "etc/group", content: "root:x:0:\ncoder:x:1000:\n", mode: 0o644},
		// The agent's resource monitor reads the distribution's name.
		{path: "etc/os-release", content: "ID=coder-k8s-test\nNAME=\"coder-k8s test image\"\n", mode: 0o644},
		{path: "etc/terraform.rc", mode: 0o644},
		{path: "tmp", dir: true, mode: 0o1777},
	}, v1.Config{
		Entrypoint: []string{"/opt/coder"},
		User:       "1000",
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "TF_CLI_CONFIG_FILE=/etc/terraform.rc"},
	})
}

// imageFile is one entry of an image newImage builds: a directory, a copy
// of a file on this machine (src), or a file holding content.
type imageFile struct {
	path, src, content string
	mode               int64
	dir                bool
}

// newImage is a one-layer image of files with config cfg, for this
// machine's platform (containerd ignores images without one).
func newImage(files []imageFile, cfg v1.Config) (v1.Image, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.path, Mode: f.mode, Typeflag: tar.TypeReg}
		var content []byte
		switch {
		case f.dir:
			h.Typeflag, h.Name = tar.TypeDir, f.path+"/"
		case f.src != "":
			b, err := os.ReadFile(f.src)
			if err != nil {
				return nil, fmt.Errorf("image: %w", err)
			}
			content = b
		default:
			content = []byte(f.content)
		}
		h.Size = int64(len(content))
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(content); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = runtime.GOOS, runtime.GOARCH
	cf.Config = cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, errors.Join(errors.New("image"), err)
	}
	return img, nil
}
