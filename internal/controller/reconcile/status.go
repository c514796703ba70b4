// Package reconcile is the kit the three reconcilers (CoderControlPlane,
// CoderProvisioner, CoderWorkspaceProxy) share for what every pass ends
// with: conditions set at the object's generation, events announced only
// once the status recording them is written, the status write itself,
// finalizer patches and the bounded best-effort cleanup a finalizer
// waits for, and messages cut to what conditions and events accept.
//
// It is not controller-runtime's package of the same name: requests and
// results are ctrl.Request and ctrl.Result.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

// conflictRequeue is when a pass whose status write lost to a newer
// version of the object runs again, once that version reached the cache.
const conflictRequeue = time.Second

// Object is a coder.com object whose status the kit reads and writes;
// the API types implement it.
type Object interface {
	client.Object
	GetConditions() []metav1.Condition
	SetConditions([]metav1.Condition)
	GetPhase() coderv1alpha1.Phase
	SetPhase(coderv1alpha1.Phase)
	SetObservedGeneration(int64)
}

// Event is an event about the object a pass reconciles.
type Event struct {
	Type, Reason, Action, Note string
}

// Kit is what a reconciler writes with: its client, its events recorder
// and the way its RBAC lets it write the status subresource.
type Kit struct {
	Client client.Client
	// Recorder records events; nil records none.
	Recorder events.EventRecorder
	// PatchStatus writes the status with a merge patch (the "patch" verb
	// on the status subresource) instead of an update ("update").
	PatchStatus bool
}

// Status is one reconcile pass's view of an object's status: the status
// is built in place in the object, and what it was when the pass began
// decides whether to write it; events are queued until it is written.
type Status struct {
	obj        Object
	startPhase coderv1alpha1.Phase
	startConds []metav1.Condition
	// changed reports whether the status differs from the pass's start.
	changed func() bool
	// patchBase returns a copy of the object as it is now but with the
	// status it had when the pass began.
	patchBase func() client.Object
	events    []Event
}

// Begin starts a pass over obj, whose status is *status.
func Begin[S any, P interface {
	*S
	DeepCopy() *S
}](obj Object, status P) *Status {
	before := status.DeepCopy()
	return &Status{
		obj:        obj,
		startPhase: obj.GetPhase(),
		startConds: slices.Clone(obj.GetConditions()),
		changed:    func() bool { return !equality.Semantic.DeepEqual(before, (*S)(status)) },
		patchBase: func() client.Object {
			// The metadata must be today's (finalizer patches during the
			// pass moved the resourceVersion the patch is checked
			// against), the status the pass's start: swap it in for the
			// copy.
			now := *status
			*status = *before
			base, _ := obj.DeepCopyObject().(client.Object)
			*status = now
			return base
		},
	}
}

// StartPhase is the phase the object had when the pass began.
func (s *Status) StartPhase() coderv1alpha1.Phase { return s.startPhase }

// StartConditions are the conditions the object had when the pass began.
func (s *Status) StartConditions() []metav1.Condition { return s.startConds }

// SetCondition sets a condition of obj at obj's generation (its
// transition time changes only when its status does) and reports whether
// its status or reason changed.
func SetCondition(obj Object, typ string, status metav1.ConditionStatus, reason, message string) (changed bool) {
	conds := obj.GetConditions()
	old := apimeta.FindStatusCondition(conds, typ)
	changed = old == nil || old.Status != status || old.Reason != reason
	apimeta.SetStatusCondition(&conds, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: Message(message),
		ObservedGeneration: obj.GetGeneration(),
	})
	obj.SetConditions(conds)
	return changed
}

// SetCondition sets a condition of the pass's object; when its status or
// reason changes and eventType is set, an event with the condition's
// reason and message is queued: events only on transitions.
func (s *Status) SetCondition(typ string, status metav1.ConditionStatus, reason, message, eventType string) {
	if SetCondition(s.obj, typ, status, reason, message) && eventType != "" {
		s.Event(eventType, reason, "Reconcile", message)
	}
}

// Event queues an event about the object, recorded once the status is
// written.
func (s *Status) Event(eventType, reason, action, note string) {
	s.events = append(s.events, Event{Type: eventType, Reason: reason, Action: action, Note: note})
}

// Finish ends a pass that returned res and recErr: it stamps the observed
// generation, writes the status when it changed, then records the queued
// events, so that a failed write announces nothing it did not record. A
// write lost to a newer version of the object (the pass started from a
// stale copy) is decided again from that version; an object gone
// meanwhile needs nothing more.
func (k Kit) Finish(ctx context.Context, s *Status, res ctrl.Result, recErr error) (ctrl.Result, error) {
	s.obj.SetObservedGeneration(s.obj.GetGeneration())
	if s.changed() {
		if err := k.writeStatus(ctx, s); err != nil {
			switch {
			case apierrors.IsNotFound(err):
				return ctrl.Result{}, nil
			case apierrors.IsConflict(err):
				return ctrl.Result{RequeueAfter: conflictRequeue}, nil
			}
			return ctrl.Result{}, errors.Join(recErr,
				fmt.Errorf("write status of %s/%s: %w", s.obj.GetNamespace(), s.obj.GetName(), err))
		}
	}
	for _, e := range s.events {
		k.Event(s.obj, e)
	}
	s.events = nil
	if recErr != nil {
		return ctrl.Result{}, recErr
	}
	return res, nil
}

func (k Kit) writeStatus(ctx context.Context, s *Status) error {
	if !k.PatchStatus {
		// An update carries the resourceVersion: a stale pass conflicts.
		return k.Client.Status().Update(ctx, s.obj)
	}
	// The optimistic lock makes a stale pass conflict here too, rather
	// than overwrite a newer status.
	return k.Client.Status().Patch(ctx, s.obj, client.MergeFromWithOptions(s.patchBase(), client.MergeFromWithOptimisticLock{}))
}

// Event records e about obj now.
func (k Kit) Event(obj client.Object, e Event) {
	if k.Recorder == nil {
		return
	}
	// The note is a format string for the recorder; pass it as an
	// argument so a % in an error message is printed as is.
	k.Recorder.Eventf(obj, nil, e.Type, e.Reason, e.Action, "%s", Message(e.Note))
}
