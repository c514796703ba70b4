package reconcile

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// AddFinalizers adds the missing names to obj's finalizers (one patch,
// none when nothing is missing).
func AddFinalizers(ctx context.Context, c client.Client, obj client.Object, names ...string) error {
	return patchFinalizers(ctx, c, obj, func(o client.Object) bool {
		changed := false
		for _, n := range names {
			changed = controllerutil.AddFinalizer(o, n) || changed
		}
		return changed
	})
}

// RemoveFinalizers removes names from obj's finalizers; an object already
// gone is no error.
func RemoveFinalizers(ctx context.Context, c client.Client, obj client.Object, names ...string) error {
	err := patchFinalizers(ctx, c, obj, func(o client.Object) bool {
		changed := false
		for _, n := range names {
			changed = controllerutil.RemoveFinalizer(o, n) || changed
		}
		return changed
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// patchFinalizers writes the finalizers change makes with a merge patch
// that fails on a concurrent change rather than overwrite someone else's
// finalizer. Only obj's metadata is updated: a status being built in obj
// stays.
func patchFinalizers(ctx context.Context, c client.Client, obj client.Object, change func(client.Object) bool) error {
	patched, ok := obj.DeepCopyObject().(client.Object)
	if !ok {
		return fmt.Errorf("update finalizers: cannot copy %T", obj)
	}
	if !change(patched) {
		return nil
	}
	if err := c.Patch(ctx, patched, client.MergeFromWithOptions(obj, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("update finalizers of %s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
	}
	obj.SetFinalizers(patched.GetFinalizers())
	obj.SetResourceVersion(patched.GetResourceVersion())
	return nil
}

// Pacing of the best-effort cleanup a finalizer waits for (revoking what
// an object holds in Coder): retried with a growing interval while it
// fails, then given up GracePeriod after deletion was requested, so that
// a coderd gone for good never blocks a deletion.
const (
	minCleanupRetry = 2 * time.Second
	maxCleanupRetry = 30 * time.Second
)

// CleanupRetry says what to do after a cleanup of obj, which is being
// deleted, failed at now: retry after retryAfter, or give up (grace has
// passed since the deletion request). The interval grows with the time
// since the deletion request and never passes the deadline.
func CleanupRetry(obj client.Object, grace time.Duration, now time.Time) (retryAfter time.Duration, giveUp bool) {
	deleted := obj.GetDeletionTimestamp()
	if deleted == nil {
		return minCleanupRetry, false
	}
	deadline := deleted.Add(grace)
	if !now.Before(deadline) {
		return 0, true
	}
	return min(Backoff(deleted.Time, now, minCleanupRetry, maxCleanupRetry), deadline.Sub(now)+time.Second), false
}

// Backoff grows with how long something has been failing (since): half
// that time, within [lo, hi]. It needs no state beyond since, so it
// survives restarts and resets when since does.
func Backoff(since, now time.Time, lo, hi time.Duration) time.Duration {
	return min(max(now.Sub(since)/2, lo), hi)
}
