package controlplane

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/controllertest"
)

func TestSwitchToExternalURLRemovesChildren(t *testing.T) {
	ns := controllertest.Namespace(t, "switch")
	extra := controllertest.Namespace(t, "switch-ws")
	h := startManager(t, []string{ns, extra}, nil, func(r *Reconciler) {
		p := DefaultWorkspaceRBACPolicy()
		p.ExtraNamespaces = map[string][]string{ns: {extra}}
		r.WorkspaceRBAC = &p
	})
	ctx := context.Background()
	binding := "coder-workspace-" + DefaultWorkspaceClusterRole

	ccp := newControlPlane(ns, "coder")
	ccp.Spec.WorkspaceRBAC.ExtraNamespaces = []string{extra}
	ccp.Spec.Expose = &coderv1alpha1.ExposeSpec{Ingress: &coderv1alpha1.IngressSpec{Host: "coder.example.com"}}
	create(t, h.c, ccp)
	runPod(t, h.c, ns, "coder", fakePodIP)
	getDeployment(t, h.c, ns, "coder")
	eventually(t, 30*time.Second, "children", func() error {
		if err := h.c.Get(ctx, types.NamespacedName{Namespace: extra, Name: binding}, &rbacv1.RoleBinding{}); err != nil {
			return err
		}
		return h.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "coder"}, &networkingv1.Ingress{})
	})
	// An object of the user's with a child's labels, but not owned by the
	// control plane, is left alone.
	userSA := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "users-own", Labels: ownedSelector(getCCP(t, h.c, ns, "coder"))}}
	create(t, h.c, userSA)

	updateCCP(t, h.c, ns, "coder", func(ccp *coderv1alpha1.CoderControlPlane) {
		ccp.Spec.Expose = nil // externalURL excludes expose, image and tls
		ccp.Spec.ExternalURL = "https://coder.example.com"
	})
	gone := []struct {
		obj    client.Object
		ns, nm string
	}{
		{&appsv1.Deployment{}, ns, "coder"},
		{&corev1.Service{}, ns, "coder"},
		{&corev1.ServiceAccount{}, ns, "coder"},
		{&rbacv1.RoleBinding{}, ns, binding},
		{&rbacv1.RoleBinding{}, extra, binding},
	}
	for _, g := range gone {
		eventually(t, 30*time.Second, fmt.Sprintf("%T %s/%s deleted", g.obj, g.ns, g.nm), func() error {
			err := h.c.Get(ctx, types.NamespacedName{Namespace: g.ns, Name: g.nm}, g.obj)
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there (%v)", err)
			}
			return nil
		})
	}
	if err := h.c.Get(ctx, client.ObjectKeyFromObject(userSA), &corev1.ServiceAccount{}); err != nil {
		t.Errorf("the user's service account: %v", err)
	}
	ccp = waitCondition(t, h.c, ns, "coder", coderv1alpha1.ConditionAvailable, metav1.ConditionTrue, coderv1alpha1.ReasonCoderdReachable)
	if ccp.Status.URL != "https://coder.example.com" {
		t.Errorf("status.url = %q, want the external URL", ccp.Status.URL)
	}
	if c := apimeta.FindStatusCondition(ccp.Status.Conditions, coderv1alpha1.ConditionReconciled); c != nil {
		t.Errorf("Reconciled %+v remains in adopt mode", c)
	}
	if slices.Contains(ccp.Finalizers, FinalizerWorkspaceRBAC) {
		t.Errorf("finalizer %s remains with nothing left to clean up", FinalizerWorkspaceRBAC)
	}
	if urls, _ := h.access.calls(); urls[len(urls)-1] != "https://coder.example.com" {
		t.Errorf("access manager last called with %s, want the external URL", urls[len(urls)-1])
	}
}

func TestNameTakenByUnmanagedObjectFails(t *testing.T) {
	ns := controllertest.Namespace(t, "taken")
	h := startManager(t, []string{ns}, nil, nil)
	ctx := context.Background()

	// A Service of the user's already has the name.
	create(t, h.c, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "coder"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 5432}}},
	})
	create(t, h.c, newControlPlane(ns, "coder"))
	runPod(t, h.c, ns, "coder", fakePodIP)
	ccp := waitCondition(t, h.c, ns, "coder", coderv1alpha1.ConditionReconciled, metav1.ConditionFalse, coderv1alpha1.ReasonApplyFailed)
	if ccp.Status.Phase != coderv1alpha1.PhaseFailed {
		t.Errorf("phase = %s, want Failed", ccp.Status.Phase)
	}
	waitEvent(t, ns, "coder", corev1.EventTypeWarning, coderv1alpha1.ReasonApplyFailed)
	var svc corev1.Service
	if err := h.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "coder"}, &svc); err != nil {
		t.Fatal(err)
	}
	if svc.Spec.Ports[0].Port != 5432 || metav1.GetControllerOf(&svc) != nil {
		t.Errorf("the user's Service was taken over: %+v", svc)
	}
}
