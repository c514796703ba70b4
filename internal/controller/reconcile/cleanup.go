package reconcile

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// Cleanup is work outside the cluster (in Coder) that a finalizer waits
// for, best effort and bounded: a failed attempt is retried, at the pace
// of CleanupRetry, until Grace after the deletion request; then, or at
// once when the failure is Abandoned, the finalizer goes anyway with a
// Warning event naming what is left to do by hand. Deletion never waits
// forever on an absent coderd.
type Cleanup struct {
	// Name says what the cleanup does, for the log ("revoke the
	// provisioner key").
	Name string
	// Grace bounds, from the deletion request, how long failed attempts
	// are retried.
	Grace time.Duration
	// Try makes one attempt and returns, when it is done, the note of the
	// DoneReason event ("" for none: nothing needed doing). An error keeps
	// the finalizer until Grace has passed, unless marked with Abandon.
	Try func(ctx context.Context) (done string, err error)
	// Action is the events' action.
	Action string
	// DoneReason, RetryReason and GaveUpReason are the events' reasons;
	// with RetryReason empty a failure to be retried sends no event.
	DoneReason, RetryReason, GaveUpReason string
	// Retrying writes the note of the Warning event about a failure err
	// to be retried until deadline; needed with RetryReason.
	Retrying func(err error, deadline time.Time) string
	// GaveUp writes the note of the Warning event about the finalizer
	// going without the cleanup, after the failure err.
	GaveUp func(err error) string
}

// abandoned marks a failure no retry can help.
type abandoned struct{ error }

func (a abandoned) Unwrap() error { return a.error }

// Abandon marks err, a cleanup's failure, as one no retry can help (what
// the cleanup needs is gone): the finalizer goes at once.
func Abandon(err error) error { return abandoned{err} }

// Abandoned reports whether err was marked with Abandon.
func Abandoned(err error) bool {
	var a abandoned
	return errors.As(err, &a)
}

// Clean makes one attempt of c for obj, which is being deleted, and
// reports whether the finalizer waiting for it may go now; if not, the
// attempt is to be made again after retryAfter.
func (k Kit) Clean(ctx context.Context, obj client.Object, c Cleanup) (release bool, retryAfter time.Duration) {
	log := logf.FromContext(ctx).WithValues("cleanup", c.Name)
	done, err := c.Try(ctx)
	if err == nil {
		if done != "" {
			k.Event(obj, Event{Type: corev1.EventTypeNormal, Reason: c.DoneReason, Action: c.Action, Note: done})
		}
		return true, 0
	}
	if !Abandoned(err) {
		if retry, giveUp := CleanupRetry(obj, c.Grace, time.Now()); !giveUp {
			var deadline time.Time
			if deleted := obj.GetDeletionTimestamp(); deleted != nil {
				deadline = deleted.Add(c.Grace)
			}
			log.Info("cleanup failed; retrying", "error", err.Error(), "retryIn", retry.Round(time.Second), "giveUpAt", deadline)
			if c.RetryReason != "" {
				k.Event(obj, Event{Type: corev1.EventTypeWarning, Reason: c.RetryReason, Action: c.Action, Note: c.Retrying(err, deadline)})
			}
			return false, retry
		}
	}
	log.Error(err, "giving up the cleanup; removing the finalizer", "gracePeriod", c.Grace)
	k.Event(obj, Event{Type: corev1.EventTypeWarning, Reason: c.GaveUpReason, Action: c.Action, Note: c.GaveUp(err)})
	return true, 0
}

// Finalize runs c for obj, which is being deleted, and removes finalizer
// once c lets it go; an object without finalizer is left alone.
func (k Kit) Finalize(ctx context.Context, obj client.Object, finalizer string, c Cleanup) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(obj, finalizer) {
		return ctrl.Result{}, nil
	}
	release, retry := k.Clean(ctx, obj, c)
	if !release {
		return ctrl.Result{RequeueAfter: retry}, nil
	}
	return ctrl.Result{}, RemoveFinalizers(ctx, k.Client, obj, finalizer)
}
