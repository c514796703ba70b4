package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

// TestClusterControllers runs kube-controller-manager as kubeadm and
// managed clusters run it: as system:kube-controller-manager, each
// controller as its own ServiceAccount in kube-system
// (--use-service-account-credentials) with the roles kube-apiserver
// bootstraps. None of them has a Coder user; the control planes run in
// Mapped mode with the configuration's default clusterControllers. The
// garbage collector deletes an orphaned workspace (gone in coderd too), the
// namespace controller deletes a namespace holding a control plane, and
// the controllers' ServiceAccounts read every object and change only its
// Kubernetes metadata.
func TestClusterControllers(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := context.Background()
	if _, err := s.coder.PushTemplate(ctx, "base", testenv.ProviderFreeTemplate()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.coder.CreateWorkspace(ctx, "base", "ws-kept"); err != nil {
		t.Fatal(err)
	}
	// After the APIService: the garbage collector's first discovery finds
	// coderworkspaces and codertemplates.
	s.k.NewControllerManagerWith(t, testenv.ControllerManagerOptions{
		Controllers:               []string{"garbage-collector-controller", "namespace-controller"},
		ServiceAccountCredentials: true,
	})
	ccp := &coderv1alpha1.CoderControlPlane{}
	if err := s.c.Get(ctx, types.NamespacedName{Namespace: s.ns, Name: "coder"}, ccp); err != nil {
		t.Fatal(err)
	}
	if ccp.Spec.Identity.Mode != "Mapped" {
		t.Fatalf("control plane %s/coder runs in identity mode %q, want Mapped", s.ns, ccp.Spec.Identity.Mode)
	}

	t.Run("the garbage collector deletes a workspace whose owner is gone", func(t *testing.T) {
		owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "ws-owner", Namespace: s.ns}}
		if err := s.c.Create(ctx, owner); err != nil {
			t.Fatal(err)
		}
		name := s.workspaceName("ws-gc")
		s.must(t, "apply", "--server-side", "-f", writeManifest(t, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderWorkspace
metadata:
  name: %s
  namespace: %s
  ownerReferences:
  - {apiVersion: v1, kind: ConfigMap, name: ws-owner, uid: %s}
spec: {templateName: base, running: false}
`, name, s.ns, owner.UID)))
		want := []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "ws-owner", UID: owner.UID}}
		if got := s.getObj(t, workspacesGVR, name).GetOwnerReferences(); !ownerRefsEqual(got, want) {
			t.Errorf("ownerReferences %s, want %s", mustJSON(got), mustJSON(want))
		}
		// What the garbage collector lists and watches, through
		// kube-controller-manager's shared informers: the metadata of
		// every namespace's objects, as system:kube-controller-manager.
		kcm, err := s.k.UserConfig("system:kube-controller-manager")
		if err != nil {
			t.Fatal(err)
		}
		mc, err := metadata.NewForConfig(kcm)
		if err != nil {
			t.Fatal(err)
		}
		pl, err := mc.Resource(workspacesGVR).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("system:kube-controller-manager lists coderworkspaces' metadata across namespaces: %v", err)
		}
		found := false
		for _, it := range pl.Items {
			if it.Namespace == s.ns && it.Name == name {
				found = true
				if !ownerRefsEqual(it.OwnerReferences, want) {
					t.Errorf("PartialObjectMetadata of %s: ownerReferences %s", name, mustJSON(it.OwnerReferences))
				}
			}
		}
		if !found {
			t.Errorf("system:kube-controller-manager's metadata list across namespaces lacks %s/%s", s.ns, name)
		}
		s.must(t, "wait", "--for=condition=Building=False", "cws/"+name, "-n", s.ns, "--timeout=90s")

		if err := s.c.Delete(ctx, owner); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 120*time.Second, func() error {
			_, err := s.dyn.Resource(workspacesGVR).Namespace(s.ns).Get(ctx, name, metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				return errNotYet(fmt.Sprintf("%s still there after its owner was deleted: %v", name, err))
			}
			return nil
		})
		_, err = s.coder.Client.WorkspaceByOwnerAndName(ctx, s.coder.Username, "ws-gc", codersdk.WorkspaceOptions{})
		if sdkErr := (*codersdk.Error)(nil); !errors.As(err, &sdkErr) || sdkErr.StatusCode() != http.StatusNotFound {
			t.Errorf("coderd's workspace ws-gc after the garbage collector deleted it: %v, want 404", err)
		}
	})

	t.Run("the controllers' ServiceAccounts read every object and change only its Kubernetes metadata", func(t *testing.T) {
		// kube-controller-manager creates its controllers' ServiceAccounts
		// as it starts them.
		testenv.WaitFor(t, 30*time.Second, func() error {
			_, err := s.k.Clientset.CoreV1().ServiceAccounts("kube-system").Get(ctx, "generic-garbage-collector", metav1.GetOptions{})
			return err
		})
		gc := rest.AnonymousClientConfig(s.k.Config)
		gc.BearerToken = serviceAccountToken(t, s, "kube-system", "generic-garbage-collector")
		gcDyn := dynamicFor(t, gc)

		tpl := s.org + ".base"
		all, err := gcDyn.Resource(templatesGVR).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("the garbage collector lists codertemplates across namespaces: %v", err)
		}
		if names := itemNames(all.Items); len(names) != 1 || names[0] != s.ns+"/"+tpl {
			t.Errorf("the garbage collector lists templates %v, want [%s/%s]", names, s.ns, tpl)
		}
		got, err := gcDyn.Resource(templatesGVR).Namespace(s.ns).Get(ctx, tpl, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the garbage collector gets template %s: %v", tpl, err)
		}
		if files, _, _ := unstructured.NestedMap(got.Object, "spec", "files"); len(files) != 0 {
			t.Errorf("the garbage collector reads %d files of template %s, want them redacted", len(files), tpl)
		}
		if files, _, _ := unstructured.NestedMap(s.getObj(t, templatesGVR, tpl).Object, "spec", "files"); len(files) == 0 {
			t.Errorf("the admin (mapped to an owner) reads no files of template %s", tpl)
		}

		ws := s.workspaceName("ws-kept")
		if _, err := gcDyn.Resource(workspacesGVR).Namespace(s.ns).Patch(ctx, ws, types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"example.com/by":"gc"}}}`), metav1.PatchOptions{}); err != nil {
			t.Errorf("the garbage collector labels workspace %s: %v", ws, err)
		} else if l := s.getObj(t, workspacesGVR, ws).GetLabels()["example.com/by"]; l != "gc" {
			t.Errorf("workspace %s has label example.com/by=%q after the garbage collector set it, want gc", ws, l)
		}
		before := s.coderWorkspace(t, "ws-kept")
		_, err = gcDyn.Resource(workspacesGVR).Namespace(s.ns).Patch(ctx, ws, types.MergePatchType,
			[]byte(`{"spec":{"running":false}}`), metav1.PatchOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("the garbage collector stops workspace %s: %v, want Forbidden", ws, err)
		}
		if after := s.coderWorkspace(t, "ws-kept"); after.LatestBuild.ID != before.LatestBuild.ID {
			t.Errorf("coderd started build %d (%s) of ws-kept for the garbage collector", after.LatestBuild.BuildNumber, after.LatestBuild.Transition)
		}
	})

	t.Run("the namespace controller deletes a namespace holding a Mapped control plane", func(t *testing.T) {
		const team = "team"
		adoptControlPlane(t, s, team, "coder", s.coder.URL.String())
		testenv.WaitFor(t, 60*time.Second, func() error {
			var ccp coderv1alpha1.CoderControlPlane
			if err := s.c.Get(ctx, types.NamespacedName{Namespace: team, Name: "coder"}, &ccp); err != nil {
				return err
			}
			if c := apimeta.FindStatusCondition(ccp.Status.Conditions, coderv1alpha1.ConditionIdentityMapped); c == nil || c.Status != metav1.ConditionTrue {
				return errNotYet(fmt.Sprintf("%s/coder: IdentityMapped is not True: %s", team, conditionSummary(ccp.Status.Conditions)))
			}
			return nil
		})
		ws := s.workspaceName("ws-kept")
		testenv.WaitFor(t, 30*time.Second, func() error {
			_, err := s.dyn.Resource(workspacesGVR).Namespace(team).Get(ctx, ws, metav1.GetOptions{})
			return err
		})
		// Kubernetes metadata of the namespace's objects: records in it,
		// which the namespace controller deletes too.
		s.must(t, "label", "cws", ws, "-n", team, "example.com/team=yes")
		s.must(t, "label", "ctpl", s.org+".base", "-n", team, "example.com/team=yes")

		s.must(t, "delete", "namespace", team, "--timeout=120s")
		if _, err := s.k.Clientset.CoreV1().Namespaces().Get(ctx, team, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("namespace %s after kubectl delete returned: %v, want NotFound", team, err)
		}
		if _, err := s.coder.Client.WorkspaceByOwnerAndName(ctx, s.coder.Username, "ws-kept", codersdk.WorkspaceOptions{}); err != nil {
			t.Errorf("coderd lost ws-kept when namespace %s was deleted: %v", team, err)
		}
		if _, err := s.coder.Client.TemplateByName(ctx, s.coder.OrganizationID, "base"); err != nil {
			t.Errorf("coderd lost template base when namespace %s was deleted: %v", team, err)
		}
		if got := s.getObj(t, workspacesGVR, ws).GetLabels()["example.com/team"]; got != "" {
			t.Errorf("workspace %s in namespace %s has label example.com/team=%q, which was set in namespace %s only", ws, s.ns, got, team)
		}
	})
}

// itemNames are the namespace/name of items.
func itemNames(items []unstructured.Unstructured) []string {
	out := make([]string, 0, len(items))
	for _, it := range items {
		out = append(out, strings.TrimPrefix(it.GetNamespace()+"/"+it.GetName(), "/"))
	}
	return out
}
