package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

// Tunables of BenchmarkSharedCluster.
const (
	// sharedWorkspaces is how many workspaces each of the two coderds
	// holds.
	sharedWorkspaces = 150
	// sharedTemplates is how many templates the member's new watch
	// receives.
	sharedTemplates = 300
	// sharedLists all-namespaces LISTs per reader are timed in each phase,
	// after sharedWarmup.
	sharedLists  = 21
	sharedWarmup = 3
	// sharedHungNS is the namespace of the control plane whose coderd
	// stops answering.
	sharedHungNS = "coder-b"
	// sharedMember is the member's Kubernetes user, mapped by email.
	sharedMember = "member@example.com"
	// sharedRecovery bounds the wait for lists to stop warning once the
	// hung coderd answers again.
	sharedRecovery = 20 * time.Second
)

// BenchmarkSharedCluster measures what issue 28 asks of a shared cluster,
// with the shipped binary in its default configuration (identity mode
// Mapped, 30 s coderd request timeout, 5 s poll interval), each figure
// against a reference taken in the same run:
//
//   - two control planes in two namespaces, each adopting its own coderd
//     (one PostgreSQL) through its own counting proxy, with
//     sharedWorkspaces echo-built workspaces each: the median
//     all-namespaces LIST through kube-apiserver with the proxy of
//     coder-b holding every request (a hung coderd), once the operator
//     knows it fails, against the median with both up, same HTTP client
//     (target ≤ 1.2). Measured as system:kube-controller-manager (a
//     cluster controller: every cluster's garbage collector lists so),
//     whose hung-phase lists must hold every object, the hung coderd's as
//     last seen, and a Warning naming it; and as the admin mapped to
//     Coder's owner, whose missing objects are a figure (target 0);
//   - a member's new watch of sharedTemplates templates in Mapped mode
//     (sendInitialEvents): the POST /api/v2/authcheck requests coderd gets
//     until the initial-events-end bookmark (target ≤ 31), against
//     ceil(sharedTemplates/10), coderd's limit of 10 resource IDs per
//     request.
//
// Run it with:
//
//	make bench-shared   # -bench '^BenchmarkSharedCluster$'
func BenchmarkSharedCluster(b *testing.B) {
	echo := testenv.CoderOptions{ProvisionerTypes: []codersdk.ProvisionerType{codersdk.ProvisionerTypeEcho}}
	// coder/coder adopts coderd through st.proxy, which counts the
	// authorization checks.
	st := newBenchStack(b, 0, withCoderdProxy(true), withCoder(echo))
	other := testenv.NewCoder(b, testenv.CoderOptions{Postgres: st.coder.Postgres, ProvisionerTypes: echo.ProvisionerTypes})
	otherProxy := testenv.NewCountingProxy(b, other.URL)
	createAdoptingControlPlane(b, st.aggStack, sharedHungNS, "coder", otherProxy.URL.String(), other.SessionToken)
	waitOperatorAccess(b, st.aggStack, sharedHungNS, "coder", otherProxy.URL.String(), 60*time.Second)
	seedShared(b, st.coder, other)

	b.ResetTimer()
	st.sharedList(b, otherProxy)
	st.sharedWatch(b)
	b.StopTimer()
}

// sharedTemplate is the Coder name of template i of the stack's coderd.
func sharedTemplate(i int) string { return fmt.Sprintf("shared-%03d", i) }

// seedShared creates, through coderd's API, sharedTemplates echo templates
// in coderd a and one in b, and sharedWorkspaces workspaces of the first
// template in each, both coderds at once.
func seedShared(b *testing.B, a, other *testenv.Coder) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	names := make([]string, sharedWorkspaces)
	for i := range names {
		names[i] = benchWorkspace(i)
	}
	start := time.Now()
	var g errgroup.Group
	g.Go(func() error {
		first, err := a.PushEchoTemplate(ctx, sharedTemplate(0))
		if err != nil {
			return err
		}
		if err := pushEchoTemplates(ctx, a, first, sharedTemplates); err != nil {
			return err
		}
		_, err = a.CreateWorkspaces(ctx, first, names, nil)
		return err
	})
	g.Go(func() error {
		tpl, err := other.PushEchoTemplate(ctx, "shared-b")
		if err != nil {
			return err
		}
		_, err = other.CreateWorkspaces(ctx, tpl, names, nil)
		return err
	})
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	fmt.Printf("seeding: %d templates and %d workspaces in coderd a, %d workspaces in coderd b, built by the echo provisioner in %s\n",
		sharedTemplates, sharedWorkspaces, sharedWorkspaces, time.Since(start).Round(time.Second))
}

// pushEchoTemplates creates templates 1..n-1 from the archive of first's
// version: coderd allows 12 uploads a minute, one version per template
// is enough.
func pushEchoTemplates(ctx context.Context, c *testenv.Coder, first codersdk.Template, n int) error {
	v, err := c.Client.TemplateVersion(ctx, first.ActiveVersionID)
	if err != nil {
		return err
	}
	return testenv.Parallel(n-1, 5, func(i int) error {
		name := sharedTemplate(i + 1)
		version, err := c.Client.CreateTemplateVersion(ctx, c.OrganizationID, codersdk.CreateTemplateVersionRequest{
			StorageMethod: codersdk.ProvisionerStorageMethodFile, FileID: v.Job.FileID, Provisioner: codersdk.ProvisionerTypeEcho})
		if err != nil {
			return fmt.Errorf("template %s: create version: %w", name, err)
		}
		for version.Job.Status != codersdk.ProvisionerJobSucceeded {
			switch version.Job.Status {
			case codersdk.ProvisionerJobFailed, codersdk.ProvisionerJobCanceled:
				return fmt.Errorf("template %s: version import %s: %s", name, version.Job.Status, version.Job.Error)
			}
			time.Sleep(100 * time.Millisecond)
			if version, err = c.Client.TemplateVersion(ctx, version.ID); err != nil {
				return fmt.Errorf("template %s: %w", name, err)
			}
		}
		if _, err := c.Client.CreateTemplate(ctx, c.OrganizationID, codersdk.CreateTemplateRequest{Name: name, VersionID: version.ID}); err != nil {
			return fmt.Errorf("template %s: create: %w", name, err)
		}
		return nil
	})
}

// sharedReader is one Kubernetes user listing every namespace's
// workspaces, with its own HTTP client, and its timings.
type sharedReader struct {
	name      string
	hc        *http.Client
	ref, hung []time.Duration
	// missing is the most objects a hung-phase list lacked; warnings the
	// distinct Warning headers of the hung phase.
	missing  int
	warnings []string
}

// sharedList times all-namespaces LISTs with both coderds up, then with
// coder-b's proxy holding every request.
func (st *benchStack) sharedList(b *testing.B, otherProxy *testenv.CountingProxy) {
	b.Helper()
	var readers []*sharedReader
	for _, u := range []string{"system:kube-controller-manager", "admin"} {
		cfg := st.k.Config
		if u != "admin" {
			var err error
			if cfg, err = st.k.UserConfig(u); err != nil {
				b.Fatal(err)
			}
		}
		readers = append(readers, &sharedReader{name: u, hc: st.httpClientFor(b, cfg, "", "", "")})
	}
	controller, owner := readers[0], readers[1]
	total := 2 * sharedWorkspaces

	// Every object, read from both coderds.
	_, want, warns, err := sharedGet(controller.hc, st.listURL)
	if err != nil {
		b.Fatal(err)
	}
	if len(want) != total || len(warns) > 0 {
		b.Fatalf("%s's first list: %d workspaces, want %d; warnings %q", controller.name, len(want), total, warns)
	}
	for _, w := range want {
		if !strings.HasPrefix(w, benchNS+"/") && !strings.HasPrefix(w, sharedHungNS+"/") {
			b.Fatalf("%s's first list holds %s, outside namespaces %s and %s", controller.name, w, benchNS, sharedHungNS)
		}
	}

	// hung is false in the reference phase, true once coder-b hangs.
	round := func(i int, hung bool) {
		order := readers
		if i%2 == 1 {
			order = []*sharedReader{owner, controller}
		}
		for _, r := range order {
			d, got, warns, err := sharedGet(r.hc, st.listURL)
			if err != nil {
				b.Fatalf("%s: %v\noperator log:\n%s", r.name, err, st.op.LogTail(30))
			}
			missing := len(want) - countIn(got, want)
			warned := slices.ContainsFunc(warns, func(w string) bool { return strings.Contains(w, sharedHungNS+"/") })
			switch {
			case !hung && (missing > 0 || len(warns) > 0):
				b.Fatalf("%s, both coderds up: %d of %d workspaces missing; warnings %q", r.name, missing, total, warns)
			case hung && r == controller && (missing > 0 || !warned):
				b.Fatalf("%s, coderd of %s hung: %d of %d workspaces missing, want none; warnings %q, want one naming %s\noperator log:\n%s",
					r.name, sharedHungNS, missing, total, warns, sharedHungNS, st.op.LogTail(30))
			case hung:
				r.missing = max(r.missing, missing)
				for _, w := range warns {
					if !slices.Contains(r.warnings, w) {
						r.warnings = append(r.warnings, w)
					}
				}
			}
			if i < sharedWarmup {
				continue
			}
			if hung {
				r.hung = append(r.hung, d)
			} else {
				r.ref = append(r.ref, d)
			}
		}
	}
	for i := range sharedWarmup + sharedLists {
		round(i, false)
	}

	// The operator learns that coder-b fails from the first list that
	// waits for it: coderd's request timeout.
	otherProxy.SetDelay(time.Hour)
	detect, got, warns, err := sharedGet(controller.hc, st.listURL)
	if err != nil {
		b.Fatalf("%s, first list after coderd of %s hung: %v\noperator log:\n%s", controller.name, sharedHungNS, err, st.op.LogTail(30))
	}
	if n := countIn(got, want); n != total || len(warns) == 0 {
		b.Fatalf("%s, first list after coderd of %s hung: %d of %d workspaces; warnings %q", controller.name, sharedHungNS, n, total, warns)
	}
	fmt.Printf("shared list: the first list after coderd of %s hung took %s; warning: %s\n", sharedHungNS, detect.Round(time.Millisecond), strings.Join(warns, " | "))
	for i := range sharedWarmup + sharedLists {
		round(i, true)
	}
	otherProxy.SetDelay(0)

	med := func(ds []time.Duration) float64 { return float64(percentile(ds, 50).Microseconds()) / 1000 }
	ratio := med(controller.hung) / med(controller.ref)
	ownerRatio := med(owner.hung) / med(owner.ref)
	b.ReportMetric(ratio, "hung-list-ratio")
	b.ReportMetric(med(controller.ref), "list-ms")
	b.ReportMetric(med(controller.hung), "hung-list-ms")
	b.ReportMetric(detect.Seconds(), "hung-detect-s")
	b.ReportMetric(ownerRatio, "owner-hung-list-ratio")
	b.ReportMetric(med(owner.ref), "owner-list-ms")
	b.ReportMetric(med(owner.hung), "owner-hung-list-ms")
	b.ReportMetric(float64(owner.missing), "owner-hung-missing")
	b.ReportMetric(float64(total), "workspaces")
	fmt.Printf("hung list ratio=%.2f (target ≤ 1.2): all-namespaces LIST of %d workspaces in 2 coderds as %s, median %.1f ms with coderd of %s hung (every object, a warning naming it), %.1f ms with both up; %d lists each, same client\n",
		ratio, total, controller.name, med(controller.hung), sharedHungNS, med(controller.ref), sharedLists)
	fmt.Printf("owner hung list ratio=%.2f: the same LIST as %s (Mapped mode, Coder's owner), median %.1f ms hung, %.1f ms up; up to %d of %d workspaces missing with coderd of %s hung (target 0); warnings: %s\n",
		ownerRatio, owner.name, med(owner.hung), med(owner.ref), owner.missing, total, sharedHungNS, strings.Join(owner.warnings, " | "))

	st.sharedRecovery(b, controller)
}

// sharedRecovery shows, once the hung coderd answers again, how long
// all-namespaces lists keep answering it from the cache (no watch is
// open, so no poll asks it), and whether a list of its namespace alone
// ends that.
func (st *benchStack) sharedRecovery(b *testing.B, r *sharedReader) {
	b.Helper()
	warned := func(url string) bool {
		_, _, warns, err := sharedGet(r.hc, url)
		if err != nil {
			b.Fatalf("%s: %v", r.name, err)
		}
		return slices.ContainsFunc(warns, func(w string) bool { return strings.Contains(w, sharedHungNS+"/") })
	}
	start := time.Now()
	for warned(st.listURL) {
		if time.Since(start) > sharedRecovery {
			nsURL := strings.TrimSuffix(st.listURL, "coderworkspaces") + "namespaces/" + sharedHungNS + "/coderworkspaces"
			warned(nsURL)
			fmt.Printf("shared recovery: all-namespaces lists still answered coderd of %s from the cache %s after it answered again (no watch open); after one list of namespace %s alone they warn: %v\n",
				sharedHungNS, sharedRecovery, sharedHungNS, warned(st.listURL))
			return
		}
		time.Sleep(2 * time.Second)
	}
	fmt.Printf("shared recovery: all-namespaces lists stopped warning %s after coderd of %s answered again\n", time.Since(start).Round(100*time.Millisecond), sharedHungNS)
}

// sharedWatch counts the authorization checks a member's new watch of
// every template of the stack's control plane costs.
func (st *benchStack) sharedWatch(b *testing.B) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := st.coder.Client.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{
		Email: sharedMember, Username: "member", Password: "SomeSecurePassword!1",
		OrganizationIDs: []uuid.UUID{st.coder.OrganizationID}, UserLoginType: codersdk.LoginTypePassword,
	}); err != nil {
		b.Fatalf("create Coder user member: %v", err)
	}
	for _, o := range []client.Object{
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "template-reader", Namespace: benchNS},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{aggv1.GroupName}, Resources: []string{"codertemplates"}, Verbs: []string{"get", "list", "watch"}}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "member-reads-templates", Namespace: benchNS},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "template-reader"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: sharedMember}}},
	} {
		if err := st.c.Create(ctx, o); err != nil {
			b.Fatal(err)
		}
	}
	cfg, err := st.k.UserConfig(sharedMember)
	if err != nil {
		b.Fatal(err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 1000, 2000
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}

	// What an informer with WatchListClient sends: the current state as
	// ADDED events, then a bookmark marking their end.
	before := st.proxy.Stats()
	start := time.Now()
	w, err := dyn.Resource(templatesGVR).Namespace(benchNS).Watch(ctx, metav1.ListOptions{
		SendInitialEvents: new(true), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true})
	if err != nil {
		b.Fatalf("%s watches templates: %v", sharedMember, err)
	}
	defer w.Stop()
	added := map[string]bool{}
	for done := false; !done; {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				b.Fatalf("the member's watch ended after %d ADDED events, before the initial-events-end bookmark", len(added))
			}
			switch ev.Type {
			case watch.Added:
				if u, ok := ev.Object.(*unstructured.Unstructured); ok {
					added[u.GetName()] = true
				}
			case watch.Bookmark:
				u, ok := ev.Object.(*unstructured.Unstructured)
				done = ok && u.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true"
			case watch.Error:
				b.Fatalf("the member's watch: error event %v", ev.Object)
			default:
				b.Fatalf("the member's watch: %s event before the initial-events-end bookmark", ev.Type)
			}
		case <-ctx.Done():
			b.Fatalf("the member's watch: %d ADDED events and no initial-events-end bookmark within 5 minutes", len(added))
		}
	}
	elapsed := time.Since(start)
	got := st.proxy.Stats().Since(before)
	if len(added) != sharedTemplates {
		b.Fatalf("the member's watch sent %d templates as ADDED, want %d", len(added), sharedTemplates)
	}
	for i := range sharedTemplates {
		if name := st.org + "." + sharedTemplate(i); !added[name] {
			b.Fatalf("the member's watch did not send template %s", name)
		}
	}

	checks := got["POST /api/v2/authcheck"].Requests
	least := (sharedTemplates + 9) / 10
	ratio := float64(checks) / float64(least)
	b.ReportMetric(float64(checks), "watch-authchecks")
	b.ReportMetric(ratio, "watch-authcheck-ratio")
	b.ReportMetric(float64(sharedTemplates), "templates")
	b.ReportMetric(float64(least), "authcheck-least")
	fmt.Printf("watch authorization checks=%d (target ≤ %d), ratio=%.2f to ceil(%d/10)=%d: a member's new watch (sendInitialEvents) of %d templates in Mapped mode, initial events in %s; coderd requests meanwhile: %s\n",
		checks, least+1, ratio, sharedTemplates, least, sharedTemplates, elapsed.Round(time.Millisecond), got)
}

// sharedGet GETs a list as JSON with hc and times it until the body is
// read; it returns the items as namespace/name and the Warning headers.
func sharedGet(hc *http.Client, url string) (time.Duration, []string, []string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Accept", "application/json")
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("GET %s: %w", url, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(start)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("GET %s: read body: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, nil, nil, fmt.Errorf("GET %s: %s: %.500s", url, resp.Status, body)
	}
	var list struct {
		Items []metav1.PartialObjectMetadata `json:"items"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return 0, nil, nil, fmt.Errorf("GET %s: %w: %.300s", url, err, body)
	}
	items := make([]string, len(list.Items))
	for i, it := range list.Items {
		items[i] = it.Namespace + "/" + it.Name
	}
	return d, items, resp.Header.Values("Warning"), nil
}

// countIn is how many of want are in got.
func countIn(got, want []string) int {
	have := make(map[string]bool, len(got))
	for _, g := range got {
		have[g] = true
	}
	n := 0
	for _, w := range want {
		if have[w] {
			n++
		}
	}
	return n
}
