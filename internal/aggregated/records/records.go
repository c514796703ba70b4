// Package records keeps, in Kubernetes, what the aggregated API's objects
// carry that Coder has nowhere to store: labels, annotations, finalizers,
// owner references, field ownership, the generation and a template's
// build in progress. One CoderObjectRecord per Coder object, in the
// object's namespace, named after the Coder object's UUID so that a
// rename in Coder keeps it. Reads come from an informer cache, so the
// request path makes no extra request to kube-apiserver; writes go to
// kube-apiserver with optimistic concurrency.
package records

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

// The aggregated API server keeps the records; nobody else writes them.
// +kubebuilder:rbac:groups=coder.com,resources=coderobjectrecords,verbs=get;list;watch;create;update;delete

// Record is one aggregated object's record.
type Record = coderv1alpha1.CoderObjectRecord

// Key names the Coder object a record describes.
type Key struct {
	// Namespace is the aggregated object's namespace.
	Namespace string
	// Resource is coderworkspaces, codertemplates or codertemplateversions.
	Resource string
	// ControlPlane is the control plane's name; empty for the static
	// backend.
	ControlPlane string
	// CoderID is the Coder object's UUID.
	CoderID string
}

// Name is the record's object name: the resource, the control plane (when
// there is one) and the Coder UUID, so records of two control planes in one
// namespace never collide even if their coderds reuse an ID.
func (k Key) Name() string {
	kind := strings.TrimSuffix(strings.TrimPrefix(k.Resource, "coder"), "s")
	if k.ControlPlane == "" {
		return kind + "." + strings.ToLower(k.CoderID)
	}
	return kind + "." + k.ControlPlane + "." + strings.ToLower(k.CoderID)
}

// NamespacedName is the record's namespace and name.
func (k Key) NamespacedName() types.NamespacedName {
	return types.NamespacedName{Namespace: k.Namespace, Name: k.Name()}
}

// KeyOf is the key of an existing record.
func KeyOf(r *Record) Key {
	return Key{Namespace: r.Namespace, Resource: r.Spec.Resource, ControlPlane: r.Spec.ControlPlane, CoderID: r.Spec.CoderID}
}

// Store reads records from an informer cache and writes them through a
// client.
type Store struct {
	reader cache.Cache
	writer client.Client
}

// New returns a store that reads through c (an informer cache whose
// label selector admits records labelled managed-by coder-k8s) and writes
// with w.
func New(c cache.Cache, w client.Client) *Store {
	return &Store{reader: c, writer: w}
}

// Start starts the records' informer and waits until it has synced, so
// that the first requests see every record.
func (s *Store) Start(ctx context.Context) error {
	inf, err := s.reader.GetInformer(ctx, &coderv1alpha1.CoderObjectRecord{})
	if err != nil {
		return fmt.Errorf("records informer: %w", err)
	}
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("records informer: %w", ctx.Err())
	}
	return nil
}

// Get returns the record of k from the cache, or nil when there is none.
// The record is the cache's copy: callers copy it before changing it.
func (s *Store) Get(ctx context.Context, k Key) (*Record, error) {
	var r Record
	if err := s.reader.Get(ctx, k.NamespacedName(), &r); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read record %s: %w", k.NamespacedName(), err)
	}
	return &r, nil
}

// List returns the cached records of one resource of a namespace's
// control plane. They are the cache's own objects, not copies (every LIST
// of the aggregated API reads them): callers must not change them.
func (s *Store) List(ctx context.Context, namespace, resource, controlPlane string) ([]Record, error) {
	var l coderv1alpha1.CoderObjectRecordList
	if err := s.reader.List(ctx, &l, client.InNamespace(namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list records of namespace %s: %w", namespace, err)
	}
	out := l.Items[:0]
	for _, r := range l.Items {
		if r.Spec.Resource == resource && r.Spec.ControlPlane == controlPlane {
			out = append(out, r)
		}
	}
	return out, nil
}

// Save creates r (no resourceVersion) or updates it (its resourceVersion
// must still be current: a conflict is returned as kube-apiserver's 409).
// r's name and labels are set from its spec; on success r holds what
// kube-apiserver stored.
func (s *Store) Save(ctx context.Context, r *Record, k Key) error {
	r.Namespace, r.Name = k.Namespace, k.Name()
	r.Spec.Resource, r.Spec.ControlPlane, r.Spec.CoderID = k.Resource, k.ControlPlane, strings.ToLower(k.CoderID)
	if r.Labels == nil {
		r.Labels = map[string]string{}
	}
	r.Labels[coderv1alpha1.LabelManagedBy] = coderv1alpha1.ManagedByValue
	if r.Spec.Generation < 1 {
		r.Spec.Generation = 1
	}
	var err error
	if r.ResourceVersion == "" {
		err = s.writer.Create(ctx, r)
	} else {
		err = s.writer.Update(ctx, r)
	}
	if err != nil {
		return fmt.Errorf("save record %s/%s: %w", r.Namespace, r.Name, err)
	}
	return nil
}

// Delete deletes r, if it is still the version given (its
// resourceVersion); a record already gone is not an error.
func (s *Store) Delete(ctx context.Context, r *Record) error {
	pre := metav1.Preconditions{UID: &r.UID, ResourceVersion: &r.ResourceVersion}
	err := s.writer.Delete(ctx, r, &client.DeleteOptions{Preconditions: &pre})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete record %s/%s: %w", r.Namespace, r.Name, err)
	}
	return nil
}

// OnChange calls f with each record that is added, changed or deleted
// (deleted records with their last known state), from the informer's
// goroutine: f must not block.
func (s *Store) OnChange(ctx context.Context, f func(r *Record, deleted bool)) error {
	inf, err := s.reader.GetInformer(ctx, &coderv1alpha1.CoderObjectRecord{})
	if err != nil {
		return fmt.Errorf("records informer: %w", err)
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { call(f, o, false) },
		UpdateFunc: func(_, o any) { call(f, o, false) },
		DeleteFunc: func(o any) { call(f, o, true) },
	})
	if err != nil {
		return fmt.Errorf("records event handler: %w", err)
	}
	return nil
}

func call(f func(*Record, bool), o any, deleted bool) {
	if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	if r, ok := o.(*Record); ok {
		f(r, deleted)
	}
}
