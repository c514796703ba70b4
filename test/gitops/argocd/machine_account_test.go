package argocd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/argoproj/gitops-engine/pkg/cache"
	"github.com/argoproj/gitops-engine/pkg/sync/common"
	"github.com/go-logr/logr/testr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// The machine account recipe of docs/gitops.md: Argo CD's application
// controller gets a Coder user of its own, declared as a CoderUser with
// loginType none, and a mapping of its ServiceAccount to it; coder-k8s
// mints that user's tokens, so no token is kept anywhere.
const (
	machineNamespace = "argocd-machine"
	machineUser      = "argocd"
	peopleApp        = "coder-people"
	// managedUser is a person the Application declares.
	managedUser   = "ada"
	peopleTplName = "people-tpl"
)

var users = schema.GroupVersionResource{Group: "aggregation.coder.com", Version: "v1alpha1", Resource: "coderusers"}

// machineAccount is what a platform admin applies once, with kubectl, to
// bootstrap: the controller's Coder user. Coder lets a user-admin create
// users, suspend them and change their profiles, and a template-admin
// push templates.
const machineAccount = `apiVersion: aggregation.coder.com/v1alpha1
kind: CoderUser
metadata:
  name: ` + machineUser + `
  namespace: %s
spec:
  email: argocd@machines.example.com
  name: Argo CD
  loginType: none
  roles: [template-admin, user-admin]`

// peopleManifests are the Application the controller syncs as its own
// Coder user: a person and a template.
const peopleManifests = `apiVersion: aggregation.coder.com/v1alpha1
kind: CoderUser
metadata:
  name: ` + managedUser + `
  namespace: %[1]s
spec:
  email: ada@example.com
  name: Ada Lovelace
  loginType: none
  suspended: false
---
apiVersion: aggregation.coder.com/v1alpha1
kind: CoderTemplate
metadata:
  name: coder.` + peopleTplName + `
  namespace: %[1]s
spec:
  displayName: People's template
  files:
    main.tf: |
      output "hello" {
        value = "hello"
      }`

// TestArgoCDMachineAccount runs docs/gitops.md's machine account recipe
// end to end: the admin applies the controller's CoderUser (loginType
// none) and maps the controller's ServiceAccount to it; the controller,
// with its own credentials and cluster cache, syncs an Application of a
// CoderUser and a CoderTemplate; Coder shows the template created by the
// controller's user; a user suspended and renamed in the Coder UI shows as
// OutOfSync and the next sync heals it; removing the manifests prunes
// both from Coder.
func TestArgoCDMachineAccount(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	admin, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		t.Fatal(err)
	}
	controllerCfg := applicationControllerConfig(ctx, t, admin, machineNamespace, controllerName)
	controllerKubeUser := "system:serviceaccount:" + machineNamespace + ":" + controllerName
	asController, err := dynamic.NewForConfig(controllerCfg)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("bootstrap: the admin applies the controller's CoderUser and maps its ServiceAccount", func(t *testing.T) {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(fmt.Appendf(nil, machineAccount, env.Namespace), &u.Object); err != nil {
			t.Fatal(err)
		}
		if _, err := dyn.Resource(users).Namespace(env.Namespace).Apply(ctx, machineUser, u, metav1.ApplyOptions{FieldManager: "platform-admin"}); err != nil {
			t.Fatal(err)
		}
		ccp, err := dyn.Resource(controlPlanes).Namespace(env.Namespace).Get(ctx, "coder", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		mappings, _, _ := unstructured.NestedSlice(ccp.Object, "spec", "identity", "mappings")
		mappings = append(mappings, map[string]any{"kubernetesUser": controllerKubeUser, "coderUser": machineUser})
		if err := unstructured.SetNestedSlice(ccp.Object, mappings, "spec", "identity", "mappings"); err != nil {
			t.Fatal(err)
		}
		if _, err := dyn.Resource(controlPlanes).Namespace(env.Namespace).Update(ctx, ccp, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		out, err := env.Coder(ctx, "users", "show", machineUser, "--output", "json")
		if err != nil {
			t.Fatal(err)
		}
		var cu struct {
			LoginType string `json:"login_type"`
			Roles     []struct {
				Name string `json:"name"`
			} `json:"roles"`
		}
		if err := json.Unmarshal([]byte(out), &cu); err != nil {
			t.Fatalf("coder users show: %v\n%s", err, out)
		}
		var roles []string
		for _, r := range cu.Roles {
			roles = append(roles, r.Name)
		}
		if cu.LoginType != "none" || strings.Join(roles, ",") != "template-admin,user-admin" {
			t.Errorf("Coder user %s: login type %q, roles %v; want none and [template-admin user-admin]", machineUser, cu.LoginType, roles)
		}
		// The mapping is in effect once the controller reads its own
		// CoderUser (a user-admin reads every user).
		waitFor(t, time.Minute, func() error {
			_, err := asController.Resource(users).Namespace(env.Namespace).Get(ctx, machineUser, metav1.GetOptions{})
			return err
		})
	})
	if t.Failed() {
		return
	}

	// The controller's cluster cache and syncs run with its own
	// credentials, as Argo CD's do.
	cc := cache.NewClusterCache(controllerCfg,
		cache.SetNamespaces([]string{env.Namespace}),
		cache.SetLogr(testr.NewWithOptions(t, testr.Options{Verbosity: 0})),
		cache.SetPopulateResourceInfoHandler(func(u *unstructured.Unstructured, _ bool) (any, bool) {
			a := trackedApp(u)
			return a, a != ""
		}))
	if err := cc.EnsureSynced(); err != nil {
		t.Fatalf("cluster cache: %v", err)
	}
	defer cc.Invalidate()
	healthCheck = luaHealth{script: docsHealthScript(t)}
	people := application{name: peopleApp, namespace: env.Namespace, cfg: controllerCfg}
	tgt := people.targets(t, fmt.Sprintf(peopleManifests, env.Namespace))

	t.Run("the controller syncs as its own Coder user: Synced and Healthy, no diff on a hard refresh", func(t *testing.T) {
		requireResults(t, people.sync(ctx, t, cc, tgt, "rev1"), common.ResultCodeSynced, 2)
		people.waitStatus(t, cc, tgt, "Synced and Healthy", func(s appStatus) bool { return s.synced() && s.healthy() && s.live == 2 })
		cc.Invalidate()
		if err := cc.EnsureSynced(); err != nil {
			t.Fatal(err)
		}
		if st := people.refresh(t, cc, tgt); !st.synced() || !st.healthy() || st.live != 2 {
			t.Fatalf("after a hard refresh, want both Synced:\n%s", st)
		}
		out, err := env.Coder(ctx, "templates", "list", "--output", "json")
		if err != nil {
			t.Fatal(err)
		}
		var tpls []struct {
			Template struct {
				Name          string `json:"name"`
				CreatedByName string `json:"created_by_name"`
			} `json:"Template"`
		}
		if err := json.Unmarshal([]byte(out), &tpls); err != nil {
			t.Fatalf("coder templates list: %v\n%s", err, out)
		}
		createdBy := "(missing)"
		for _, tpl := range tpls {
			if tpl.Template.Name == peopleTplName {
				createdBy = tpl.Template.CreatedByName
			}
		}
		if createdBy != machineUser {
			t.Errorf("Coder says template %s was created by %s, want the controller's user %s", peopleTplName, createdBy, machineUser)
		}
		// Coder marks a new account dormant until it is first used.
		if status := coderUserStatus(ctx, t, managedUser); status != "dormant" {
			t.Errorf("Coder user %s is %q, want dormant", managedUser, status)
		}
	})
	if t.Failed() {
		return
	}

	t.Run("a user suspended in Coder: OutOfSync, then healed", func(t *testing.T) {
		// As the Coder UI suspends a user (the CLI's suspend prompts).
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, env.CoderURL+"/api/v2/users/"+managedUser+"/status/suspend", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Coder-Session-Token", env.SessionToken)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("suspend %s in Coder: %s %s", managedUser, res.Status, body)
		}
		if status := coderUserStatus(ctx, t, managedUser); status != "suspended" {
			t.Fatalf("Coder user %s is %q, want suspended", managedUser, status)
		}
		people.waitStatus(t, cc, tgt, "the user OutOfSync", func(s appStatus) bool {
			for _, r := range s.resources {
				if r.key == "CoderUser/"+managedUser {
					return !r.synced
				}
			}
			return false
		})
		requireResults(t, people.sync(ctx, t, cc, tgt, "rev1"), common.ResultCodeSynced, 2)
		people.waitStatus(t, cc, tgt, "Synced again", func(s appStatus) bool { return s.synced() && s.healthy() })
		if status := coderUserStatus(ctx, t, managedUser); status != "active" {
			t.Errorf("Coder user %s is %q after the sync, want active (activated)", managedUser, status)
		}
	})

	t.Run("prune: the user and the template are deleted from Coder", func(t *testing.T) {
		requireResults(t, people.sync(ctx, t, cc, nil, "rev2"), common.ResultCodePruned, 2)
		for _, o := range []struct {
			gvr  schema.GroupVersionResource
			name string
		}{{users, managedUser}, {templates, "coder." + peopleTplName}} {
			if _, err := dyn.Resource(o.gvr).Namespace(env.Namespace).Get(ctx, o.name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("%s %s after the prune: %v, want NotFound", o.gvr.Resource, o.name, err)
			}
		}
		if out, err := env.Coder(ctx, "users", "list", "--output", "json"); err != nil || strings.Contains(out, `"username": "`+managedUser+`"`) || strings.Contains(out, `"username":"`+managedUser+`"`) {
			t.Errorf("coder users list after the prune: %v\n%s", err, out)
		}
	})
}

// coderUserStatus is user's status as the Coder CLI shows it.
func coderUserStatus(ctx context.Context, t *testing.T, user string) string {
	t.Helper()
	out, err := env.Coder(ctx, "users", "show", user, "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	var u struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &u); err != nil {
		t.Fatalf("coder users show %s: %v\n%s", user, err, out)
	}
	return u.Status
}
