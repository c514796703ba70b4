package storage

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/coder/coder/v2/codersdk"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/identity"
)

// The backends a request reaches: which coderd serves a namespace and, for
// a name with a control plane prefix, which of the namespace's several.

// target is a backend as one request sees it: prefixed says whether its
// namespace holds several control planes, so that object names carry the
// control plane's name.
type target struct {
	backend.Backend
	prefixed bool
	// caller is the request's Coder user when the backend maps
	// identities; nil when the operator acts (Operator mode, the poller).
	caller *identity.Caller
	// controller is set instead of caller for one of the cluster's
	// controllers: the operator acts, and it may only read (restricted
	// fields removed), delete and change Kubernetes metadata.
	controller *identity.Caller
	// operator is the operator's client once Client acts as the caller.
	operator *codersdk.Client
}

// coderdKey identifies, for the caches of what coderd answered, the
// coderd behind t and who asks it: the backend (namespace and control
// plane) and the URL its client calls. IDs are only unique within one
// coderd, and a tenant's coderd may answer with any ID it likes, so an
// entry read from one backend's coderd is never served for another.
func (t target) coderdKey() string {
	u := ""
	if t.Client != nil && t.Client.URL != nil {
		u = t.Client.URL.String()
	}
	return t.Key() + " " + u
}

// targetsOf marks the backends of namespaces that have several.
func targetsOf(backends []backend.Backend) []target {
	perNamespace := map[string]int{}
	for _, b := range backends {
		perNamespace[b.Namespace]++
	}
	out := make([]target, len(backends))
	for i, b := range backends {
		out[i] = target{Backend: b, prefixed: perNamespace[b.Namespace] > 1}
	}
	return out
}

// targets returns the backends serving namespace ("" = every namespace).
func (r *genericStore) targets(ctx context.Context, namespace string) ([]target, error) {
	bs, err := r.backends.Backends(ctx, namespace)
	if err != nil {
		return nil, apierrors.NewServiceUnavailable(fmt.Sprintf("find the control planes of namespace %q: %v", namespace, err))
	}
	return targetsOf(bs), nil
}

// resolve finds the backend an object name of namespace refers to.
// controlPlane is the name's prefix, empty when it has none.
func (r *genericStore) resolve(ctx context.Context, namespace, controlPlane, name string) (target, error) {
	ts, err := r.targets(ctx, namespace)
	if err != nil {
		return target{}, err
	}
	switch {
	case len(ts) == 0:
		return target{}, r.notFound(name, fmt.Sprintf("namespace %q has no CoderControlPlane with ready operator access", namespace))
	case controlPlane == "" && len(ts) == 1:
		return ts[0], nil
	case controlPlane == "":
		return target{}, r.notFound(name, fmt.Sprintf("namespace %q has several control planes (%s): prefix the name with the control plane's name", namespace, controlPlaneNames(ts)))
	case len(ts) == 1:
		return target{}, r.notFound(name, fmt.Sprintf("namespace %q has one control plane: name the object without the %q prefix", namespace, controlPlane))
	}
	for _, t := range ts {
		if t.ControlPlane == controlPlane {
			return t, nil
		}
	}
	return target{}, r.notFound(name, fmt.Sprintf("namespace %q has no control plane %q with ready operator access (it has %s)", namespace, controlPlane, controlPlaneNames(ts)))
}

func controlPlaneNames(ts []target) string {
	names := make([]string, len(ts))
	for i, t := range ts {
		names[i] = t.ControlPlane
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}
