package controlplane

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/controllertest"
)

// TestUpgradeKeepsChildrenUntouched upgrades from the children the
// previous operator (before the shared workload toolkit) applied: the
// fixtures in testdata/upgrade were captured from that commit's builders
// for a control plane with default settings and for one using most
// fields. Each child is applied the way that operator applied it
// (server-side apply as field manager coder-k8s, with its hash
// annotation); the current reconciler must then find nothing to change:
// no child is written, so coderd's pods do not roll on upgrade. The
// exception is workspace RBAC: the previous operator's Roles and
// RoleBindings are deleted and replaced by RoleBindings to the workspace
// ClusterRoles, and a spec with extraRules is refused (by field) without
// touching the rest.
func TestUpgradeKeepsChildrenUntouched(t *testing.T) {
	for _, name := range []string{"default", "full"} {
		t.Run(name, func(t *testing.T) { testUpgradeKeepsChildren(t, name) })
	}
}

func testUpgradeKeepsChildren(t *testing.T, fixture string) {
	ctx := context.Background()
	ns := controllertest.Namespace(t, "upgrade-"+fixture)
	spec := readFixture[coderv1alpha1.CoderControlPlaneSpec](t, fixture+".spec.json")
	children := readFixture[[]map[string]any](t, fixture+".children.json")

	// Extra namespaces of workspace RBAC must exist, as in a cluster.
	c := controllertest.Client(t)
	extraNS := map[string]string{}
	for _, x := range spec.WorkspaceRBAC.ExtraNamespaces {
		extraNS[x] = controllertest.Namespace(t, x)
	}
	spec.WorkspaceRBAC.ExtraNamespaces = nil
	for _, x := range extraNS {
		spec.WorkspaceRBAC.ExtraNamespaces = append(spec.WorkspaceRBAC.ExtraNamespaces, x)
	}
	// The Secrets the pods mount exist, so the control plane reconciles
	// fully.
	var secrets []string
	if spec.TLS != nil {
		secrets = append(secrets, spec.TLS.SecretNames...)
	}
	for _, ref := range spec.CACerts {
		secrets = append(secrets, ref.Name)
	}
	for _, name := range secrets {
		create(t, c, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
	}
	ccp := newControlPlane(ns, "coder")
	ccp.Spec = spec
	// The previous operator had added its finalizers before any child.
	ccp.Finalizers = []string{FinalizerOperatorAccess}
	if len(extraNS) > 0 {
		ccp.Finalizers = append(ccp.Finalizers, FinalizerWorkspaceRBAC)
	}
	create(t, c, ccp)

	// Apply the previous operator's children.
	type ref struct{ kind, ns, name string }
	before := map[ref]string{}
	for _, m := range children {
		raw, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		s := strings.ReplaceAll(string(raw), `"OWNER-UID"`, fmt.Sprintf("%q", ccp.UID))
		// The namespace appears alone and in the in-cluster URL.
		s = strings.ReplaceAll(s, "NAMESPACE", ns)
		for from, to := range extraNS {
			s = strings.ReplaceAll(s, fmt.Sprintf("%q", from), fmt.Sprintf("%q", to))
		}
		u := &unstructured.Unstructured{}
		if err := json.Unmarshal([]byte(s), &u.Object); err != nil {
			t.Fatal(err)
		}
		// The previous operator's hash: SHA-256 of the JSON apply
		// object (map keys sorted), first 12 bytes in hex.
		b, err := json.Marshal(u.Object)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		ann := u.GetAnnotations()
		if ann == nil {
			ann = map[string]string{}
		}
		ann["coder.com/applied-hash"] = hex.EncodeToString(sum[:12])
		u.SetAnnotations(ann)
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("coder-k8s"), client.ForceOwnership); err != nil {
			t.Fatalf("apply previous %s %s: %v", u.GetKind(), u.GetName(), err)
		}
		before[ref{u.GetKind(), u.GetNamespace(), u.GetName()}] = u.GetResourceVersion()
	}

	// Upgrade: the current reconciler takes over, with a configuration
	// that lets the control plane reach its extra namespaces.
	h := startManager(t, append([]string{ns}, mapValues(extraNS)...), nil, func(r *Reconciler) {
		p := DefaultWorkspaceRBACPolicy()
		p.ExtraNamespaces = map[string][]string{ns: mapValues(extraNS)}
		r.WorkspaceRBAC = &p
	})
	if len(spec.WorkspaceRBAC.ExtraRules) > 0 {
		ccp := waitCondition(t, h.c, ns, "coder", coderv1alpha1.ConditionReconciled, metav1.ConditionFalse, coderv1alpha1.ReasonWorkspaceRBACRefused)
		if msg := apimeta.FindStatusCondition(ccp.Status.Conditions, coderv1alpha1.ConditionReconciled).Message; !strings.HasPrefix(msg, "spec.workspaceRBAC.extraRules: ") {
			t.Errorf("Reconciled message %q does not start with the refused field", msg)
		}
	} else {
		waitCondition(t, h.c, ns, "coder", coderv1alpha1.ConditionReconciled, metav1.ConditionTrue, coderv1alpha1.ReasonApplied)
	}
	// The previous workspace Roles and RoleBindings are pruned.
	for r := range before {
		if r.kind != "Role" && r.kind != "RoleBinding" {
			continue
		}
		eventually(t, 30*time.Second, fmt.Sprintf("previous %s %s/%s deleted", r.kind, r.ns, r.name), func() error {
			u := &unstructured.Unstructured{}
			u.SetAPIVersion(apiVersionOf(children, r.kind))
			u.SetKind(r.kind)
			if err := c.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: r.name}, u); !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there (%v)", err)
			}
			return nil
		})
		delete(before, r)
	}
	// One more reconcile, then no other child may have been written.
	h.writes.Reset()
	if _, err := h.r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "coder"}}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	for r, rv := range before {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion(apiVersionOf(children, r.kind))
		u.SetKind(r.kind)
		if err := c.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: r.name}, u); err != nil {
			t.Fatalf("get %s %s/%s: %v", r.kind, r.ns, r.name, err)
		}
		if u.GetResourceVersion() != rv {
			t.Errorf("%s %s/%s was written on upgrade (resourceVersion %s -> %s, generation %d)", r.kind, r.ns, r.name, rv, u.GetResourceVersion(), u.GetGeneration())
		}
	}
	if n, log := h.writes.Written(); n > 0 {
		for _, w := range log {
			if !strings.HasPrefix(w, "status") {
				t.Errorf("write on upgrade: %s", w)
			}
		}
	}
}

func readFixture[T any](t *testing.T, name string) T {
	t.Helper()
	var v T
	b, err := os.ReadFile(filepath.Join("testdata", "upgrade", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

func apiVersionOf(children []map[string]any, kind string) string {
	for _, m := range children {
		if m["kind"] == kind {
			return m["apiVersion"].(string)
		}
	}
	return ""
}

func mapValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
