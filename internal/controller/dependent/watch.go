package dependent

import (
	"context"

	"k8s.io/apimachinery/pkg/api/equality"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
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

// requestsForControlPlane maps a CoderControlPlane to the objects of the
// kind referencing it; newList returns an empty list of them.
func (b *Base) requestsForControlPlane(kind string, newList func() client.ObjectList) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []ctrl.Request {
		list := newList()
		if err := b.Client.List(ctx, list, client.InNamespace(o.GetNamespace()),
			client.MatchingFields{ControlPlaneRefIndex: o.GetName()}); err != nil {
			logf.FromContext(ctx).Error(err, "list "+kind+" objects for control plane", "controlPlane", o.GetName())
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
			logf.FromContext(ctx).Error(err, "read "+kind+" objects for control plane", "controlPlane", o.GetName())
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
