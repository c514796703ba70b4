package dependent

import (
	"context"
	"fmt"
	"time"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/workload"
	"github.com/coder/coder-k8s/internal/metrics"
)

// UndoFunc deletes in Coder what a dependent object created there.
type UndoFunc func(ctx context.Context, cl *codersdk.Client) error

// Cleanup is what a finalizer of a dependent kind waits for: something
// the object created in Coder, to delete on the object's deletion.
type Cleanup struct {
	Finalizer string
	// ControlPlane is the name of the CoderControlPlane whose coderd holds
	// what to delete.
	ControlPlane string
	// Find names what the object holds in Coder (what, for people) and
	// how to delete it; a nil undo means nothing was created. An error is
	// retried until the cleanup timeout.
	Find func(ctx context.Context) (what string, undo UndoFunc, err error)

	// Action, DoneReason and FailedReason are the events' action and
	// reasons.
	Action, DoneReason, FailedReason string
	// Verb, Gerund and Past phrase the events ("revoke", "revoking",
	// "revoked"); ByHand says what to do when the operator gives up
	// ("revoke it in Coder by hand").
	Verb, Gerund, Past, ByHand string
	// Noun names what is deleted in the log ("the provisioner key"), and
	// LogKey is the log's key for it ("key").
	Noun, LogKey string
}

// Finalize runs c for obj, which is being deleted, then releases obj.
// The cleanup is best effort and bounded: while coderd is unreachable or
// the operator's access is not ready it is retried, at the pace of
// workload.CleanupRetry, until CleanupTimeout after the deletion request; then, or at once when
// the CoderControlPlane no longer exists, the finalizer is removed anyway
// and a Warning event names what to delete by hand. Deletion never waits
// forever on an absent coderd.
func (b *Base) Finalize(ctx context.Context, obj client.Object, c Cleanup) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(obj, c.Finalizer) {
		return ctrl.Result{}, nil
	}
	log := logf.FromContext(ctx)
	done, abandon, what, msg := b.undo(ctx, obj.GetNamespace(), c)
	switch {
	case done && what != "":
		b.event(obj, corev1.EventTypeNormal, c.DoneReason, c.Action, c.Past+" "+what)
	case !done && !abandon:
		if retry, giveUp := workload.CleanupRetry(obj, b.cleanupTimeout(), time.Now()); !giveUp {
			log.Info("cannot "+c.Verb+" "+c.Noun+" yet; retrying", c.LogKey, what, "reason", msg, "retryIn", retry.Round(time.Second))
			return ctrl.Result{RequeueAfter: retry}, nil
		}
		b.event(obj, corev1.EventTypeWarning, c.FailedReason, c.Action,
			fmt.Sprintf("gave up %s %s after %s: %s; %s", c.Gerund, what, b.cleanupTimeout(), msg, c.ByHand))
	case abandon:
		b.event(obj, corev1.EventTypeWarning, c.FailedReason, c.Action,
			fmt.Sprintf("cannot %s %s: %s; %s", c.Verb, what, msg, c.ByHand))
	}
	if err := workload.RemoveFinalizers(ctx, b.Client, obj, c.Finalizer); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

// undo deletes in Coder what the object holds there. done reports that
// nothing is left to delete; abandon that it never can be (the control
// plane is gone); msg explains a failure.
func (b *Base) undo(ctx context.Context, namespace string, c Cleanup) (done, abandon bool, what, msg string) {
	what, undo, err := c.Find(ctx)
	if err != nil {
		return false, false, what, err.Error()
	}
	if undo == nil {
		return true, false, "", "" // nothing was created
	}
	var ccp coderv1alpha1.CoderControlPlane
	if err := b.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: c.ControlPlane}, &ccp); err != nil {
		if apierrors.IsNotFound(err) {
			return false, true, what, fmt.Sprintf("CoderControlPlane %q no longer exists", c.ControlPlane)
		}
		return false, false, what, err.Error()
	}
	cl, err := coderapi.ForControlPlane(ctx, b.APIReader, &ccp, b.CoderTimeout, metrics.ComponentController)
	if err != nil {
		return false, false, what, err.Error()
	}
	defer coderapi.CloseIdle(cl)
	err = undo(ctx, cl)
	if err == nil || coderapi.IsNotFound(err) || coderapi.IsFeatureUnavailable(err) {
		return true, false, what, ""
	}
	return false, false, what, coderapi.Message(err)
}
