package storage

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/coder/coder/v2/codersdk"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
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

// coderd describes t's coderd to the identity service.
func (t target) coderd() identity.Coderd {
	return identity.Coderd{Key: t.coderdKey(), Name: t.describe(), Tag: t.tag(), Owner: t.Client, Rules: t.Identity, Reserved: t.ReservedUsers}
}

// describe names t's backend in messages.
func (t target) describe() string { return describeKey(t.Key()) }

// describeKey names the backend of a target key in messages.
func describeKey(key string) string {
	ns, cp, _ := strings.Cut(key, "/")
	if cp == "" {
		return "the static backend"
	}
	return fmt.Sprintf("control plane %s/%s", ns, cp)
}

// tag names t's backend in token names.
func (t target) tag() string {
	if t.ControlPlane == "" {
		return "static"
	}
	return t.Namespace + "_" + t.ControlPlane
}

// acting returns t calling coderd as its caller: what writes use, so that
// coderd decides and its audit log names the caller.
func (t target) acting() target {
	if t.caller != nil && t.operator == nil {
		t.operator, t.Client = t.Client, t.caller.Client
	}
	return t
}

// operatorClient calls t's coderd as the operator, whoever acts: for what
// only the operator reads (another user's ID to ask coderd about).
func (t target) operatorClient() *codersdk.Client {
	if t.operator != nil {
		return t.operator
	}
	return t.Client
}

// backendOf is the backend a target key names (namespace and control
// plane only).
func backendOf(key string) backend.Backend {
	ns, cp, _ := strings.Cut(key, "/")
	return backend.Backend{Namespace: ns, ControlPlane: cp}
}

// backendKey is the target key of an object: its namespace and the control
// plane its label names ("" for the static backend).
func backendKey(o watchcache.Object) string {
	return o.GetNamespace() + "/" + o.GetLabels()[aggv1.LabelControlPlane]
}
