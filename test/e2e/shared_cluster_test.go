package e2e

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

// The ServiceAccount that holds ClusterRole view across the cluster, as
// monitoring, backup and inventory tools do.
const (
	viewerNamespace = "viewers"
	viewerName      = "viewer"
	viewerUser      = "system:serviceaccount:" + viewerNamespace + ":" + viewerName
)

// TestSharedClusterViewer runs two control planes with objects of their
// own in one cluster: coder/coder in identity mode Mapped (the stack's),
// and ops/coder in Operator mode on a second coderd. A ServiceAccount
// bound to the built-in ClusterRole view (into which the chart aggregates
// read access to coderworkspaces and codertemplates) has no Coder user: it
// lists and watches across namespaces exactly the Operator backend's
// objects, with a Warning naming why the Mapped backend shows none, and no
// object of the Mapped backend reaches it in any watch event, also when
// the admin relabels and deletes templates there and Coder changes a
// workspace there.
func TestSharedClusterViewer(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// The Mapped backend: the stack's coderd.
	for _, tpl := range []string{"dev-tpl", "doomed-tpl"} {
		if _, err := s.coder.PushTemplate(ctx, tpl, testenv.ProviderFreeTemplate()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.coder.CreateWorkspace(ctx, "dev-tpl", "dev-ws"); err != nil {
		t.Fatal(err)
	}
	// The Operator backend: a coderd of its own.
	const ops = "ops"
	opsCoder := testenv.NewCoder(t, testenv.CoderOptions{Postgres: s.coder.Postgres})
	if _, err := opsCoder.PushTemplate(ctx, "ops-tpl", testenv.ProviderFreeTemplate()); err != nil {
		t.Fatal(err)
	}
	if _, err := opsCoder.CreateWorkspace(ctx, "ops-tpl", "ops-ws"); err != nil {
		t.Fatal(err)
	}
	adoptOperatorControlPlane(t, s, ops, opsCoder)

	// kube-controller-manager aggregates the chart's view rules into the
	// built-in ClusterRole view.
	s.k.NewControllerManagerWith(t, testenv.ControllerManagerOptions{
		Controllers: []string{"clusterrole-aggregation-controller"}, ServiceAccountCredentials: true,
	})
	viewer := clusterViewerConfig(t, s)

	wantWorkspaces := []string{ops + "/coder.admin.ops-ws"}
	wantTemplates := []string{ops + "/coder.ops-tpl"}
	// warning is what the viewer is told of the Mapped backend.
	warning := func(resource string) string {
		return `Kubernetes user "` + viewerUser + `" is a system user, which maps to a Coder user only through an explicit mapping (spec.identity.mappings): no ` +
			resource + ` of control plane ` + s.ns + `/coder are shown`
	}
	// What the admin (mapped to an owner in the Mapped backend) lists.
	for gvr, want := range map[schema.GroupVersionResource][]string{
		workspacesGVR: {s.ns + "/coder.admin.dev-ws", ops + "/coder.admin.ops-ws"},
		templatesGVR:  {s.ns + "/coder.dev-tpl", s.ns + "/coder.doomed-tpl", ops + "/coder.ops-tpl"},
	} {
		l, err := s.dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := sortedNames(l.Items); !slices.Equal(got, want) {
			t.Fatalf("the admin lists %s %v across namespaces, want %v", gvr.Resource, got, want)
		}
	}

	t.Run("LIST across namespaces: exactly the Operator backend's objects, with a Warning", func(t *testing.T) {
		for gvr, want := range map[schema.GroupVersionResource][]string{workspacesGVR: wantWorkspaces, templatesGVR: wantTemplates} {
			items, warnings := viewerList(ctx, t, viewer, gvr, "")
			if got := sortedNames(items); !slices.Equal(got, want) {
				t.Errorf("the viewer lists %s %v across namespaces, want %v", gvr.Resource, got, want)
			}
			if w := warning(gvr.Resource); !slices.Equal(warnings, []string{w}) {
				t.Errorf("the viewer's LIST of %s: Warning headers %q, want [%q]", gvr.Resource, warnings, w)
			}
		}
	})

	t.Run("the Mapped backend's namespace: an empty LIST with a Warning, GET is 404", func(t *testing.T) {
		items, warnings := viewerList(ctx, t, viewer, workspacesGVR, s.ns)
		if len(items) != 0 {
			t.Errorf("the viewer lists %v in namespace %s, want nothing", sortedNames(items), s.ns)
		}
		if w := warning("coderworkspaces"); !slices.Equal(warnings, []string{w}) {
			t.Errorf("the viewer's LIST in namespace %s: Warning headers %q, want [%q]", s.ns, warnings, w)
		}
		for gvr, name := range map[schema.GroupVersionResource]string{workspacesGVR: "coder.admin.dev-ws", templatesGVR: "coder.dev-tpl"} {
			_, err := dynamicFor(t, viewer).Resource(gvr).Namespace(s.ns).Get(ctx, name, metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				t.Errorf("the viewer gets %s %s/%s: %v, want NotFound", gvr.Resource, s.ns, name, err)
			}
		}
	})

	t.Run("WATCH across namespaces: no event of the Mapped backend's objects", func(t *testing.T) {
		watches := map[schema.GroupVersionResource]*eventLog{}
		for _, gvr := range []schema.GroupVersionResource{workspacesGVR, templatesGVR} {
			watches[gvr] = startViewerWatch(ctx, t, viewer, gvr)
		}
		// The initial state: one ADDED per Operator backend object.
		for gvr, want := range map[schema.GroupVersionResource][]string{workspacesGVR: wantWorkspaces, templatesGVR: wantTemplates} {
			for _, key := range want {
				watches[gvr].wait(t, 60*time.Second, fmt.Sprintf("ADDED %s", key), func(ev watch.Event, k string) bool { return ev.Type == watch.Added && k == key })
			}
		}

		// Changes in the Mapped backend: the admin relabels a template and
		// deletes another; Coder stops a workspace.
		s.must(t, "label", "ctpl", "coder.dev-tpl", "-n", s.ns, "example.com/relabeled=yes")
		s.must(t, "delete", "ctpl", "coder.doomed-tpl", "-n", s.ns, "--timeout=90s")
		s.coderCLI(t, "stop", "dev-ws", "--yes")
		if _, err := s.coder.Client.TemplateByName(ctx, s.coder.OrganizationID, "doomed-tpl"); err == nil {
			t.Errorf("coderd still has template doomed-tpl after the admin deleted it")
		}
		// Then a change in the Operator backend, which the viewer sees.
		s.must(t, "label", "ctpl", "coder.ops-tpl", "-n", ops, "example.com/relabeled=yes")
		s.must(t, "label", "cws", "coder.admin.ops-ws", "-n", ops, "example.com/relabeled=yes")
		for gvr, key := range map[schema.GroupVersionResource]string{templatesGVR: wantTemplates[0], workspacesGVR: wantWorkspaces[0]} {
			watches[gvr].wait(t, 60*time.Second, "MODIFIED "+key+" with label example.com/relabeled", func(ev watch.Event, k string) bool {
				return ev.Type == watch.Modified && k == key && ev.Object.(*unstructured.Unstructured).GetLabels()["example.com/relabeled"] == "yes"
			})
		}
		// A few more polls of both coderds, for anything late.
		time.Sleep(3 * s.watchPollInterval())

		for gvr, log := range watches {
			added := map[string]int{}
			for _, ev := range log.all() {
				u, _ := ev.Object.(*unstructured.Unstructured)
				key := ""
				if u != nil {
					key = strings.TrimPrefix(u.GetNamespace()+"/"+u.GetName(), "/")
				}
				switch {
				case ev.Type == watch.Error:
					t.Errorf("the viewer's watch of %s ended in an error: %v", gvr.Resource, ev.Object)
				case ev.Type == watch.Bookmark && (u == nil || u.GetName() != "" || u.GetNamespace() != ""):
					t.Errorf("the viewer's watch of %s sent a bookmark naming %q", gvr.Resource, key)
				case ev.Type != watch.Bookmark && (u == nil || u.GetNamespace() != ops):
					t.Errorf("the viewer's watch of %s sent %s %s, an object it may not read", gvr.Resource, ev.Type, key)
				case ev.Type == watch.Added:
					added[key]++
				}
			}
			for key, n := range added {
				if n != 1 {
					t.Errorf("the viewer's watch of %s sent ADDED %s %d times, want once", gvr.Resource, key, n)
				}
			}
			if w := warning(gvr.Resource); !slices.Contains(log.warnings.all(), w) {
				t.Errorf("the viewer's WATCH of %s: Warning headers %q, want %q", gvr.Resource, log.warnings.all(), w)
			}
		}
	})
}

// adoptOperatorControlPlane creates CoderControlPlane ns/coder in identity
// mode Operator adopting coder with its first user's token, and waits for
// its operator access.
func adoptOperatorControlPlane(t *testing.T, s *aggStack, ns string, coder *testenv.Coder) {
	t.Helper()
	ctx := context.Background()
	if err := s.k.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: ownerSecret, Namespace: ns}, Data: map[string][]byte{"token": []byte(coder.SessionToken)}}
	ccp := &coderv1alpha1.CoderControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: "coder", Namespace: ns},
		Spec: coderv1alpha1.CoderControlPlaneSpec{
			ExternalURL:    coder.URL.String(),
			Identity:       coderv1alpha1.IdentitySpec{Mode: "Operator"},
			OperatorAccess: coderv1alpha1.OperatorAccessSpec{OwnerTokenSecretRef: &coderv1alpha1.SecretKeyReference{Name: ownerSecret, Key: "token"}},
		},
	}
	if err := s.c.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	if err := s.c.Create(ctx, ccp); err != nil {
		t.Fatal(err)
	}
	waitOperatorAccess(t, s, ns, "coder", coder.URL.String(), 60*time.Second)
}

// clusterViewerConfig creates ServiceAccount viewers/viewer bound to the
// built-in ClusterRole view across the cluster, waits until view lets it
// list coderworkspaces and codertemplates in every namespace (once
// kube-controller-manager has aggregated the chart's rules into it), and
// returns a client configuration with a token of it.
func clusterViewerConfig(t *testing.T, s *aggStack) *rest.Config {
	t.Helper()
	ctx := context.Background()
	if err := s.k.EnsureNamespace(ctx, viewerNamespace); err != nil {
		t.Fatal(err)
	}
	if err := s.c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: viewerName, Namespace: viewerNamespace}}); err != nil {
		t.Fatal(err)
	}
	if err := s.c.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "cluster-viewer"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: viewerName, Namespace: viewerNamespace}},
	}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, func() error {
		for _, resource := range []string{"coderworkspaces", "codertemplates"} {
			for _, verb := range []string{"list", "watch", "get"} {
				sar, err := s.k.Clientset.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
					User: viewerUser, Groups: serviceAccountGroups(viewerUser),
					ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Group: aggv1.GroupName, Resource: resource},
				}}, metav1.CreateOptions{})
				if err != nil {
					return err
				}
				if !sar.Status.Allowed {
					return errNotYet(fmt.Sprintf("ClusterRole view does not let %s %s %s yet: %s", viewerUser, verb, resource, sar.Status.Reason))
				}
			}
		}
		return nil
	})
	cfg := rest.AnonymousClientConfig(s.k.Config)
	cfg.BearerToken = serviceAccountToken(t, s, viewerNamespace, viewerName)
	return cfg
}

// viewerList lists gvr as cfg in namespace ns ("" for every namespace)
// and returns the items and the answer's Warning headers.
func viewerList(ctx context.Context, t *testing.T, cfg *rest.Config, gvr schema.GroupVersionResource, ns string) ([]unstructured.Unstructured, []string) {
	t.Helper()
	rec := &warningRecorder{}
	cfg = rest.CopyConfig(cfg)
	cfg.WarningHandler = rec
	l, err := dynamicFor(t, cfg).Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("the viewer lists %s (namespace %q): %v", gvr.Resource, ns, err)
	}
	return l.Items, rec.all()
}

// eventLog keeps every event of one watch, and the Warning headers of the
// watch request.
type eventLog struct {
	mu       sync.Mutex
	events   []watch.Event
	warnings *warningRecorder
}

// startViewerWatch watches gvr across namespaces as cfg from the current
// state (an ADDED event per object first), with bookmarks, until the test
// ends.
func startViewerWatch(ctx context.Context, t *testing.T, cfg *rest.Config, gvr schema.GroupVersionResource) *eventLog {
	t.Helper()
	log := &eventLog{warnings: &warningRecorder{}}
	cfg = rest.CopyConfig(cfg)
	cfg.WarningHandler = log.warnings
	w, err := dynamicFor(t, cfg).Resource(gvr).Watch(ctx, metav1.ListOptions{AllowWatchBookmarks: true})
	if err != nil {
		t.Fatalf("the viewer watches %s: %v", gvr.Resource, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			log.mu.Lock()
			log.events = append(log.events, ev)
			log.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		w.Stop()
		<-done
	})
	return log
}

func (l *eventLog) all() []watch.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// wait waits for an event ok accepts (given the event and its object's
// namespace/name).
func (l *eventLog) wait(t *testing.T, timeout time.Duration, what string, ok func(watch.Event, string) bool) {
	t.Helper()
	testenv.WaitFor(t, timeout, func() error {
		var seen []string
		for _, ev := range l.all() {
			key := ""
			if u, isObj := ev.Object.(*unstructured.Unstructured); isObj {
				key = strings.TrimPrefix(u.GetNamespace()+"/"+u.GetName(), "/")
			}
			if ok(ev, key) {
				return nil
			}
			seen = append(seen, string(ev.Type)+" "+key)
		}
		return errNotYet(fmt.Sprintf("no event %s; the watch sent %v", what, seen))
	})
}

// sortedNames are the namespace/name of items, sorted.
func sortedNames(items []unstructured.Unstructured) []string {
	out := itemNames(items)
	sort.Strings(out)
	return out
}
