package dependent

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

// ControlPlaneRefIndex indexes dependent objects by
// spec.controlPlaneRef.name.
const ControlPlaneRefIndex = "spec.controlPlaneRef.name"

// Controller describes a dependent kind to NewController.
type Controller struct {
	// Name names the controller (and its metrics), e.g. "coderprovisioner".
	Name string
	// Kind is the kind's name in messages, e.g. "CoderProvisioner".
	Kind string
	// Object is an empty object of the kind; NewList returns an empty
	// list of it.
	Object  client.Object
	NewList func() client.ObjectList
	// ControlPlaneRef returns the name of the CoderControlPlane an object
	// of the kind references; "" for none.
	ControlPlaneRef func(client.Object) string
	// ControlPlaneChanged, when set, names further updates of a
	// CoderControlPlane its dependents must see, beyond those changing how
	// the operator reaches coderd.
	ControlPlaneChanged func(old, new *coderv1alpha1.CoderControlPlane) bool
}

// NewController indexes the kind by ControlPlaneRefIndex and returns a
// builder that reconciles its objects on spec changes and when the
// CoderControlPlane they reference appears, goes, or changes how the
// operator reaches it; the caller adds the children the kind owns. It
// also defaults DefaultImage.
func (b *Base) NewController(mgr ctrl.Manager, c Controller) (*builder.Builder, error) {
	if b.DefaultImage == "" {
		b.DefaultImage = coderv1alpha1.DefaultImage
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), c.Object, ControlPlaneRefIndex,
		func(o client.Object) []string {
			if name := c.ControlPlaneRef(o); name != "" {
				return []string{name}
			}
			return nil
		}); err != nil {
		return nil, fmt.Errorf("index %s by %s: %w", c.Kind, ControlPlaneRefIndex, err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(c.Name).
		// Status writes and finalizer patches do not change the generation:
		// they must not trigger another reconcile.
		For(c.Object, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&coderv1alpha1.CoderControlPlane{},
			handler.EnqueueRequestsFromMapFunc(b.requestsForControlPlane(c)),
			builder.WithPredicates(controlPlaneAccessChanged(c.ControlPlaneChanged))), nil
}

// requestsForControlPlane maps a CoderControlPlane to the objects of the
// kind referencing it.
func (b *Base) requestsForControlPlane(c Controller) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []ctrl.Request {
		list := c.NewList()
		if err := b.Client.List(ctx, list, client.InNamespace(o.GetNamespace()),
			client.MatchingFields{ControlPlaneRefIndex: o.GetName()}); err != nil {
			logf.FromContext(ctx).Error(err, "list "+c.Kind+" objects for control plane", "controlPlane", o.GetName())
			return nil
		}
		var reqs []ctrl.Request
		if err := apimeta.EachListItem(list, func(item runtime.Object) error {
			m, err := apimeta.Accessor(item)
			if err != nil {
				return err
			}
			reqs = append(reqs, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: m.GetNamespace(), Name: m.GetName()}})
			return nil
		}); err != nil {
			logf.FromContext(ctx).Error(err, "read "+c.Kind+" objects for control plane", "controlPlane", o.GetName())
			return nil
		}
		return reqs
	}
}

// controlPlaneAccessChanged passes creations, deletions and the updates of
// a CoderControlPlane that change how the operator reaches its coderd, or
// that also says are relevant.
func controlPlaneAccessChanged(also func(old, new *coderv1alpha1.CoderControlPlane) bool) predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*coderv1alpha1.CoderControlPlane)
			n, ok2 := e.ObjectNew.(*coderv1alpha1.CoderControlPlane)
			if !ok1 || !ok2 {
				return true
			}
			return o.Status.URL != n.Status.URL ||
				(also != nil && also(o, n)) ||
				!equality.Semantic.DeepEqual(o.Status.OperatorTokenSecretRef, n.Status.OperatorTokenSecretRef) ||
				apimeta.IsStatusConditionTrue(o.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady) !=
					apimeta.IsStatusConditionTrue(n.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady) ||
				o.Spec.OperatorAccess.Disabled != n.Spec.OperatorAccess.Disabled ||
				o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero()
		},
	}
}
