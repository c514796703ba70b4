package dependent

import (
	"context"
	"fmt"
	"strings"

	"github.com/coder/coder/v2/codersdk"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// Kind is what a dependent kind's reconciler gives the skeleton its
// controller (Setup) and its passes (Reconcile) share, for objects of
// type O: what differs between the kinds.
type Kind[O Object] interface {
	// Reconcile is the reconciler's: Reconcile with the kind's object.
	Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error)
	// ControlPlaneRef is the name of the CoderControlPlane obj references
	// (spec.controlPlaneRef.name).
	ControlPlaneRef(obj O) string
	// Cleanup is what obj's finalizer waits for once it is being deleted.
	Cleanup(obj O) Cleanup
	// Pass is one reconcile of obj past the resolution of its control
	// plane ccp, with a client cl acting as the operator on its coderd:
	// what obj holds in Coder and the workload running with it. st builds
	// obj's status; the result and error are the reconcile's.
	Pass(ctx context.Context, obj O, st *State, ccp *coderv1alpha1.CoderControlPlane, cl *codersdk.Client) (ctrl.Result, error)
}

// Controller describes a dependent kind's controller to Setup.
type Controller struct {
	// Object is an empty object of the kind. The controller is named
	// after its kind in lower case ("coderprovisioner", also in metrics).
	Object client.Object
	// Owns are the children the kind owns beyond the Deployment and the
	// credential's Secret every dependent kind owns.
	Owns []client.Object
	// ControlPlaneChanged, when set, names further updates of a
	// CoderControlPlane its dependents must see, beyond those changing how
	// the operator reaches coderd.
	ControlPlaneChanged func(old, new *coderv1alpha1.CoderControlPlane) bool
}

// Setup registers k's reconciler with mgr: it indexes the kind by
// ControlPlaneRefIndex and reconciles its objects on spec changes, when
// the CoderControlPlane they reference appears, goes, or changes how the
// operator reaches it, and when the children they own change: their
// Deployment, the Secrets holding their credentials (as metadata only, so
// their data is never cached) and c.Owns. It also defaults DefaultImage.
func Setup[O Object](mgr ctrl.Manager, b *Base, k Kind[O], c Controller) error {
	if b.DefaultImage == "" {
		b.DefaultImage = coderv1alpha1.DefaultImage
	}
	gvk, err := apiutil.GVKForObject(c.Object, mgr.GetScheme())
	if err != nil {
		return err
	}
	listGVK := gvk.GroupVersion().WithKind(gvk.Kind + "List")
	if list, err := mgr.GetScheme().New(listGVK); err != nil {
		return err
	} else if _, ok := list.(client.ObjectList); !ok {
		return fmt.Errorf("%s is not a list", listGVK)
	}
	newList := func() client.ObjectList {
		list, _ := mgr.GetScheme().New(listGVK)
		l, _ := list.(client.ObjectList)
		return l
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), c.Object, ControlPlaneRefIndex,
		func(o client.Object) []string {
			if obj, ok := o.(O); ok {
				if name := k.ControlPlaneRef(obj); name != "" {
					return []string{name}
				}
			}
			return nil
		}); err != nil {
		return fmt.Errorf("index %s by %s: %w", gvk.Kind, ControlPlaneRefIndex, err)
	}
	bld := ctrl.NewControllerManagedBy(mgr).
		Named(strings.ToLower(gvk.Kind)).
		// Status writes and finalizer patches do not change the generation:
		// they must not trigger another reconcile.
		For(c.Object, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&coderv1alpha1.CoderControlPlane{},
			handler.EnqueueRequestsFromMapFunc(b.requestsForControlPlane(gvk.Kind, newList)),
			builder.WithPredicates(controlPlaneAccessChanged(c.ControlPlaneChanged))).
		Owns(&appsv1.Deployment{})
	for _, child := range c.Owns {
		bld = bld.Owns(child)
	}
	return bld.Owns(&corev1.Secret{}, builder.OnlyMetadata).Complete(k)
}

// Reconcile is a dependent kind's reconcile of the object req names, read
// into obj, whose status is *status: once obj is being deleted, the
// cleanup its finalizer waits for (Finalize); otherwise the resolution of
// the CoderControlPlane it references (ControlPlane), k's pass, and the
// status write (reconcile.Kit.Finish).
func Reconcile[O Object, S any, P interface {
	*S
	DeepCopy() *S
}](ctx context.Context, b *Base, k Kind[O], req ctrl.Request, obj O, status P) (ctrl.Result, error) {
	if err := b.Client.Get(ctx, req.NamespacedName, obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !obj.GetDeletionTimestamp().IsZero() {
		return b.Finalize(ctx, obj, k.ControlPlaneRef(obj), k.Cleanup(obj))
	}
	st := NewState(obj, status)
	res, err := pass(ctx, b, k, obj, st)
	return b.Kit().Finish(ctx, st.Status, res, err)
}

// pass resolves obj's control plane and runs k's pass with a client on it.
func pass[O Object](ctx context.Context, b *Base, k Kind[O], obj O, st *State) (ctrl.Result, error) {
	ccp, cl, res, err := b.ControlPlane(ctx, st, k.ControlPlaneRef(obj))
	if cl == nil {
		return res, err
	}
	// A client per pass: its connections are not reused by the next.
	defer coderapi.CloseIdle(cl)
	return k.Pass(ctx, obj, st, ccp, cl)
}
