package controlplane

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/controllertest"
)

func TestDeletionRevokesAccess(t *testing.T) {
	ns := controllertest.Namespace(t, "delete")
	h := startManager(t, []string{ns}, nil, nil)

	create(t, h.c, newControlPlane(ns, "coder"))
	runPod(t, h.c, ns, "coder", fakePodIP)
	waitCondition(t, h.c, ns, "coder", coderv1alpha1.ConditionOperatorAccessReady, metav1.ConditionTrue, "")
	deleteCCP(t, h.c, ns, "coder", 30*time.Second)
	if _, revokes := h.access.calls(); revokes != 1 {
		t.Errorf("Revoke called %d times, want 1", revokes)
	}
}

func TestDeletionWithUnreachableCoderdIsBounded(t *testing.T) {
	ns := controllertest.Namespace(t, "delete-stuck")
	access := &fakeAccess{result: readyAccess(), revokeErr: errors.New("dial tcp 10.0.0.1:80: connect: connection refused")}
	h := startManager(t, []string{ns}, access, func(r *Reconciler) { r.RevokeGracePeriod = 5 * time.Second })
	ctx := context.Background()

	create(t, h.c, newControlPlane(ns, "coder"))
	runPod(t, h.c, ns, "coder", fakePodIP)
	waitCondition(t, h.c, ns, "coder", coderv1alpha1.ConditionOperatorAccessReady, metav1.ConditionTrue, "")
	start := time.Now()
	if err := h.c.Delete(ctx, getCCP(t, h.c, ns, "coder")); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, ns, "coder", corev1.EventTypeWarning, "RevokeFailed")
	if err := h.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "coder"}, &coderv1alpha1.CoderControlPlane{}); err != nil {
		t.Errorf("control plane gone before the grace period: %v", err)
	}
	eventually(t, 30*time.Second, "control plane deleted after the grace period", func() error {
		err := h.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "coder"}, &coderv1alpha1.CoderControlPlane{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	if d := time.Since(start); d < 4*time.Second {
		t.Errorf("deleted after %s, before the 5s grace period", d)
	}
	waitEvent(t, ns, "coder", corev1.EventTypeWarning, "RevokeAbandoned")
	if _, revokes := access.calls(); revokes < 2 {
		t.Errorf("Revoke tried %d times, want retries", revokes)
	}
}
