package workload

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// How children are written
//
// Children are written with server-side apply under the field manager
// FieldOwner: the API server then removes fields the operator stopped
// setting (a removed node selector, annotation or port) and leaves fields
// other managers own alone (the annotation of kubectl rollout restart).
//
// An apply is sent only when it would change something, so a reconcile
// with nothing to do writes nothing. Two checks decide:
//
//   - AppliedHashAnnotation holds a hash of the last applied object; a
//     different hash means the desired object changed (this catches
//     removals, which the second check cannot see);
//   - every field the operator sets must hold the same value in the live
//     object (desiredIn). Fields the live object has in addition, such as
//     those the API server defaults or other controllers add, are ignored,
//     so defaulting never causes a write, while an edit of an
//     operator-owned field by someone else is reverted.

const (
	// FieldOwner is the field manager of what the reconcilers apply.
	FieldOwner = "coder-k8s"
	// AppliedHashAnnotation holds the hash of the last applied object.
	AppliedHashAnnotation = "coder.com/applied-hash"
)

// Owner is who the children being applied belong to.
type Owner struct {
	// Object is the owner. A child in its namespace gets it as controller
	// owner reference, so it is garbage collected with it.
	Object client.Object
	// Kind names the owner's kind in messages ("CoderProvisioner").
	Kind string
	// Labels recognise the owner's children in other namespaces, which
	// cannot carry an owner reference; nil when it has none there.
	Labels map[string]string
}

// Manages reports whether obj belongs to o: through its controller owner
// reference in o's namespace, through o's labels elsewhere.
func (o Owner) Manages(obj client.Object) bool {
	if obj.GetNamespace() == o.Object.GetNamespace() {
		return metav1.IsControlledBy(obj, o.Object)
	}
	if len(o.Labels) == 0 {
		return false
	}
	l := obj.GetLabels()
	for k, v := range o.Labels {
		if l[k] != v {
			return false
		}
	}
	return true
}

// ConflictError means an object the reconciler would own exists and
// belongs to someone else; it needs a change (rename or delete it), so it
// is reported in a condition rather than retried hot.
type ConflictError struct {
	// Reason is the condition reason, "<Kind>Conflict" for a name taken.
	Reason, Msg string
}

func (e *ConflictError) Error() string { return e.Msg }

// NotManaged is the ConflictError for kind namespace/name, which exists
// and is not managed by the ownerKind being reconciled.
func NotManaged(kind, namespace, name, ownerKind string) *ConflictError {
	return &ConflictError{
		Reason: kind + "Conflict",
		Msg:    fmt.Sprintf("%s %s/%s exists and is not managed by this %s; rename or delete it", kind, namespace, name, ownerKind),
	}
}

// Applier writes children.
type Applier struct {
	Client client.Client
	Scheme *runtime.Scheme
	// Uncached reads from the API server an object the reader given to
	// Apply does not have. The manager's cache holds only objects
	// labeled as coder-k8s's (package kubecache): an object of the same
	// name without that label, someone else's, is missing there, and
	// must be seen so that it is refused rather than taken over.
	Uncached client.Reader
}

// Apply writes desired (a typed object or an unstructured one) for owner
// unless the live object, read through reader, already matches it. It
// refuses with a *ConflictError to take over an object owner does not
// manage. When out is not nil (an empty object of desired's kind) it
// receives the live object: as read, or as the API server returned it
// after the write.
func (a Applier) Apply(ctx context.Context, reader client.Reader, owner Owner, desired, out client.Object) (applied bool, err error) {
	gvk, err := a.gvkFor(desired)
	if err != nil {
		return false, err
	}
	kind, ns, name := gvk.Kind, desired.GetNamespace(), desired.GetName()
	if ns == owner.Object.GetNamespace() {
		if err := controllerutil.SetControllerReference(owner.Object, desired, a.Scheme); err != nil {
			return false, fmt.Errorf("set owner of %s %s/%s: %w", kind, ns, name, err)
		}
	}
	want, err := toApplyMap(desired)
	if err != nil {
		return false, fmt.Errorf("%s %s/%s: %w", kind, ns, name, err)
	}
	hash, err := hashOf(want)
	if err != nil {
		return false, fmt.Errorf("%s %s/%s: %w", kind, ns, name, err)
	}
	wantObj := &unstructured.Unstructured{Object: want}
	ann := wantObj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[AppliedHashAnnotation] = hash
	wantObj.SetAnnotations(ann)
	wantObj.SetGroupVersionKind(gvk)

	live := out
	if live == nil {
		if live, err = newObject(desired); err != nil {
			return false, err
		}
	}
	getErr := reader.Get(ctx, client.ObjectKeyFromObject(desired), live)
	if apierrors.IsNotFound(getErr) && a.Uncached != nil {
		getErr = a.Uncached.Get(ctx, client.ObjectKeyFromObject(desired), live)
	}
	switch {
	case apierrors.IsNotFound(getErr):
		// Created by the apply below.
	case getErr != nil:
		return false, fmt.Errorf("get %s %s/%s: %w", kind, ns, name, getErr)
	default:
		if !owner.Manages(live) {
			return false, NotManaged(kind, ns, name, owner.Kind)
		}
		liveMap, err := runtime.DefaultUnstructuredConverter.ToUnstructured(live)
		if err != nil {
			return false, fmt.Errorf("%s %s/%s: %w", kind, ns, name, err)
		}
		if live.GetAnnotations()[AppliedHashAnnotation] == hash && desiredIn(wantObj.Object, liveMap) {
			return false, nil
		}
	}
	if err := a.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(wantObj), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return false, fmt.Errorf("apply %s %s/%s: %w", kind, ns, name, err)
	}
	if out != nil {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(wantObj.Object, out); err != nil {
			return true, fmt.Errorf("decode applied %s %s/%s: %w", kind, ns, name, err)
		}
	}
	return true, nil
}

func (a Applier) gvkFor(obj client.Object) (gvk schema.GroupVersionKind, err error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return u.GroupVersionKind(), nil
	}
	gvks, _, err := a.Scheme.ObjectKinds(obj)
	if err != nil || len(gvks) == 0 {
		return gvk, fmt.Errorf("kind of %T: %w", obj, err)
	}
	return gvks[0], nil
}

// newObject returns an empty object of desired's kind to read the live one
// into.
func newObject(desired client.Object) (client.Object, error) {
	if u, ok := desired.(*unstructured.Unstructured); ok {
		live := &unstructured.Unstructured{}
		live.SetGroupVersionKind(u.GroupVersionKind())
		return live, nil
	}
	obj, ok := reflect.New(reflect.TypeOf(desired).Elem()).Interface().(client.Object)
	if !ok {
		return nil, fmt.Errorf("cannot create a %T", desired)
	}
	return obj, nil
}

// toApplyMap turns obj into the map sent as an apply configuration:
// without status and without the null values typed objects serialize
// (creationTimestamp), which would otherwise claim fields for nothing.
func toApplyMap(obj client.Object) (map[string]any, error) {
	var m map[string]any
	if u, ok := obj.(*unstructured.Unstructured); ok {
		m = runtime.DeepCopyJSON(u.Object)
	} else {
		var err error
		if m, err = runtime.DefaultUnstructuredConverter.ToUnstructured(obj); err != nil {
			return nil, err
		}
	}
	delete(m, "status")
	pruneNulls(m)
	return m, nil
}

func pruneNulls(v any) {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			if e == nil {
				delete(t, k)
				continue
			}
			pruneNulls(e)
		}
	case []any:
		for _, e := range t {
			pruneNulls(e)
		}
	}
}

// hashOf is a short digest of an apply map; encoding/json sorts map keys,
// so equal maps hash equally.
func hashOf(m map[string]any) (string, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("hash desired object: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12]), nil
}

// desiredIn reports whether every value set in want is present and equal
// in live. Maps may have more keys in live; lists must have the same
// length with each element matching. A zero value in want (false, 0, "",
// empty map or list) also matches a missing key, because serialization
// may drop it.
func desiredIn(want, live any) bool {
	switch w := want.(type) {
	case map[string]any:
		l, ok := live.(map[string]any)
		if !ok {
			return live == nil && isZero(w)
		}
		for k, wv := range w {
			lv, present := l[k]
			if !present {
				if isZero(wv) {
					continue
				}
				return false
			}
			if !desiredIn(wv, lv) {
				return false
			}
		}
		return true
	case []any:
		l, ok := live.([]any)
		if !ok {
			return live == nil && len(w) == 0
		}
		if len(w) != len(l) {
			return false
		}
		for i := range w {
			if !desiredIn(w[i], l[i]) {
				return false
			}
		}
		return true
	case nil:
		return true
	default:
		if live == nil {
			return isZero(want)
		}
		return reflect.DeepEqual(normalizeNumber(want), normalizeNumber(live))
	}
}

func isZero(v any) bool {
	switch t := v.(type) {
	case nil:
		return true
	case map[string]any:
		for _, e := range t {
			if !isZero(e) {
				return false
			}
		}
		return true
	case []any:
		return len(t) == 0
	case string:
		return t == ""
	case bool:
		return !t
	default:
		n := normalizeNumber(v)
		return n == int64(0) || n == float64(0)
	}
}

// normalizeNumber makes the numeric types of typed-object conversion and
// of JSON decoding comparable.
func normalizeNumber(v any) any {
	switch n := v.(type) {
	case int:
		return int64(n)
	case int32:
		return int64(n)
	case float64:
		if n == float64(int64(n)) {
			return int64(n)
		}
		return n
	case json.Number:
		if i, err := n.Int64(); err == nil {
			return i
		}
		return n.String()
	}
	return v
}

// SetOwner makes owner the controller of obj, an object it writes other
// than through Apply (a Secret holding a credential), so it is garbage
// collected with it.
func SetOwner(owner, obj metav1.Object, scheme *runtime.Scheme) error {
	if err := controllerutil.SetControllerReference(owner, obj, scheme); err != nil {
		return fmt.Errorf("set owner of %s: %w", obj.GetName(), err)
	}
	return nil
}
