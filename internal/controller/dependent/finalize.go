package dependent

import (
	"context"
	"errors"
	"fmt"

	"github.com/coder/coder/v2/codersdk"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/reconcile"
)

// UndoFunc deletes in Coder what a dependent object created there.
type UndoFunc func(ctx context.Context, cl *codersdk.Client) error

// Cleanup is what a finalizer of a dependent kind waits for: something
// the object created in Coder, to delete on the object's deletion.
type Cleanup struct {
	Finalizer string
	// Find names what the object holds in Coder (what, for people) and
	// how to delete it; a nil undo means nothing was created. An error is
	// retried until the cleanup timeout.
	Find func(ctx context.Context) (what string, undo UndoFunc, err error)

	// Name says what the cleanup does, for the log.
	Name string
	// Action, DoneReason and FailedReason are the events' action and
	// reasons.
	Action, DoneReason, FailedReason string
	// Done, GaveUp and Abandoned are the events' notes, whole sentences
	// as fmt formats: Done of what ("revoked %s"); GaveUp of what, the
	// cleanup timeout and the last failure, when the timeout has passed;
	// Abandoned of what and the failure, when the CoderControlPlane is
	// gone. Both failures say what to delete by hand.
	Done, GaveUp, Abandoned string
}

// Finalize runs c for obj, which is being deleted, then releases obj:
// best effort and bounded by CleanupTimeout (reconcile.Kit.Clean), and at
// once when the CoderControlPlane called controlPlane, whose coderd holds
// what to delete, no longer exists.
func (b *Base) Finalize(ctx context.Context, obj client.Object, controlPlane string, c Cleanup) (ctrl.Result, error) {
	return b.Kit().Finalize(ctx, obj, c.Finalizer, b.cleanup(obj.GetNamespace(), controlPlane, c))
}

// cleanup is c as the kit runs it, for an object in namespace referencing
// controlPlane.
func (b *Base) cleanup(namespace, controlPlane string, c Cleanup) reconcile.Cleanup {
	timeout := b.cleanupTimeout()
	var what string // set by Try, named by the events
	return reconcile.Cleanup{
		Name:         c.Name,
		Grace:        timeout,
		Action:       c.Action,
		DoneReason:   c.DoneReason,
		GaveUpReason: c.FailedReason,
		Try: func(ctx context.Context) (string, error) {
			w, undo, err := c.Find(ctx)
			what = w
			if err != nil || undo == nil {
				return "", err // a nil undo: nothing was created
			}
			if err := b.undo(ctx, namespace, controlPlane, undo); err != nil {
				return "", err
			}
			return fmt.Sprintf(c.Done, what), nil
		},
		GaveUp: func(err error) string {
			if reconcile.Abandoned(err) {
				return fmt.Sprintf(c.Abandoned, what, err)
			}
			return fmt.Sprintf(c.GaveUp, what, timeout, err)
		},
	}
}

// undo deletes with undo what the object holds in the coderd of the
// CoderControlPlane called name. Something already gone, or a feature
// coderd no longer offers, counts as deleted.
func (b *Base) undo(ctx context.Context, namespace, name string, undo UndoFunc) error {
	ccp, cl, err := b.connect(ctx, namespace, name)
	if ccp == nil && apierrors.IsNotFound(err) {
		return reconcile.Abandon(fmt.Errorf("CoderControlPlane %q no longer exists", name))
	}
	if err != nil {
		return err
	}
	defer coderapi.CloseIdle(cl)
	if err := undo(ctx, cl); err != nil && !coderapi.IsNotFound(err) && !coderapi.IsFeatureUnavailable(err) {
		// The events show coderd's message, not the request it answered.
		return errors.New(coderapi.Message(err))
	}
	return nil
}
