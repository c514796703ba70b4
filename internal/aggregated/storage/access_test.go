package storage

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/go-logr/logr/testr"
	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/authentication/user"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/warning"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/identity"
	"github.com/coder/coder-k8s/internal/testenv"
)

// The access tests run the storages with an identity service against one
// real coderd seen through three backends, each behind a counting proxy:
// namespace "mapped" (identity mode Mapped), "operator" (Operator) and
// "flaky" (Operator, whose proxy the tests make hang).
const (
	nsMapped   = "mapped"
	nsOperator = "operator"
	nsFlaky    = "flaky"

	gcUser     = "system:serviceaccount:kube-system:generic-garbage-collector"
	argoUser   = "system:serviceaccount:argocd:argocd-application-controller"
	flakyLimit = 3 * time.Second
)

type accessStack struct {
	coder   *testenv.Coder
	proxies map[string]*testenv.CountingProxy
	wss     *WorkspaceStorage
	tpls    *TemplateStorage
	org     string
	// templates are the names of the templates pushed, sorted.
	templates []string
}

func newAccessStack(t *testing.T, templates int) *accessStack {
	t.Helper()
	ctx := context.Background()
	// Rate limits off: pushing the templates uploads more files a minute than coderd allows.
	c := testenv.NewCoder(t, testenv.CoderOptions{ProvisionerTypes: []codersdk.ProvisionerType{codersdk.ProvisionerTypeEcho}, DisableRateLimits: true})
	org, err := c.Client.Organization(ctx, c.OrganizationID)
	if err != nil {
		t.Fatal(err)
	}
	st := &accessStack{coder: c, proxies: map[string]*testenv.CountingProxy{}, org: org.Name}
	for _, u := range []struct {
		name  string
		roles []string
	}{{"alice", nil}, {"bob", nil}, {"tadmin", []string{codersdk.RoleTemplateAdmin}}} {
		if _, err := c.Client.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{
			Email: u.name + "@example.com", Username: u.name, Password: "SomeSecurePassword!1",
			OrganizationIDs: []uuid.UUID{c.OrganizationID},
		}); err != nil {
			t.Fatalf("create user %s: %v", u.name, err)
		}
		if len(u.roles) > 0 {
			if _, err := c.Client.UpdateUserRoles(ctx, u.name, codersdk.UpdateRoles{Roles: u.roles}); err != nil {
				t.Fatalf("roles of %s: %v", u.name, err)
			}
		}
	}
	var tpl codersdk.Template
	for i := range templates {
		name := fmt.Sprintf("tpl-%02d", i)
		if tpl, err = c.PushEchoTemplate(ctx, name); err != nil {
			t.Fatal(err)
		}
		st.templates = append(st.templates, name)
	}
	for _, owner := range []string{"alice", c.Username} {
		ws, err := c.Client.CreateUserWorkspace(ctx, owner, codersdk.CreateWorkspaceRequest{TemplateID: tpl.ID, Name: owner + "-ws"})
		if err != nil {
			t.Fatalf("workspace of %s: %v", owner, err)
		}
		if _, err := c.WaitBuild(ctx, ws.LatestBuild.ID); err != nil {
			t.Fatal(err)
		}
	}

	var backends []backend.Backend
	for _, ns := range []string{nsFlaky, nsMapped, nsOperator} {
		p := testenv.NewCountingProxy(t, c.URL)
		st.proxies[ns] = p
		timeout := 30 * time.Second
		if ns != nsOperator {
			// The tests make these hang.
			timeout = flakyLimit
		}
		rules := identity.Rules{Mode: identity.ModeOperator, MatchField: identity.MatchUsername}
		if ns == nsMapped {
			rules.Mode = identity.ModeMapped
		}
		backends = append(backends, backend.Backend{Namespace: ns, ControlPlane: "coder", URL: p.URL, Identity: rules,
			Client: coderapi.NewClient(p.URL, c.SessionToken, timeout, coderapi.Target{})})
	}
	ident := identity.New(testr.New(t), identity.Options{ClusterControllers: []string{gcUser}})
	runCtx, cancel := context.WithCancel(ctx)
	o := Options{Backends: fxProvider{backends: backends}, PollInterval: 300 * time.Millisecond, Log: testr.New(t), Identity: ident}
	if st.wss, err = NewWorkspaces(o); err != nil {
		t.Fatal(err)
	}
	if st.tpls, err = NewTemplates(o, TemplateOptions{}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = ident.Run(runCtx) })
	wg.Go(func() { st.wss.Run(runCtx) })
	wg.Go(func() { st.tpls.Run(runCtx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return st
}

// warningsSeen records the Warning headers a request adds.
type warningsSeen struct {
	mu   sync.Mutex
	text []string
}

func (w *warningsSeen) AddWarning(_, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.text = append(w.text, text)
}

func (w *warningsSeen) all() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.text, "\n")
}

// as is a request context of Kubernetes user name in namespace ns ("" for
// every namespace), recording warnings into seen.
func as(name, ns string, seen *warningsSeen) context.Context {
	ctx := genericapirequest.WithUser(context.Background(), &user.DefaultInfo{Name: name})
	if ns != "" {
		ctx = genericapirequest.WithNamespace(ctx, ns)
	}
	if seen != nil {
		ctx = warning.WithWarningRecorder(ctx, seen)
	}
	return ctx
}

// listedBy returns what turns a list's answer into "namespace/name" of
// its items, sorted.
func listedBy(t *testing.T) func(obj runtime.Object, err error) []string {
	return func(obj runtime.Object, err error) []string { t.Helper(); return listNames(t, obj, err) }
}

func listNames(t *testing.T, obj runtime.Object, err error) []string {
	t.Helper()
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	var out []string
	switch l := obj.(type) {
	case *workspaceList:
		for _, i := range l.Items {
			out = append(out, i.Namespace+"/"+i.Name)
		}
	case *templateList:
		for _, i := range l.Items {
			out = append(out, i.Namespace+"/"+i.Name)
		}
	default:
		t.Fatalf("list of %T", obj)
	}
	sort.Strings(out)
	return out
}

// mustEvent returns the next event within d.
func mustEvent(t *testing.T, w watch.Interface, d time.Duration) watch.Event {
	t.Helper()
	ev, ok := nextPollEvent(w, d)
	if !ok {
		t.Fatalf("no event within %s", d)
	}
	return ev
}

func (st *accessStack) wsName(owner string) string { return st.org + "." + owner + "." + owner + "-ws" }

func (st *accessStack) authchecks(ns string) int64 {
	return st.proxies[ns].Stats()["POST /api/v2/authcheck"].Requests
}

func TestAccess(t *testing.T) {
	const templates = 25
	st := newAccessStack(t, templates)
	admin, adminWS, aliceWS := st.coder.Username, st.wsName(st.coder.Username), st.wsName("alice")
	all := &metainternalversion.ListOptions{}

	t.Run("unmapped reader lists nothing of the mapped backend, with a warning", func(t *testing.T) {
		var seen warningsSeen
		got := listedBy(t)(st.wss.List(as(argoUser, "", &seen), all))
		want := []string{nsFlaky + "/" + adminWS, nsFlaky + "/" + aliceWS, nsOperator + "/" + adminWS, nsOperator + "/" + aliceWS}
		if !slices.Equal(got, want) {
			t.Errorf("listed %v, want %v", got, want)
		}
		wantWarn := fmt.Sprintf("Kubernetes user %q is a system user, which maps to a Coder user only through an explicit mapping (spec.identity.mappings): no coderworkspaces of control plane mapped/coder are shown", argoUser)
		if seen.all() != wantWarn {
			t.Errorf("warnings %q, want %q", seen.all(), wantWarn)
		}
		seen = warningsSeen{}
		if got := listedBy(t)(st.wss.List(as(argoUser, nsMapped, &seen), all)); len(got) != 0 {
			t.Errorf("namespaced list shows %v", got)
		}
		if seen.all() != wantWarn {
			t.Errorf("namespaced warnings %q, want %q", seen.all(), wantWarn)
		}
	})

	t.Run("a read the caller may not make is the 404 of an object that does not exist", func(t *testing.T) {
		_, missing := st.wss.Get(as("alice", nsMapped, nil), st.org+".alice.nothing-here", &metav1.GetOptions{})
		for _, c := range []struct{ who, name string }{{"alice", adminWS}, {argoUser, aliceWS}, {argoUser, st.org + ".alice.nothing-here"}} {
			_, err := st.wss.Get(as(c.who, nsMapped, nil), c.name, &metav1.GetOptions{})
			want := fmt.Sprintf("coderworkspaces.aggregation.coder.com %q not found", c.name)
			if !apierrors.IsNotFound(err) || err.Error() != want {
				t.Errorf("%s GET %s: %v, want %q", c.who, c.name, err, want)
			}
		}
		if missing == nil || missing.Error() != fmt.Sprintf("coderworkspaces.aggregation.coder.com %q not found", st.org+".alice.nothing-here") {
			t.Errorf("alice GET of a missing workspace: %v", missing)
		}
	})

	t.Run("an unmapped writer is refused naming why", func(t *testing.T) {
		_, _, err := st.wss.Delete(as(argoUser, nsMapped, nil), aliceWS, nil, &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "is a system user, which maps to a Coder user only through an explicit mapping") {
			t.Errorf("delete: %v", err)
		}
	})

	t.Run("a member's reads and writes are what coderd allows them", func(t *testing.T) {
		ctx := as("alice", nsMapped, nil)
		dryDelete := &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}
		if _, _, err := st.wss.Delete(ctx, aliceWS, nil, dryDelete); err != nil {
			t.Errorf("alice deletes her workspace (dry run): %v", err)
		}
		if _, _, err := st.wss.Delete(ctx, adminWS, nil, dryDelete); !apierrors.IsNotFound(err) {
			t.Errorf("alice deletes the admin's workspace (dry run): %v, want 404", err)
		}
		tpl := st.org + "." + st.templates[0]
		got, err := st.tpls.Get(ctx, tpl, &metav1.GetOptions{})
		if err != nil || got.(*aggv1.CoderTemplate).Spec.Files != nil {
			t.Errorf("alice gets %s: %v (files shown: %v), want it without files", tpl, err, err == nil && got.(*aggv1.CoderTemplate).Spec.Files != nil)
		}
		_, _, err = st.tpls.Delete(ctx, tpl, nil, dryDelete)
		want := `Coder user "alice" may not delete it in control plane mapped/coder`
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("alice deletes %s (dry run): %v, want 403 %q", tpl, err, want)
		}
		_, err = st.tpls.Create(ctx, &aggv1.CoderTemplate{ObjectMeta: metav1.ObjectMeta{Name: st.org + ".alices"},
			Spec: aggv1.CoderTemplateSpec{Files: map[string]string{"main.tf": "# nothing\n"}}}, nil, &metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		want = `Coder user "alice" may not create it in control plane mapped/coder`
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("alice creates a template (dry run): %v, want 403 %q", err, want)
		}
		if got, err := st.tpls.Get(as("tadmin", nsMapped, nil), tpl, &metav1.GetOptions{}); err != nil || got.(*aggv1.CoderTemplate).Spec.Files == nil {
			t.Errorf("tadmin gets %s: %v, want it with its files", tpl, err)
		}
	})

	t.Run("a member lists what coderd shows them; template files only for template admins, checked in batches", func(t *testing.T) {
		got := listedBy(t)(st.wss.List(as("alice", nsMapped, nil), all))
		if !slices.Equal(got, []string{nsMapped + "/" + aliceWS}) {
			t.Errorf("alice lists %v", got)
		}
		before := st.authchecks(nsMapped)
		obj, err := st.tpls.List(as("alice", nsMapped, nil), &metainternalversion.ListOptions{ResourceVersion: "0"})
		if n := len(listedBy(t)(obj, err)); n != templates {
			t.Errorf("alice lists %d templates, want %d", n, templates)
		}
		// One request for the organization-wide checks, then the
		// templates by ID, 10 per request.
		if n := st.authchecks(nsMapped) - before; n > int64(1+(templates+9)/10) {
			t.Errorf("alice's template list cost %d authorization requests, want at most %d", n, 1+(templates+9)/10)
		}
		for _, i := range obj.(*templateList).Items {
			if i.Spec.Files != nil {
				t.Errorf("alice sees the files of %s", i.Name)
			}
		}
		obj, err = st.tpls.List(as("tadmin", nsMapped, nil), all)
		listedBy(t)(obj, err)
		for _, i := range obj.(*templateList).Items {
			if i.Spec.Files == nil {
				t.Errorf("tadmin does not see the files of %s", i.Name)
			}
		}
	})

	t.Run("a new watch's initial events cost a tenth of its objects in checks", func(t *testing.T) {
		// bob has read nothing yet: every answer is asked of coderd.
		before := st.authchecks(nsMapped)
		w, err := st.tpls.Watch(as("bob", nsMapped, nil), &metainternalversion.ListOptions{ResourceVersion: "0"})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		for i := range templates {
			ev := mustEvent(t, w, 10*time.Second)
			if ev.Type != watch.Added {
				t.Fatalf("event %d: %s", i, ev.Type)
			}
			if ev.Object.(*aggv1.CoderTemplate).Spec.Files != nil {
				t.Errorf("bob's watch shows files of %s", ev.Object.(*aggv1.CoderTemplate).Name)
			}
		}
		// One request for the organization-wide checks, then the
		// templates by ID, 10 per request.
		if n, want := st.authchecks(nsMapped)-before, int64(1+(templates+9)/10); n != want {
			t.Errorf("the initial events cost %d authorization requests, want %d", n, want)
		}
	})

	t.Run("a change to a listed object arrives as MODIFIED", func(t *testing.T) {
		obj, err := st.wss.List(as(admin, nsMapped, nil), all)
		if err != nil {
			t.Fatal(err)
		}
		rv := obj.(*workspaceList).ResourceVersion
		w, err := st.wss.Watch(as(admin, nsMapped, nil), &metainternalversion.ListOptions{ResourceVersion: rv})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		if _, err := st.coder.StopWorkspace(context.Background(), admin+"-ws"); err != nil {
			t.Fatal(err)
		}
		ev := mustEvent(t, w, 20*time.Second)
		if ev.Type != watch.Modified || ev.Object.(*aggv1.CoderWorkspace).Name != adminWS {
			t.Errorf("got %s %v, want MODIFIED %s", ev.Type, ev.Object, adminWS)
		}
	})

	t.Run("an unmapped watcher gets no object of the mapped backend", func(t *testing.T) {
		w, err := st.tpls.Watch(as(argoUser, "", nil), &metainternalversion.ListOptions{ResourceVersion: "0"})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		for range 2 * templates {
			ev := mustEvent(t, w, 10*time.Second)
			if ns := ev.Object.(*aggv1.CoderTemplate).Namespace; ns == nsMapped {
				t.Fatalf("%s event of %s/%s", ev.Type, ns, ev.Object.(*aggv1.CoderTemplate).Name)
			}
		}
		select {
		case ev := <-w.ResultChan():
			t.Errorf("more events than the two Operator backends' templates: %s %v", ev.Type, ev.Object)
		case <-time.After(time.Second):
		}
	})

	t.Run("the cluster's controllers read everything without restricted fields and may only delete and relabel", func(t *testing.T) {
		obj, err := st.tpls.List(as(gcUser, nsMapped, nil), all)
		if n := len(listedBy(t)(obj, err)); n != templates {
			t.Errorf("the GC lists %d templates, want %d", n, templates)
		}
		for _, i := range obj.(*templateList).Items {
			if i.Spec.Files != nil {
				t.Errorf("the GC sees the files of %s", i.Name)
			}
		}
		if got := listedBy(t)(st.wss.List(as(gcUser, nsMapped, nil), all)); len(got) != 2 {
			t.Errorf("the GC lists workspaces %v", got)
		}
		ctx := as(gcUser, nsMapped, nil)
		dry := &metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
		out, _, err := st.wss.Update(ctx, aliceWS, rest.DefaultUpdatedObjectInfo(nil, func(_ context.Context, _, old runtime.Object) (runtime.Object, error) {
			ws := old.(*aggv1.CoderWorkspace).DeepCopy()
			ws.Labels["gc-was-here"] = "yes"
			return ws, nil
		}), nil, nil, false, dry)
		if err != nil || out.(*aggv1.CoderWorkspace).Labels["gc-was-here"] != "yes" {
			t.Errorf("a label change by the GC: %v", err)
		}
		_, _, err = st.wss.Update(ctx, aliceWS, rest.DefaultUpdatedObjectInfo(nil, func(_ context.Context, _, old runtime.Object) (runtime.Object, error) {
			ws := old.(*aggv1.CoderWorkspace).DeepCopy()
			ws.Spec.Running = !ws.Spec.Running
			return ws, nil
		}), nil, nil, false, dry)
		want := fmt.Sprintf("Kubernetes user %q is one of the cluster's controllers (aggregatedAPIServer.identity.clusterControllers), which act as coder-k8s in control plane mapped/coder only to read, delete and change Kubernetes metadata, not to change the CoderWorkspace's spec", gcUser)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("a spec change by the GC: %v, want 403 %q", err, want)
		}
		if _, _, err := st.wss.Delete(ctx, aliceWS, nil, &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Errorf("a delete by the GC: %v", err)
		}
	})

	t.Run("a hung coderd answers as last seen across namespaces and 503 in its own", func(t *testing.T) {
		ctx := as(admin, "", nil)
		if _, err := st.wss.List(ctx, all); err != nil {
			t.Fatal(err)
		}
		p := st.proxies[nsFlaky]
		p.SetDelay(time.Hour)
		defer p.SetDelay(0)
		// The first list finds it hanging (after the client's timeout).
		var seen warningsSeen
		got := listedBy(t)(st.wss.List(as(admin, "", &seen), all))
		if len(got) != 6 {
			t.Errorf("listed %v, want the six workspaces of three backends", got)
		}
		start := time.Now()
		seen = warningsSeen{}
		got = listedBy(t)(st.wss.List(as(admin, "", &seen), all))
		// A list that waited for the hung coderd would take its client's
		// whole timeout; the bound is that, not a guess at the machine's
		// speed (under load a list alone has taken 2.3 s here).
		if took := time.Since(start); took >= flakyLimit {
			t.Errorf("a list with the hung coderd known took %s: it waited for the hung coderd (its client gives up after %s)", took, flakyLimit)
		}
		if len(got) != 6 {
			t.Errorf("listed %v, want the six workspaces of three backends", got)
		}
		if w := seen.all(); !strings.Contains(w, "the coderd of control plane flaky/coder is unreachable since ") || !strings.Contains(w, p.URL.Host) ||
			!strings.HasSuffix(w, ": its coderworkspaces are shown as last seen") {
			t.Errorf("warning %q", w)
		}
		_, err := st.wss.List(as(admin, nsFlaky, nil), all)
		if !apierrors.IsServiceUnavailable(err) {
			t.Errorf("a list of the hung coderd's namespace: %v, want 503", err)
		}
		if code := apierrors.ReasonForError(err); code != metav1.StatusReasonServiceUnavailable || !strings.Contains(err.Error(), "unreachable") {
			t.Errorf("%s: %v", code, err)
		}
	})

	t.Run("while a mapped coderd hangs a member keeps seeing what they saw, from coderd's last answers", func(t *testing.T) {
		want := listedBy(t)(st.wss.List(as("alice", "", nil), all))
		if !slices.Contains(want, nsMapped+"/"+aliceWS) {
			t.Fatalf("alice lists %v, without her workspace in the mapped backend", want)
		}
		p := st.proxies[nsMapped]
		p.SetDelay(time.Hour)
		defer p.SetDelay(0)
		// Past the time coderd's answers are used without asking again.
		time.Sleep(11 * time.Second)
		_, _ = st.wss.List(as("alice", "", nil), all) // finds it hanging
		var seen warningsSeen
		start := time.Now()
		got := listedBy(t)(st.wss.List(as("alice", "", &seen), all))
		if took := time.Since(start); took >= flakyLimit {
			t.Errorf("the list took %s with the hung coderd known: it waited for the hung coderd (its client gives up after %s)", took, flakyLimit)
		}
		if !slices.Equal(got, want) {
			t.Errorf("alice lists %v while the mapped coderd hangs, want %v as before", got, want)
		}
		if w := seen.all(); !strings.HasPrefix(w, "the coderd of control plane mapped/coder is unreachable since ") || !strings.HasSuffix(w, ": its coderworkspaces are shown as last seen") {
			t.Errorf("warning %q", w)
		}
	})

	t.Run("a read in one namespace asks its coderd even while the coderd's last poll failed", func(t *testing.T) {
		// Someone who has read nothing yet: no answer of coderd's is
		// remembered for them, so every read below must ask coderd.
		if _, err := st.coder.Client.CreateUserWithOrgs(context.Background(), codersdk.CreateUserRequestWithOrgs{
			Email: "carol@example.com", Username: "carol", Password: "SomeSecurePassword!1",
			OrganizationIDs: []uuid.UUID{st.coder.OrganizationID},
		}); err != nil {
			t.Fatal(err)
		}
		// Polls that failed (coderd slow or not yet reachable, as when a
		// control plane has just come up): the poller backs off for
		// seconds before it lists again, coderd answering meanwhile.
		key := nsMapped + "/coder"
		for range 6 {
			st.tpls.cache.ListFailed(key, errors.New("a poll that failed"))
		}
		tpl := st.org + "." + st.templates[0]
		if _, err := st.tpls.Get(as("carol", nsMapped, nil), tpl, &metav1.GetOptions{}); err != nil {
			t.Errorf("carol gets %s: %v, want it", tpl, err)
		}
		if _, down := st.tpls.cache.Outage(key); !down {
			t.Fatal("a poll ended the outage before the GET was answered: it did not run while the outage lasted")
		}
		if got := listedBy(t)(st.tpls.List(as("carol", nsMapped, nil), &metainternalversion.ListOptions{})); len(got) != len(st.templates) {
			t.Errorf("carol lists %v in %s, want its %d templates", got, nsMapped, len(st.templates))
		}
	})
}
