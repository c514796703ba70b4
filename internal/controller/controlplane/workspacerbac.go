package controlplane

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

// Workspace RBAC: coderd's service account gets what Kubernetes workspace
// templates need through RoleBindings to ClusterRoles an administrator
// installed (the chart ships them), in the control plane's namespace and
// the extra namespaces the operator's configuration allows for it. The
// operator creates no Roles and holds neither escalate nor an unrestricted
// bind: it may bind only the ClusterRoles of its configuration, which the
// chart grants it by name. A spec asking for anything else is refused as a
// whole (no workspace RBAC at all) in the Reconciled condition.

// The ClusterRoles the chart installs for a release named coder-k8s: what
// a Reconciler without a WorkspaceRBAC policy binds.
const (
	DefaultWorkspaceClusterRole            = "coder-k8s-workspace"
	DefaultWorkspaceDeploymentsClusterRole = "coder-k8s-workspace-deployments"
)

// WorkspaceRBACPolicy is what spec.workspaceRBAC may ask for
// (config controller.workspaceRBAC).
type WorkspaceRBACPolicy struct {
	// ClusterRole is bound when spec.workspaceRBAC.clusterRoles is empty;
	// empty means nothing is bound then.
	ClusterRole string
	// DeploymentsClusterRole is bound as well for
	// spec.workspaceRBAC.deployments; empty refuses deployments.
	DeploymentsClusterRole string
	// AllowedClusterRoles may be named in spec.workspaceRBAC.clusterRoles
	// (besides ClusterRole and DeploymentsClusterRole).
	AllowedClusterRoles []string
	// ExtraNamespaces maps a namespace to the namespaces its control
	// planes may list in spec.workspaceRBAC.extraNamespaces.
	ExtraNamespaces map[string][]string
}

// DefaultWorkspaceRBACPolicy binds the chart's ClusterRoles of a release
// named coder-k8s and lets no control plane reach another namespace.
func DefaultWorkspaceRBACPolicy() WorkspaceRBACPolicy {
	return WorkspaceRBACPolicy{ClusterRole: DefaultWorkspaceClusterRole, DeploymentsClusterRole: DefaultWorkspaceDeploymentsClusterRole}
}

// allowedClusterRoles are every ClusterRole the operator may bind.
func (p *WorkspaceRBACPolicy) allowedClusterRoles() []string {
	var out []string
	for _, r := range append([]string{p.ClusterRole, p.DeploymentsClusterRole}, p.AllowedClusterRoles...) {
		if r != "" && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

// workspaceRBAC is what a control plane gets: the same ClusterRoles bound
// in each of its namespaces.
type workspaceRBAC struct {
	namespaces   []string
	clusterRoles []string
}

// workspaceRBACRefusedError names every field of spec.workspaceRBAC the
// policy does not allow.
type workspaceRBACRefusedError struct {
	problems []string
}

func (e *workspaceRBACRefusedError) Error() string {
	return strings.Join(e.problems, "; ") + "; no workspace RBAC is created until the spec or the operator's configuration (controller.workspaceRBAC) changes"
}

// workspaceRBACEnabled reports whether workspace RBAC is wanted; the CRD
// defaults spec.workspaceRBAC.enabled to true.
func workspaceRBACEnabled(ccp *coderv1alpha1.CoderControlPlane) bool {
	return ptr.Deref(ccp.Spec.WorkspaceRBAC.Enabled, true)
}

// plan returns the workspace RBAC ccp gets under the policy (nothing when
// disabled or adopted), or a *workspaceRBACRefusedError naming each field
// that asks for more than the policy allows.
func (p *WorkspaceRBACPolicy) plan(ccp *coderv1alpha1.CoderControlPlane) (workspaceRBAC, error) {
	spec := ccp.Spec.WorkspaceRBAC
	if ccp.Spec.ExternalURL != "" || !workspaceRBACEnabled(ccp) {
		return workspaceRBAC{}, nil
	}
	var problems []string
	refuse := func(field, format string, args ...any) {
		problems = append(problems, field+": "+fmt.Sprintf(format, args...))
	}
	if len(spec.ExtraRules) > 0 {
		refuse("spec.workspaceRBAC.extraRules",
			"rules chosen in the spec are not supported: the operator creates no Roles; remove extraRules and name a ClusterRole an administrator installed in spec.workspaceRBAC.clusterRoles")
	}

	allowed := p.allowedClusterRoles()
	allowedText := "none"
	if len(allowed) > 0 {
		allowedText = strings.Join(allowed, ", ")
	}
	var roles []string
	for i, r := range spec.ClusterRoles {
		if !slices.Contains(allowed, r) {
			refuse(fmt.Sprintf("spec.workspaceRBAC.clusterRoles[%d]", i),
				"ClusterRole %q is not allowed: the operator may bind only %s (controller.workspaceRBAC)", r, allowedText)
			continue
		}
		roles = appendNew(roles, r)
	}
	if len(spec.ClusterRoles) == 0 && p.ClusterRole != "" {
		roles = append(roles, p.ClusterRole)
	}
	if spec.Deployments {
		if p.DeploymentsClusterRole == "" {
			refuse("spec.workspaceRBAC.deployments",
				"the operator has no ClusterRole for deployments (controller.workspaceRBAC.deploymentsClusterRole is empty)")
		} else {
			roles = appendNew(roles, p.DeploymentsClusterRole)
		}
	}

	namespaces := []string{ccp.Namespace}
	reachable := p.ExtraNamespaces[ccp.Namespace]
	for i, ns := range spec.ExtraNamespaces {
		switch {
		case ns == "" || ns == ccp.Namespace:
		case !slices.Contains(reachable, ns):
			reach := "only their own namespace"
			if len(reachable) > 0 {
				reach = "their own namespace and " + strings.Join(reachable, ", ")
			}
			refuse(fmt.Sprintf("spec.workspaceRBAC.extraNamespaces[%d]", i),
				"namespace %q is not allowed: control planes in namespace %q may reach %s (controller.workspaceRBAC.extraNamespaces)", ns, ccp.Namespace, reach)
		default:
			namespaces = appendNew(namespaces, ns)
		}
	}
	if len(problems) > 0 {
		return workspaceRBAC{}, &workspaceRBACRefusedError{problems: problems}
	}
	if len(roles) == 0 {
		return workspaceRBAC{}, nil
	}
	return workspaceRBAC{namespaces: namespaces, clusterRoles: roles}, nil
}

func appendNew(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}

// bindings are the RoleBindings of the plan: one per namespace and
// ClusterRole.
func (w workspaceRBAC) bindings(ccp *coderv1alpha1.CoderControlPlane) []*rbacv1.RoleBinding {
	out := make([]*rbacv1.RoleBinding, 0, len(w.namespaces)*len(w.clusterRoles))
	for _, ns := range w.namespaces {
		for _, role := range w.clusterRoles {
			out = append(out, desiredWorkspaceRoleBinding(ccp, ns, role))
		}
	}
	return out
}

// reachesOtherNamespaces reports whether the plan binds outside the
// control plane's namespace, where owner references cannot clean up.
func (w workspaceRBAC) reachesOtherNamespaces() bool { return len(w.namespaces) > 1 }

// maxNameLength is the longest object name the API server stores.
const maxNameLength = 253

// workspaceRoleBindingName names the binding of clusterRole: derived from
// the role's name, so that a name always binds the same role (a
// RoleBinding's roleRef cannot change).
func workspaceRoleBindingName(ccp *coderv1alpha1.CoderControlPlane, clusterRole string) string {
	name := ccp.Name + "-workspace-" + clusterRole
	if len(name) <= maxNameLength {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return name[:maxNameLength-17] + "-" + hex.EncodeToString(sum[:8])
}

// desiredWorkspaceRoleBinding binds clusterRole in ns to coderd's service
// account.
func desiredWorkspaceRoleBinding(ccp *coderv1alpha1.CoderControlPlane, ns, clusterRole string) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: workspaceRoleBindingName(ccp, clusterRole), Namespace: ns, Labels: childLabels(ccp)},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
		Subjects: []rbacv1.Subject{{
			Kind:      rbacv1.ServiceAccountKind,
			Name:      serviceAccountName(ccp),
			Namespace: ccp.Namespace,
		}},
	}
}

// workspaceRBACPolicy is the reconciler's policy, or the default one.
func (r *Reconciler) workspaceRBACPolicy() *WorkspaceRBACPolicy {
	if r.WorkspaceRBAC != nil {
		return r.WorkspaceRBAC
	}
	p := DefaultWorkspaceRBACPolicy()
	return &p
}

// workspaceRBACPlan is ccp's workspace RBAC under the reconciler's policy;
// a refused spec gets none.
func (r *Reconciler) workspaceRBACPlan(ccp *coderv1alpha1.CoderControlPlane) (workspaceRBAC, error) {
	return r.workspaceRBACPolicy().plan(ccp)
}
