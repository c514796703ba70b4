// Package backend tells the aggregated API server which coderd serves a
// Kubernetes namespace, with a codersdk client ready to call it: the
// CoderControlPlanes of the namespace that hold operator access (all mode,
// ControlPlaneProvider), or the one coderd given in the configuration file
// (aggregated-apiserver mode, StaticProvider).
//
// Both providers answer from memory (informer caches and clients built
// ahead), since they sit on every request's path.
package backend

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"

	"github.com/coder/coder-k8s/internal/identity"
)

// Backend is one coderd as seen from one Kubernetes namespace.
type Backend struct {
	// Namespace is the Kubernetes namespace its objects appear in.
	Namespace string
	// ControlPlane is the CoderControlPlane's name; "" for the static
	// backend.
	ControlPlane string
	// URL is where coderd is reached; shared, never mutate it.
	URL *url.URL
	// Client calls coderd as the operator. It is shared by every request
	// until its token or URL changes; never mutate it.
	Client *codersdk.Client
	// Identity says whose Coder identity callers act with.
	Identity identity.Rules
	// ReservedUsers are the Coder usernames coder-k8s created for itself
	// in this coderd, which no Kubernetes user is mapped onto
	// (identity.Coderd.Reserved); shared, never mutate it.
	ReservedUsers []string
	// WorkspaceNamespaces are where the coderd's Kubernetes workspaces
	// run: the namespaces its workspace RBAC covers (the control plane's
	// and spec.workspaceRBAC.extraNamespaces), or the static backend's
	// namespace; shared, never mutate it.
	WorkspaceNamespaces []string
}

// Key identifies the backend: "<namespace>/<controlPlane>", and
// "<namespace>/" for the static backend.
func (b Backend) Key() string { return b.Namespace + "/" + b.ControlPlane }

// Provider finds the coderds that serve Kubernetes namespaces.
type Provider interface {
	// Backends returns the eligible backends for namespace, or for every
	// namespace when namespace == "", sorted by namespace then control
	// plane name. A namespace that does not exist or is being deleted
	// (phase Terminating or deletionTimestamp set) has no backends: that
	// is how a namespace deletion never reaches Coder, since the namespace
	// controller then sees an empty namespace.
	Backends(ctx context.Context, namespace string) ([]Backend, error)
	// Ready returns nil once the provider can answer (its informers have
	// synced), or an error saying what it waits for.
	Ready() error
}

// ErrNoBackend is for callers to wrap when a namespace has no backend
// (for example to answer NotFound for an object in it).
var ErrNoBackend = errors.New("no coderd serves this namespace")

// ErrNotReady is wrapped by Backends' error while the provider's informers
// have not synced.
var ErrNotReady = errors.New("backend provider is not ready")

// namespaceUsable reports whether objects may appear in ns: it exists and
// is not being deleted.
func namespaceUsable(ns *corev1.Namespace) bool {
	return ns != nil && ns.DeletionTimestamp == nil && ns.Status.Phase != corev1.NamespaceTerminating
}

// parseCoderURL accepts an absolute http(s) URL with a host.
func parseCoderURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("parse coderd URL %q: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("coderd URL %q: scheme must be http or https", raw)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("coderd URL %q has no host", raw)
	}
	return u, nil
}

// identityRules converts spec.identity (or the static backend's) into
// rules; empty fields take the CRD's defaults.
func identityRules(mode, prefix, matchBy string, mappings []identity.Mapping) identity.Rules {
	r := identity.Rules{Mode: identity.Mode(mode), UsernamePrefix: prefix, MatchField: identity.MatchField(matchBy), Mappings: mappings}
	if r.Mode == "" {
		r.Mode = identity.ModeMapped
	}
	if r.MatchField == "" {
		r.MatchField = identity.MatchEmail
	}
	return r
}

func sortBackends(bs []Backend) {
	sort.Slice(bs, func(i, j int) bool {
		if bs[i].Namespace != bs[j].Namespace {
			return bs[i].Namespace < bs[j].Namespace
		}
		return bs[i].ControlPlane < bs[j].ControlPlane
	})
}
