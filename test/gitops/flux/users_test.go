package flux

import (
	"context"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/fluxcd/cli-utils/pkg/kstatus/polling"
	"github.com/fluxcd/pkg/ssa"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const peopleUser = "grace"

var userGVK = schema.GroupVersionKind{Group: "aggregation.coder.com", Version: "v1alpha1", Kind: "CoderUser"}

// peopleManifest is a Kustomization's person: a Coder user with a site
// role, active.
const peopleManifest = `apiVersion: aggregation.coder.com/v1alpha1
kind: CoderUser
metadata:
  name: ` + peopleUser + `
  namespace: %s
spec:
  email: grace@example.com
  name: Grace Hopper
  loginType: none
  roles: [auditor]
  suspended: false`

// TestFluxUsers manages a Coder user with kustomize-controller's
// server-side apply: created with its role, unchanged on the next apply,
// a role removed and the user suspended in Coder corrected by the next
// apply, and pruned by inventory (deleted in Coder).
func TestFluxUsers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	poller := polling.NewStatusPoller(kube, kube.RESTMapper(), polling.Options{})
	rm := ssa.NewResourceManager(kube, poller, ssa.Owner{Field: "kustomize-controller", Group: "kustomize.toolkit.fluxcd.io"})
	people := &kustomization{name: "coder-people", manifests: peopleManifest}
	id := "CoderUser/" + peopleUser
	u, err := url.Parse(env.CoderURL)
	if err != nil {
		t.Fatal(err)
	}
	coder := codersdk.New(u)
	coder.SetSessionToken(env.SessionToken)
	inCoder := func(t *testing.T) (status codersdk.UserStatus, roles []string) {
		t.Helper()
		cu, err := coder.User(ctx, peopleUser)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range cu.Roles {
			roles = append(roles, r.Name)
		}
		slices.Sort(roles)
		return cu.Status, roles
	}

	t.Run("apply creates the user with its role", func(t *testing.T) {
		cs := people.apply(ctx, t, rm, people.objects(t))
		requireActions(t, "first apply", cs, map[string]ssa.Action{id: ssa.CreatedAction})
		people.wait(t, rm, cs)
		// Coder marks a new account dormant until it is first used.
		if status, roles := inCoder(t); status != codersdk.UserStatusDormant || !slices.Equal(roles, []string{"auditor"}) {
			t.Errorf("Coder user %s: %s %v, want dormant [auditor]", peopleUser, status, roles)
		}
		if live := get(ctx, t, userGVK, peopleUser); !hasManager(live, "kustomize-controller") {
			t.Errorf("no managedFields entry of kustomize-controller: %v", managers(live))
		}
	})
	if t.Failed() {
		return
	}

	t.Run("second apply is unchanged", func(t *testing.T) {
		cs := people.apply(ctx, t, rm, people.objects(t))
		requireActions(t, "second apply", cs, map[string]ssa.Action{id: ssa.UnchangedAction})
	})

	t.Run("a role removed and the user suspended in Coder are corrected", func(t *testing.T) {
		if _, err := coder.UpdateUserRoles(ctx, peopleUser, codersdk.UpdateRoles{Roles: []string{}}); err != nil {
			t.Fatal(err)
		}
		if _, err := coder.UpdateUserStatus(ctx, peopleUser, codersdk.UserStatusSuspended); err != nil {
			t.Fatal(err)
		}
		waitField(ctx, t, userGVK, peopleUser, "suspended", "status", "status")
		cs := people.apply(ctx, t, rm, people.objects(t))
		requireActions(t, "apply after the change in Coder", cs, map[string]ssa.Action{id: ssa.ConfiguredAction})
		people.wait(t, rm, cs)
		if status, roles := inCoder(t); status != codersdk.UserStatusActive || !slices.Equal(roles, []string{"auditor"}) {
			t.Errorf("Coder user %s after the apply: %s %v, want active [auditor]", peopleUser, status, roles)
		}
	})

	t.Run("prune by inventory deletes the user in Coder", func(t *testing.T) {
		cs := people.apply(ctx, t, rm, nil)
		requireActions(t, "prune", cs, map[string]ssa.Action{id: ssa.DeletedAction})
		obj := &unstructured.Unstructured{}
		obj.SetGroupVersionKind(userGVK)
		if err := kube.Get(ctx, client.ObjectKey{Namespace: env.Namespace, Name: peopleUser}, obj); !apierrors.IsNotFound(err) {
			t.Errorf("CoderUser %s after the prune: %v, want NotFound", peopleUser, err)
		}
		if _, err := coder.User(ctx, peopleUser); err == nil {
			t.Errorf("Coder still has user %s after the prune", peopleUser)
		}
	})
}
