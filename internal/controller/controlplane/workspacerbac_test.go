package controlplane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/controllertest"
)

func TestWorkspaceRBACInExtraNamespaces(t *testing.T) {
	ns := controllertest.Namespace(t, "rbac")
	extra1 := controllertest.Namespace(t, "ws1")
	extra2 := controllertest.Namespace(t, "ws2")
	h := startManager(t, []string{ns, extra1, extra2}, nil, nil)
	ctx := context.Background()

	ccp := newControlPlane(ns, "coder")
	ccp.Spec.WorkspaceRBAC.Deployments = true
	ccp.Spec.WorkspaceRBAC.ExtraNamespaces = []string{extra1, extra2}
	ccp.Spec.WorkspaceRBAC.ExtraRules = []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get"}}}
	create(t, h.c, ccp)

	roleIn := func(ns string) (*rbacv1.Role, *rbacv1.RoleBinding, error) {
		var role rbacv1.Role
		var rb rbacv1.RoleBinding
		if err := h.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "coder-workspace-perms"}, &role); err != nil {
			return nil, nil, err
		}
		if err := h.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "coder-workspace-perms"}, &rb); err != nil {
			return nil, nil, err
		}
		return &role, &rb, nil
	}
	for _, x := range []string{extra1, extra2} {
		eventually(t, 30*time.Second, "workspace RBAC in "+x, func() error {
			role, rb, err := roleIn(x)
			if err != nil {
				return err
			}
			if len(role.Rules) != 4 || role.Rules[2].APIGroups[0] != "apps" || role.Rules[3].Resources[0] != "configmaps" {
				return fmt.Errorf("rules %+v, want pods, PVCs, deployments and the extra rule", role.Rules)
			}
			if len(role.OwnerReferences) != 0 {
				return fmt.Errorf("a cross-namespace owner reference %v", role.OwnerReferences)
			}
			if rb.Subjects[0].Namespace != ns || rb.Subjects[0].Name != "coder" {
				return fmt.Errorf("subjects %+v, want service account %s/coder", rb.Subjects, ns)
			}
			return nil
		})
	}
	ccp = getCCP(t, h.c, ns, "coder")
	if !slices.Contains(ccp.Finalizers, FinalizerWorkspaceRBAC) {
		t.Errorf("finalizers = %v, want %s", ccp.Finalizers, FinalizerWorkspaceRBAC)
	}

	// Someone deletes the Role in an extra namespace: it comes back.
	role, _, _ := roleIn(extra2)
	if err := h.c.Delete(ctx, role); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "Role recreated in "+extra2, func() error {
		r, _, err := roleIn(extra2)
		if err == nil && r.UID == role.UID {
			return errors.New("still the deleted one")
		}
		return err
	})

	// A namespace removed from the list loses its objects.
	updateCCP(t, h.c, ns, "coder", func(ccp *coderv1alpha1.CoderControlPlane) {
		ccp.Spec.WorkspaceRBAC.ExtraNamespaces = []string{extra2}
	})
	eventually(t, 30*time.Second, "workspace RBAC removed from "+extra1, func() error {
		if _, _, err := roleIn(extra1); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		var rb rbacv1.RoleBinding
		if err := h.c.Get(ctx, types.NamespacedName{Namespace: extra1, Name: "coder-workspace-perms"}, &rb); !apierrors.IsNotFound(err) {
			return fmt.Errorf("RoleBinding still there (%v)", err)
		}
		return nil
	})
	if _, _, err := roleIn(extra2); err != nil {
		t.Errorf("workspace RBAC in %s: %v", extra2, err)
	}

	// Deleting the control plane removes the rest (no garbage collector
	// runs here, and none would for cross-namespace objects anyway).
	if err := h.c.Delete(ctx, getCCP(t, h.c, ns, "coder")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "control plane deleted", func() error {
		err := h.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "coder"}, &coderv1alpha1.CoderControlPlane{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	if _, _, err := roleIn(extra2); !apierrors.IsNotFound(err) {
		t.Errorf("workspace RBAC in %s after deletion: %v, want not found", extra2, err)
	}
}
