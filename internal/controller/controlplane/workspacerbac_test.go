package controlplane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/controllertest"
)

// installWorkspaceClusterRoles installs the chart's default workspace
// ClusterRoles (charts/coder-k8s/templates/rbac.yaml) under the names a
// release called coder-k8s gives them, as an administrator would.
func installWorkspaceClusterRoles(t *testing.T) {
	t.Helper()
	all := []string{"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
	roles := []*rbacv1.ClusterRole{{
		ObjectMeta: metav1.ObjectMeta{Name: DefaultWorkspaceClusterRole},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "persistentvolumeclaims"}, Verbs: all},
			{APIGroups: []string{""}, Resources: []string{"pods/exec"}, Verbs: []string{"create", "get"}},
			{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"pods/log"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"get", "list", "watch"}},
		},
	}, {
		ObjectMeta: metav1.ObjectMeta{Name: DefaultWorkspaceDeploymentsClusterRole},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: all}},
	}}
	for _, r := range roles {
		if err := controllertest.Client(t).Create(context.Background(), r); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create ClusterRole %s: %v", r.Name, err)
		}
	}
}

// operatorConfig authenticates as a user holding what the chart grants the
// operator in modes all and controller: the rules of the package's RBAC
// markers (the generated manager ClusterRole) and bind on the workspace
// ClusterRoles of its configuration, by name (the chart's
// <fullname>-workspace-bind ClusterRole).
func operatorConfig(t *testing.T, user string, bindable ...string) *rest.Config {
	t.Helper()
	admin := controllertest.Client(t)
	rules := append(markerRules(t), rbacv1.PolicyRule{
		APIGroups: []string{rbacv1.GroupName}, Resources: []string{"clusterroles"}, Verbs: []string{"bind"}, ResourceNames: bindable,
	})
	create(t, admin, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: rules})
	create(t, admin, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	})
	t.Cleanup(func() {
		ctx := context.Background()
		_ = admin.Delete(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user}})
		_ = admin.Delete(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}})
	})
	cfg, err := controllertest.Kube().UserConfig(user)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// workspaceRBACObjects lists the Roles and RoleBindings of control plane
// ccpNS/name in ns, by the labels the operator gives its children.
func workspaceRBACObjects(t *testing.T, c client.Client, ns, ccpNS, name string) (roles []rbacv1.Role, bindings []rbacv1.RoleBinding) {
	t.Helper()
	sel := client.MatchingLabels{coderv1alpha1.LabelControlPlane: name, coderv1alpha1.LabelControlPlaneNamespace: ccpNS}
	var rl rbacv1.RoleList
	var bl rbacv1.RoleBindingList
	if err := c.List(context.Background(), &rl, client.InNamespace(ns), sel); err != nil {
		t.Fatal(err)
	}
	if err := c.List(context.Background(), &bl, client.InNamespace(ns), sel); err != nil {
		t.Fatal(err)
	}
	return rl.Items, bl.Items
}

// roleRefs names what the bindings bind: "namespace/binding→Kind/name".
func roleRefs(bindings []rbacv1.RoleBinding) []string {
	out := make([]string, 0, len(bindings))
	for _, b := range bindings {
		out = append(out, b.Namespace+"/"+b.Name+"→"+b.RoleRef.Kind+"/"+b.RoleRef.Name)
	}
	slices.Sort(out)
	return out
}

// TestWorkspaceRBACEscalationRefused is the escalation of issue #16: a
// control plane in a fresh namespace asks for workspace RBAC in
// kube-system with a rule granting everything. The operator, running with
// the permissions the chart gives it, refuses the spec naming the fields,
// creates nothing for it, and could not have created such a Role anyway:
// kube-apiserver refuses it. Fixed, the spec gets RoleBindings to the
// allowed ClusterRole only.
func TestWorkspaceRBACEscalationRefused(t *testing.T) {
	installWorkspaceClusterRoles(t)
	ns := controllertest.Namespace(t, "tenant-a")
	ctx := context.Background()
	admin := controllertest.Client(t)
	user := "operator-" + ns
	cfg := operatorConfig(t, user, DefaultWorkspaceClusterRole, DefaultWorkspaceDeploymentsClusterRole)
	startManagerAs(t, cfg, []string{ns, "kube-system"}, nil, nil)

	ccp := newControlPlane(ns, "mine")
	ccp.Spec.WorkspaceRBAC.ExtraNamespaces = []string{"kube-system"}
	ccp.Spec.WorkspaceRBAC.ExtraRules = []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}}}
	create(t, admin, ccp)

	got := waitCondition(t, admin, ns, "mine", coderv1alpha1.ConditionReconciled, metav1.ConditionFalse, coderv1alpha1.ReasonWorkspaceRBACRefused)
	msg := apimeta.FindStatusCondition(got.Status.Conditions, coderv1alpha1.ConditionReconciled).Message
	for _, want := range []string{
		`spec.workspaceRBAC.extraRules: rules chosen in the spec are not supported`,
		`spec.workspaceRBAC.extraNamespaces[0]: namespace "kube-system" is not allowed: control planes in namespace "` + ns + `" may reach only their own namespace`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("Reconciled message does not say %q:\n%s", want, msg)
		}
	}
	if got.Status.Phase != coderv1alpha1.PhaseFailed {
		t.Errorf("phase %s, want Failed", got.Status.Phase)
	}
	ev := waitEvent(t, ns, "mine", corev1.EventTypeWarning, coderv1alpha1.ReasonWorkspaceRBACRefused)
	if !strings.Contains(ev.Note, `spec.workspaceRBAC.extraNamespaces[0]: namespace "kube-system" is not allowed`) {
		t.Errorf("event note %q does not name the field", ev.Note)
	}
	// The rest of the control plane is still applied: the refusal is
	// about workspace RBAC only.
	if err := admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: "mine"}, &corev1.ServiceAccount{}); err != nil {
		t.Errorf("service account: %v", err)
	}
	for _, where := range []string{"kube-system", ns} {
		roles, bindings := workspaceRBACObjects(t, admin, where, ns, "mine")
		if len(roles) > 0 || len(bindings) > 0 {
			t.Errorf("%s holds %d Roles and bindings %v for the refused control plane", where, len(roles), roleRefs(bindings))
		}
	}

	// With the chart's RBAC the operator could not have made the grant
	// either way: it may create no Role, and kube-apiserver's escalation
	// check refuses a binding to a ClusterRole it may not bind.
	opClient, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	allRole := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "mine-workspace-perms"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}}},
	}
	if err := opClient.Create(ctx, allRole); !apierrors.IsForbidden(err) {
		t.Errorf("the operator's identity creating a Role granting * in kube-system: %v, want Forbidden", err)
	}
	sa := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "mine", Namespace: ns}
	adminBinding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "mine-admin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{sa},
	}
	err = opClient.Create(ctx, adminBinding)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "attempting to grant RBAC permissions not currently held") {
		t.Errorf("the operator's identity binding cluster-admin in kube-system: %v, want Forbidden by the escalation check", err)
	}

	// The tenant drops what is not allowed: RoleBindings to the default
	// ClusterRole in the own namespace, nothing else.
	updateCCP(t, admin, ns, "mine", func(ccp *coderv1alpha1.CoderControlPlane) {
		ccp.Spec.WorkspaceRBAC.ExtraNamespaces = nil
		ccp.Spec.WorkspaceRBAC.ExtraRules = nil
	})
	waitCondition(t, admin, ns, "mine", coderv1alpha1.ConditionReconciled, metav1.ConditionTrue, coderv1alpha1.ReasonApplied)
	eventually(t, 30*time.Second, "workspace RoleBinding", func() error {
		roles, bindings := workspaceRBACObjects(t, admin, ns, ns, "mine")
		want := []string{ns + "/mine-workspace-" + DefaultWorkspaceClusterRole + "→ClusterRole/" + DefaultWorkspaceClusterRole}
		if len(roles) > 0 || !slices.Equal(roleRefs(bindings), want) {
			return fmt.Errorf("%d Roles, bindings %v, want no Role and %v", len(roles), roleRefs(bindings), want)
		}
		if s := bindings[0].Subjects; len(s) != 1 || s[0] != sa {
			return fmt.Errorf("subjects %+v, want %+v", s, sa)
		}
		return nil
	})
	if roles, bindings := workspaceRBACObjects(t, admin, "kube-system", ns, "mine"); len(roles)+len(bindings) > 0 {
		t.Errorf("kube-system holds workspace RBAC of %s/mine: %d Roles, %v", ns, len(roles), roleRefs(bindings))
	}

	// A ClusterRole the configuration does not list is refused by name.
	updateCCP(t, admin, ns, "mine", func(ccp *coderv1alpha1.CoderControlPlane) {
		ccp.Spec.WorkspaceRBAC.ClusterRoles = []string{"cluster-admin"}
	})
	got = waitCondition(t, admin, ns, "mine", coderv1alpha1.ConditionReconciled, metav1.ConditionFalse, coderv1alpha1.ReasonWorkspaceRBACRefused)
	want := `spec.workspaceRBAC.clusterRoles[0]: ClusterRole "cluster-admin" is not allowed: the operator may bind only ` + DefaultWorkspaceClusterRole + ", " + DefaultWorkspaceDeploymentsClusterRole
	if msg := apimeta.FindStatusCondition(got.Status.Conditions, coderv1alpha1.ConditionReconciled).Message; !strings.Contains(msg, want) {
		t.Errorf("Reconciled message %q does not say %q", msg, want)
	}
	// Refused as a whole: the earlier binding is gone too.
	eventually(t, 30*time.Second, "workspace RBAC of the refused spec pruned", func() error {
		if _, bindings := workspaceRBACObjects(t, admin, ns, ns, "mine"); len(bindings) > 0 {
			return fmt.Errorf("bindings %v", roleRefs(bindings))
		}
		return nil
	})
}

// TestWorkspaceRBACInExtraNamespaces: namespaces the configuration allows
// get RoleBindings to the default and the deployments ClusterRoles; the
// Roles and RoleBindings of earlier versions are pruned; objects deleted
// by someone come back; a namespace removed from the list, and in the end
// the control plane, take their bindings with them.
func TestWorkspaceRBACInExtraNamespaces(t *testing.T) {
	installWorkspaceClusterRoles(t)
	ns := controllertest.Namespace(t, "rbac")
	extra1 := controllertest.Namespace(t, "ws1")
	extra2 := controllertest.Namespace(t, "ws2")
	h := startManager(t, []string{ns, extra1, extra2}, nil, func(r *Reconciler) {
		p := DefaultWorkspaceRBACPolicy()
		p.ExtraNamespaces = map[string][]string{ns: {extra1, extra2}}
		r.WorkspaceRBAC = &p
	})
	ctx := context.Background()

	ccp := newControlPlane(ns, "coder")
	ccp.Spec.WorkspaceRBAC.Deployments = true
	ccp.Spec.WorkspaceRBAC.ExtraNamespaces = []string{extra1, extra2}
	create(t, h.c, ccp)
	ccp = getCCP(t, h.c, ns, "coder")

	// What an earlier version created: a Role with the spec's rules and a
	// RoleBinding to it, in the own namespace (owned) and an extra one
	// (labelled).
	for _, where := range []string{ns, extra1} {
		meta := metav1.ObjectMeta{Namespace: where, Name: "coder-workspace-perms", Labels: childLabels(ccp)}
		if where == ns {
			meta.OwnerReferences = []metav1.OwnerReference{{
				APIVersion: coderv1alpha1.GroupVersion.String(), Kind: "CoderControlPlane", Name: ccp.Name, UID: ccp.UID, Controller: ptr.To(true),
			}}
		}
		create(t, h.c, &rbacv1.Role{ObjectMeta: meta, Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get"}}}})
		create(t, h.c, &rbacv1.RoleBinding{ObjectMeta: meta,
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "coder-workspace-perms"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "coder", Namespace: ns}}})
	}

	wantIn := func(where string) []string {
		want := []string{
			where + "/coder-workspace-" + DefaultWorkspaceClusterRole + "→ClusterRole/" + DefaultWorkspaceClusterRole,
			where + "/coder-workspace-" + DefaultWorkspaceDeploymentsClusterRole + "→ClusterRole/" + DefaultWorkspaceDeploymentsClusterRole,
		}
		slices.Sort(want)
		return want
	}
	for _, where := range []string{ns, extra1, extra2} {
		eventually(t, 30*time.Second, "workspace RBAC in "+where, func() error {
			roles, bindings := workspaceRBACObjects(t, h.c, where, ns, "coder")
			if len(roles) > 0 || !slices.Equal(roleRefs(bindings), wantIn(where)) {
				return fmt.Errorf("%d Roles, bindings %v; want no Role and %v", len(roles), roleRefs(bindings), wantIn(where))
			}
			for _, b := range bindings {
				if where != ns && len(b.OwnerReferences) != 0 {
					return fmt.Errorf("a cross-namespace owner reference %v", b.OwnerReferences)
				}
				if b.Subjects[0].Namespace != ns || b.Subjects[0].Name != "coder" {
					return fmt.Errorf("subjects %+v, want service account %s/coder", b.Subjects, ns)
				}
			}
			return nil
		})
	}
	waitCondition(t, h.c, ns, "coder", coderv1alpha1.ConditionReconciled, metav1.ConditionTrue, coderv1alpha1.ReasonApplied)
	if ccp := getCCP(t, h.c, ns, "coder"); !slices.Contains(ccp.Finalizers, FinalizerWorkspaceRBAC) {
		t.Errorf("finalizers = %v, want %s", ccp.Finalizers, FinalizerWorkspaceRBAC)
	}

	// Someone deletes a binding in an extra namespace: it comes back.
	bindingIn := func(where string) (*rbacv1.RoleBinding, error) {
		var rb rbacv1.RoleBinding
		err := h.c.Get(ctx, types.NamespacedName{Namespace: where, Name: "coder-workspace-" + DefaultWorkspaceClusterRole}, &rb)
		return &rb, err
	}
	old, err := bindingIn(extra2)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.c.Delete(ctx, old); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "RoleBinding recreated in "+extra2, func() error {
		rb, err := bindingIn(extra2)
		if err == nil && rb.UID == old.UID {
			return errors.New("still the deleted one")
		}
		return err
	})

	// A namespace removed from the list loses its bindings.
	updateCCP(t, h.c, ns, "coder", func(ccp *coderv1alpha1.CoderControlPlane) {
		ccp.Spec.WorkspaceRBAC.ExtraNamespaces = []string{extra2}
	})
	eventually(t, 30*time.Second, "workspace RBAC removed from "+extra1, func() error {
		if roles, bindings := workspaceRBACObjects(t, h.c, extra1, ns, "coder"); len(roles)+len(bindings) > 0 {
			return fmt.Errorf("still there: %d Roles, %v", len(roles), roleRefs(bindings))
		}
		return nil
	})
	if _, err := bindingIn(extra2); err != nil {
		t.Errorf("workspace RBAC in %s: %v", extra2, err)
	}

	// Deleting the control plane removes the rest (no garbage collector
	// runs here, and none would for cross-namespace objects anyway).
	deleteCCP(t, h.c, ns, "coder", 30*time.Second)
	if _, err := bindingIn(extra2); !apierrors.IsNotFound(err) {
		t.Errorf("workspace RBAC in %s after deletion: %v, want not found", extra2, err)
	}
}
