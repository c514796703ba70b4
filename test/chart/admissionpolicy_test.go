package chart

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/scheme"
)

// TestAdmissionPolicy installs the chart (defaults) on a real
// kube-apiserver and creates coder.com objects as users with ordinary
// namespace rights, impersonated: the chart's ValidatingAdmissionPolicy
// refuses, naming the field, what the author could not have done
// themselves (the escalation of issue #16 first), and accepts what they
// could. It also checks, as the operator's ServiceAccount, that the RBAC
// the chart renders lets the operator bind only its workspace ClusterRoles
// and create no Role.
func TestAdmissionPolicy(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	for _, ns := range []string{releaseNamespace, "tenant-a", "tenant-a-ws"} {
		if err := c.k.EnsureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	rel := &release{name: releaseName, namespace: releaseNamespace, manager: fieldManager}
	m := mustRender(t, renderOptions{kubeVersion: c.kubeVersion}, ciValues(t, "default"))
	c.upgrade(t, rel, m)
	if m.find("ValidatingAdmissionPolicy", releaseName+"-author-rights") == nil {
		t.Fatal("the default values render no admission policy")
	}

	admin := newClient(t, c.k.Config)
	// tenant: a namespace administrator of tenant-a and tenant-a-ws (what
	// the built-in admin role grants on workloads, Secrets and
	// RoleBindings; the built-in one is filled by kube-controller-manager's
	// aggregation, which the test stack does not run), and every verb on
	// the coder.com kinds there; nothing in kube-system. crd-only: only
	// the coder.com kinds in tenant-a.
	mustCreate(t, admin, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "namespace-admin"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "pods/exec", "pods/log", "persistentvolumeclaims", "secrets", "services", "serviceaccounts", "configmaps", "events"}, Verbs: []string{"*"}},
			{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"*"}},
			{APIGroups: []string{rbacv1.GroupName}, Resources: []string{"roles", "rolebindings"}, Verbs: []string{"*"}},
		},
	})
	mustCreate(t, admin, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "coder-objects-editor"},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{coderv1alpha1.GroupVersion.Group},
			Resources: []string{"codercontrolplanes", "coderprovisioners", "coderworkspaceproxies"},
			Verbs:     []string{"get", "list", "watch", "create", "update", "patch", "delete"},
		}},
	})
	bind := func(ns, user, role string) {
		mustCreate(t, admin, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user + "-" + role},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
		})
	}
	for _, ns := range []string{"tenant-a", "tenant-a-ws"} {
		bind(ns, "tenant", "namespace-admin")
		bind(ns, "tenant", "coder-objects-editor")
	}
	bind("tenant-a", "crd-only", "coder-objects-editor")
	tenant := newClient(t, impersonating(c.k.Config, "tenant"))
	crdOnly := newClient(t, impersonating(c.k.Config, "crd-only"))

	// kube-apiserver loads new policies asynchronously: wait until the
	// escalation attempt is refused by it.
	escalation := controlPlane("tenant-a", "mine")
	escalation.Spec.WorkspaceRBAC.ExtraNamespaces = []string{"kube-system"}
	escalation.Spec.WorkspaceRBAC.ExtraRules = []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}}}
	var err error
	deadline := time.Now().Add(30 * time.Second)
	for {
		err = tenant.Create(ctx, escalation.DeepCopy())
		if err == nil {
			// Accepted before the policy was loaded: undo and retry.
			if err := admin.Delete(ctx, escalation.DeepCopy()); err != nil {
				t.Fatal(err)
			}
			if time.Now().After(deadline) {
				t.Fatal("the escalating control plane is still accepted after 30s")
			}
		} else if strings.Contains(err.Error(), "ValidatingAdmissionPolicy") || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	wantRefused(t, err, `spec.workspaceRBAC.extraNamespaces[0]: namespace "kube-system" is not yours to grant: you may not create rolebindings and pods there`)
	if err := admin.Get(ctx, client.ObjectKeyFromObject(escalation), &coderv1alpha1.CoderControlPlane{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused control plane exists: %v", err)
	}

	refused := []struct {
		name string
		c    client.Client
		obj  client.Object
		want string
	}{{
		name: "extraRules",
		c:    tenant,
		obj: withSpec(controlPlane("tenant-a", "rules"), func(s *coderv1alpha1.CoderControlPlaneSpec) {
			s.WorkspaceRBAC.ExtraRules = []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get"}}}
		}),
		want: "spec.workspaceRBAC.extraRules: rules chosen in the spec are not supported",
	}, {
		name: "a ClusterRole the tenant may not bind",
		c:    tenant,
		obj: withSpec(controlPlane("tenant-a", "roles"), func(s *coderv1alpha1.CoderControlPlaneSpec) {
			s.WorkspaceRBAC.ClusterRoles = []string{releaseName + "-workspace", "cluster-admin"}
		}),
		want: `spec.workspaceRBAC.clusterRoles[0]: you may not bind ClusterRole "` + releaseName + `-workspace" in namespace tenant-a`,
	}, {
		name: "a control plane by someone who may not create deployments",
		c:    crdOnly,
		obj:  controlPlane("tenant-a", "image"),
		want: "spec.image: a CoderControlPlane makes the operator run pods with the image, environment and service account of its spec in namespace tenant-a, and you may not create deployments there",
	}, {
		name: "a provisioner by someone who may not create deployments",
		c:    crdOnly,
		obj: &coderv1alpha1.CoderProvisioner{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "prov"},
			Spec: coderv1alpha1.CoderProvisionerSpec{ControlPlaneRef: coderv1alpha1.ControlPlaneReference{Name: "coder"}}},
		want: "spec.image: a CoderProvisioner makes the operator run pods",
	}, {
		name: "a workspace proxy by someone who may not create deployments",
		c:    crdOnly,
		obj: &coderv1alpha1.CoderWorkspaceProxy{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "proxy"},
			Spec: coderv1alpha1.CoderWorkspaceProxySpec{ControlPlaneRef: coderv1alpha1.ControlPlaneReference{Name: "coder"}, AccessURL: "https://proxy.example.com"}},
		want: "spec.image: a CoderWorkspaceProxy makes the operator run pods",
	}, {
		name: "an adopted coderd with an owner Secret its author may not read",
		c:    crdOnly,
		obj: withSpec(controlPlane("tenant-a", "adopted"), func(s *coderv1alpha1.CoderControlPlaneSpec) {
			s.ExternalURL = "https://coder.example.com"
			s.OperatorAccess.OwnerTokenSecretRef = &coderv1alpha1.SecretKeyReference{Name: "someone-elses", Key: "token"}
		}),
		want: `spec.operatorAccess.ownerTokenSecretRef.name: the operator would read Secret "someone-elses" for you, and you may not get it in namespace tenant-a`,
	}}
	for _, tc := range refused {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			wantRefused(t, tc.c.Create(ctx, tc.obj), tc.want)
		})
	}

	// What the authors could do themselves is accepted.
	allowed := withSpec(controlPlane("tenant-a", "coder"), func(s *coderv1alpha1.CoderControlPlaneSpec) {
		s.Image = "ghcr.io/coder/coder:v2.30.0"
		s.WorkspaceRBAC.Deployments = true
		s.WorkspaceRBAC.ExtraNamespaces = []string{"tenant-a-ws"}
		s.OperatorAccess.OwnerTokenSecretRef = &coderv1alpha1.SecretKeyReference{Name: "owner", Key: "token"}
	})
	if err := tenant.Create(ctx, allowed); err != nil {
		t.Fatalf("the tenant's own control plane was refused: %v", err)
	}
	adopted := withSpec(controlPlane("tenant-a", "adopted-plain"), func(s *coderv1alpha1.CoderControlPlaneSpec) {
		s.ExternalURL = "https://coder.example.com"
	})
	if err := crdOnly.Create(ctx, adopted); err != nil {
		t.Errorf("an adopted coderd without Secrets, by crd-only, was refused: %v", err)
	}
	// Metadata changes (the operator's finalizers, labels) are not
	// checked; spec changes are. (Patches, as kubectl and the operator
	// send them: a typed Update would also rewrite defaulted durations.)
	got := &coderv1alpha1.CoderControlPlane{}
	if err := crdOnly.Get(ctx, client.ObjectKeyFromObject(allowed), got); err != nil {
		t.Fatal(err)
	}
	orig := got.DeepCopy()
	got.Labels = map[string]string{"team": "a"}
	got.Finalizers = append(got.Finalizers, "coder.com/operator-access")
	if err := crdOnly.Patch(ctx, got, client.MergeFrom(orig)); err != nil {
		t.Errorf("a metadata-only patch by crd-only was refused: %v", err)
	}
	orig = got.DeepCopy()
	got.Spec.Image = "ghcr.io/coder/coder:v2.29.1"
	wantRefused(t, crdOnly.Patch(ctx, got, client.MergeFrom(orig)), "spec.image: a CoderControlPlane makes the operator run pods")

	// The operator's ServiceAccount with the RBAC the chart rendered.
	operator := newClient(t, impersonating(c.k.Config, "system:serviceaccount:"+releaseNamespace+":"+releaseName,
		"system:serviceaccounts", "system:serviceaccounts:"+releaseNamespace, "system:authenticated"))
	sa := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "coder", Namespace: "tenant-a"}
	for _, role := range []string{releaseName + "-workspace", releaseName + "-workspace-deployments"} {
		rb := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a-ws", Name: "coder-workspace-" + role},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{sa},
		}
		if err := operator.Create(ctx, rb); err != nil {
			t.Errorf("the operator binding its workspace ClusterRole %s: %v", role, err)
		}
	}
	clusterAdmin := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "coder-admin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{sa},
	}
	if err := operator.Create(ctx, clusterAdmin); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "attempting to grant RBAC permissions not currently held") {
		t.Errorf("the operator binding cluster-admin in kube-system: %v, want Forbidden by the escalation check", err)
	}
	allRole := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "mine-workspace-perms"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}}},
	}
	if err := operator.Create(ctx, allRole); !apierrors.IsForbidden(err) {
		t.Errorf("the operator creating a Role granting * in kube-system: %v, want Forbidden", err)
	}
}

func newClient(t *testing.T, cfg *rest.Config) client.Client {
	t.Helper()
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// impersonating is cfg (an administrator's) acting as user in groups.
func impersonating(cfg *rest.Config, user string, groups ...string) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return cfg
}

func mustCreate(t *testing.T, c client.Client, obj client.Object) {
	t.Helper()
	if err := c.Create(context.Background(), obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

func controlPlane(ns, name string) *coderv1alpha1.CoderControlPlane {
	return &coderv1alpha1.CoderControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
}

func withSpec(ccp *coderv1alpha1.CoderControlPlane, change func(*coderv1alpha1.CoderControlPlaneSpec)) *coderv1alpha1.CoderControlPlane {
	change(&ccp.Spec)
	return ccp
}

// wantRefused checks that err is the admission policy's refusal with want
// in its message.
func wantRefused(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("accepted, want refused with %q", want)
	case !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err):
		t.Errorf("error %v (%T), want a refusal with %q", err, err, want)
	case !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") || !strings.Contains(err.Error(), want):
		t.Errorf("error %q does not come from the admission policy or lacks %q", err, fmt.Sprint(want))
	}
}
