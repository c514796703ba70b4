package controlplane

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

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

// How children are written
//
// Children are written with server-side apply under the field manager
// "coder-k8s": the API server then removes fields the operator stopped
// setting (a removed node selector, annotation or port) and leaves fields
// other managers own alone.
//
// An apply is only sent when it would change something, so that a
// reconcile with nothing to do makes no write. Two checks decide:
//
//   - appliedHashAnnotation holds a hash of the last applied object; a
//     different hash means the spec changed (this catches removals, which
//     the second check cannot see);
//   - every field the operator sets must hold the same value in the live
//     object (desiredIn). Fields the live object has in addition, such as
//     those the API server defaults or other controllers add, are ignored,
//     so defaulting never causes a write, while an edit of an
//     operator-owned field by someone else is reverted.

const (
	fieldOwner            = client.FieldOwner("coder-k8s")
	appliedHashAnnotation = "coder.com/applied-hash"
)

// errNotManaged means a child's name is taken by an object the control
// plane does not manage; the operator does not take it over.
type errNotManaged struct {
	kind, namespace, name string
}

func (e *errNotManaged) Error() string {
	return fmt.Sprintf("%s %s/%s exists and is not managed by this control plane; rename or delete it", e.kind, e.namespace, e.name)
}

// applyChild writes desired (a typed object or an HTTPRoute) unless the
// live object already matches it. owned children get a controller owner
// reference; children in other namespaces (workspace RBAC) cannot, and are
// recognized by their labels instead. reader reads the live object, from
// the cache for the kinds the controller watches.
func (r *Reconciler) applyChild(ctx context.Context, reader client.Reader, ccp *coderv1alpha1.CoderControlPlane, desired client.Object, owned bool) (applied bool, err error) {
	gvk, err := r.gvkFor(desired)
	if err != nil {
		return false, err
	}
	kind := gvk.Kind
	if owned {
		if err := controllerutil.SetControllerReference(ccp, desired, r.Scheme); err != nil {
			return false, fmt.Errorf("set owner of %s %s: %w", kind, desired.GetName(), err)
		}
	}
	want, err := toApplyMap(desired)
	if err != nil {
		return false, fmt.Errorf("%s %s/%s: %w", kind, desired.GetNamespace(), desired.GetName(), err)
	}
	hash, err := hashOf(want)
	if err != nil {
		return false, fmt.Errorf("%s %s/%s: %w", kind, desired.GetNamespace(), desired.GetName(), err)
	}
	wantObj := &unstructured.Unstructured{Object: want}
	ann := wantObj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[appliedHashAnnotation] = hash
	wantObj.SetAnnotations(ann)
	wantObj.SetGroupVersionKind(gvk)

	live, err := r.newObject(desired)
	if err != nil {
		return false, err
	}
	getErr := reader.Get(ctx, client.ObjectKeyFromObject(desired), live)
	switch {
	case apierrors.IsNotFound(getErr):
		// Created by the apply below.
	case getErr != nil:
		return false, fmt.Errorf("get %s %s/%s: %w", kind, desired.GetNamespace(), desired.GetName(), getErr)
	default:
		if !managedBy(ccp, live, owned) {
			return false, &errNotManaged{kind: kind, namespace: live.GetNamespace(), name: live.GetName()}
		}
		liveMap, err := runtime.DefaultUnstructuredConverter.ToUnstructured(live)
		if err != nil {
			return false, fmt.Errorf("%s %s/%s: %w", kind, live.GetNamespace(), live.GetName(), err)
		}
		if live.GetAnnotations()[appliedHashAnnotation] == hash && desiredIn(wantObj.Object, liveMap) {
			return false, nil
		}
	}
	if err := r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(wantObj), fieldOwner, client.ForceOwnership); err != nil {
		return false, fmt.Errorf("apply %s %s/%s: %w", kind, desired.GetNamespace(), desired.GetName(), err)
	}
	return true, nil
}

// managedBy reports whether obj belongs to ccp: through its controller
// owner reference, or, for children in other namespaces, through the
// labels the operator puts on them.
func managedBy(ccp *coderv1alpha1.CoderControlPlane, obj client.Object, owned bool) bool {
	if owned {
		ref := metav1.GetControllerOf(obj)
		return ref != nil && ref.UID == ccp.UID
	}
	l := obj.GetLabels()
	for k, v := range ownedSelector(ccp) {
		if l[k] != v {
			return false
		}
	}
	return true
}

func (r *Reconciler) gvkFor(obj client.Object) (gvk schema.GroupVersionKind, err error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return u.GroupVersionKind(), nil
	}
	gvks, _, err := r.Scheme.ObjectKinds(obj)
	if err != nil || len(gvks) == 0 {
		return gvk, fmt.Errorf("kind of %T: %w", obj, err)
	}
	return gvks[0], nil
}

// newObject returns an empty object of desired's kind to read the live one
// into.
func (r *Reconciler) newObject(desired client.Object) (client.Object, error) {
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
