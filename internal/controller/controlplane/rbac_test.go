package controlplane

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/controllertest"
	"github.com/coder/coder-k8s/internal/controller/operatoraccess"
)

var rbacMarker = regexp.MustCompile(`(?m)^// \+kubebuilder:rbac:groups=([^,]*),resources=([^,]+),verbs=(\S+)$`)

// markerRules reads the RBAC markers of the package, as controller-gen
// turns them into the operator's ClusterRole.
func markerRules(t *testing.T) []rbacv1.PolicyRule {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var src []byte
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src = append(src, b...)
	}
	var rules []rbacv1.PolicyRule
	for _, m := range rbacMarker.FindAllStringSubmatch(string(src), -1) {
		group := strings.Trim(m[1], `"`)
		rules = append(rules, rbacv1.PolicyRule{
			APIGroups: []string{group},
			Resources: strings.Split(m[2], ";"),
			Verbs:     strings.Split(m[3], ";"),
		})
	}
	if len(rules) == 0 {
		t.Fatal("no RBAC markers in the package")
	}
	return rules
}

// TestRunsWithOnlyItsRBACMarkers runs the reconciler as a user that has
// exactly the permissions of its RBAC markers plus the chart's bind on the
// workspace ClusterRoles, through creation, cross-namespace workspace RBAC,
// exposure, events and deletion: a missing permission fails the test.
func TestRunsWithOnlyItsRBACMarkers(t *testing.T) {
	ns := controllertest.Namespace(t, "rbac-min")
	extra := controllertest.Namespace(t, "rbac-min-ws")
	ctx := context.Background()
	admin := controllertest.Client(t)

	installWorkspaceClusterRoles(t)
	cfg := operatorConfig(t, "controlplane-"+ns, DefaultWorkspaceClusterRole, DefaultWorkspaceDeploymentsClusterRole)
	h := startManagerAs(t, cfg, []string{ns, extra}, nil, func(r *Reconciler) {
		p := DefaultWorkspaceRBACPolicy()
		p.ExtraNamespaces = map[string][]string{ns: {extra}}
		r.WorkspaceRBAC = &p
	})

	ccp := newControlPlane(ns, "coder")
	ccp.Spec.TLS = &coderv1alpha1.TLSSpec{SecretNames: []string{"coder-tls"}}
	ccp.Spec.WorkspaceRBAC.Deployments = true
	ccp.Spec.WorkspaceRBAC.ExtraNamespaces = []string{extra}
	ccp.Spec.Expose = &coderv1alpha1.ExposeSpec{Ingress: &coderv1alpha1.IngressSpec{Host: "coder.example.com"}}
	create(t, admin, ccp)
	runPod(t, admin, ns, "coder", fakePodIP)

	waitCondition(t, admin, ns, "coder", coderv1alpha1.ConditionReconciled, metav1.ConditionFalse, coderv1alpha1.ReasonSecretNotFound)
	waitEvent(t, ns, "coder", corev1.EventTypeWarning, coderv1alpha1.ReasonSecretNotFound)
	create(t, admin, tlsSecret(t, ns, "coder-tls", "coder."+ns+".svc.cluster.local"))
	waitCondition(t, admin, ns, "coder", coderv1alpha1.ConditionReconciled, metav1.ConditionTrue, coderv1alpha1.ReasonApplied)
	waitCondition(t, admin, ns, "coder", coderv1alpha1.ConditionExposed, metav1.ConditionTrue, coderv1alpha1.ReasonIngressApplied)
	// Bindings to ClusterRoles whose rules the operator does not hold:
	// its bind permission on them by name is enough.
	if err := admin.Get(ctx, types.NamespacedName{Namespace: extra, Name: "coder-workspace-" + DefaultWorkspaceDeploymentsClusterRole}, &rbacv1.RoleBinding{}); err != nil {
		t.Errorf("workspace RoleBinding in %s: %v", extra, err)
	}
	markDeploymentAvailable(t, admin, ns, "coder")
	waitCondition(t, admin, ns, "coder", coderv1alpha1.ConditionAvailable, metav1.ConditionTrue, "")

	updateCCP(t, admin, ns, "coder", func(ccp *coderv1alpha1.CoderControlPlane) {
		ccp.Spec.Expose = nil
		ccp.Spec.WorkspaceRBAC.ExtraNamespaces = nil
	})
	eventually(t, 30*time.Second, "Ingress and extra RBAC removed", func() error {
		if err := admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: "coder"}, &networkingv1.Ingress{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("Ingress: %v", err)
		}
		if err := admin.Get(ctx, types.NamespacedName{Namespace: extra, Name: "coder-workspace-" + DefaultWorkspaceClusterRole}, &rbacv1.RoleBinding{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("RoleBinding in %s: %v", extra, err)
		}
		return nil
	})

	deleteCCP(t, admin, ns, "coder", 30*time.Second)
	if _, revokes := h.access.calls(); revokes == 0 {
		t.Error("Revoke was not called")
	}
}

// TestAdoptedUnreachableCoderd adopts a coderd that does not answer, with
// the real access manager: the control plane says so in its conditions,
// keeps retrying, and can still be deleted at once since no token was
// ever issued.
func TestAdoptedUnreachableCoderd(t *testing.T) {
	ns := controllertest.Namespace(t, "unreachable")

	// A port nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()

	mgr := controllertest.NewManager(t, controllertest.Kube().Config, ns)
	r := &Reconciler{Access: &operatoraccess.Manager{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorder("operator-access"),
		Timeout:   5 * time.Second,
	}}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	controllertest.StartManager(t, mgr)

	c := controllertest.Client(t)
	ccp := newControlPlane(ns, "coder")
	ccp.Spec.ExternalURL = "http://" + addr
	create(t, c, ccp)
	ccp = waitCondition(t, c, ns, "coder", coderv1alpha1.ConditionAvailable, metav1.ConditionFalse, coderv1alpha1.ReasonCoderdUnreachable)
	waitCondition(t, c, ns, "coder", coderv1alpha1.ConditionOperatorAccessReady, metav1.ConditionFalse, coderv1alpha1.ReasonCoderdUnreachable)
	if ccp.Status.Phase != coderv1alpha1.PhaseProvisioning || ccp.Status.URL != "http://"+addr || ccp.Status.OperatorTokenSecretRef != nil {
		t.Errorf("status = %+v", ccp.Status)
	}

	deleteCCP(t, c, ns, "coder", 20*time.Second)
}
