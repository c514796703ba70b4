package storage

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	sdkproto "github.com/coder/coder/v2/provisionersdk/proto"
	"github.com/google/uuid"
	protobuf "google.golang.org/protobuf/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/registry/rest"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

// TestAccessPaths runs the read and write paths of access.go and
// watchfilter.go that TestAccess does not, on the same stack: writes by a
// mapped member and by a cluster controller, the redaction of a GET, of
// DELETED events, and the DELETED of an object that stops being readable.
func TestAccessPaths(t *testing.T) {
	st := newAccessStack(t, 2)
	ctx := context.Background()
	admin, adminWS, aliceWS := st.coder.Username, st.wsName(st.coder.Username), st.wsName("alice")

	// A template with a parameter, so that a workspace has spec.parameters
	// to hide, and one to delete while members watch.
	params, err := pushParamsTemplate(ctx, st.coder, "params")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.coder.PushEchoTemplate(ctx, "doomed"); err != nil {
		t.Fatal(err)
	}
	// Made in Coder: a real write through the storage would need a
	// records store, which this stack has not.
	cw, err := st.coder.Client.CreateUserWorkspace(ctx, "alice", codersdk.CreateWorkspaceRequest{TemplateID: params.ID, Name: "alice-params",
		RichParameterValues: []codersdk.WorkspaceBuildParameter{{Name: "region", Value: "us"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.coder.WaitBuild(ctx, cw.LatestBuild.ID); err != nil {
		t.Fatal(err)
	}
	tplOf := func(name string) string { return st.org + "." + name }
	paramsWS := st.org + ".alice.alice-params"
	create := &metav1.CreateOptions{}
	dryCreate := &metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

	t.Run("a member's workspace create is what coderd lets her, dry run or not", func(t *testing.T) {
		actx := as("alice", nsMapped, nil)
		ws := func(name string) *aggv1.CoderWorkspace {
			return &aggv1.CoderWorkspace{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: aggv1.CoderWorkspaceSpec{TemplateName: "params", Running: true, Parameters: []aggv1.WorkspaceParameter{{Name: "region", Value: "us"}}}}
		}
		mine := st.org + ".alice.alice-other"
		out, err := st.wss.Create(actx, ws(mine), nil, dryCreate)
		if err != nil {
			t.Fatalf("alice's dry-run create of a workspace of hers: %v", err)
		}
		if got := out.(*aggv1.CoderWorkspace); got.Spec.TemplateVersionID != params.ActiveVersionID.String() || got.Status.Owner != "alice" {
			t.Errorf("dry run answers version %q owner %q, want %s alice", got.Spec.TemplateVersionID, got.Status.Owner, params.ActiveVersionID)
		}
		if _, err := st.coder.Client.WorkspaceByOwnerAndName(ctx, "alice", "alice-other", codersdk.WorkspaceOptions{}); err == nil {
			t.Error("the dry run created the workspace in Coder")
		}

		bobs := st.org + ".bob.bob-params"
		_, err = st.wss.Create(actx, ws(bobs), nil, dryCreate)
		want := fmt.Sprintf(`coderworkspaces.aggregation.coder.com %q is forbidden: Coder user "alice" may not create it in control plane mapped/coder`, bobs)
		if !apierrors.IsForbidden(err) || err.Error() != want {
			t.Errorf("alice's dry-run create of a workspace for bob: %v, want 403 %q", err, want)
		}
		// The real create reaches coderd as alice, which refuses her.
		_, err = st.wss.Create(actx, ws(bobs), nil, create)
		want = fmt.Sprintf(`coderworkspaces.aggregation.coder.com %q is forbidden: coderd of control plane mapped/coder refused Coder user "alice": Unauthorized to create workspace.: You are unable to create a workspace in this organization. It is possible to have access to the template, but not be able to create a workspace. Please contact an administrator about your permissions if you feel this is an error.`, bobs)
		if !apierrors.IsForbidden(err) || err.Error() != want {
			t.Errorf("alice's create of a workspace for bob: %v, want 403 %q", err, want)
		}
		if _, err := st.coder.Client.WorkspaceByOwnerAndName(ctx, "bob", "bob-params", codersdk.WorkspaceOptions{}); err == nil {
			t.Error("alice's create made a workspace for bob in Coder")
		}
	})

	t.Run("the cluster's controllers may not create", func(t *testing.T) {
		name := st.org + ".alice.gc-made"
		_, err := st.wss.Create(as(gcUser, nsMapped, nil), &aggv1.CoderWorkspace{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: aggv1.CoderWorkspaceSpec{TemplateName: "params"}}, nil, dryCreate)
		want := fmt.Sprintf(`coderworkspaces.aggregation.coder.com %q is forbidden: Kubernetes user %q is one of the cluster's controllers (aggregatedAPIServer.identity.clusterControllers), which act as coder-k8s in control plane mapped/coder only to read, delete and change Kubernetes metadata, not to create coderworkspaces`, name, gcUser)
		if !apierrors.IsForbidden(err) || err.Error() != want {
			t.Errorf("a create by the GC: %v, want %q", err, want)
		}
	})

	t.Run("a GET shows a workspace's parameters only to those who may update it", func(t *testing.T) {
		want := []aggv1.WorkspaceParameter{{Name: "region", Value: "us"}}
		for _, c := range []struct {
			who  string
			want []aggv1.WorkspaceParameter
		}{{"alice", want}, {admin, want}, {"tadmin", nil}} {
			got, err := st.wss.Get(as(c.who, nsMapped, nil), paramsWS, &metav1.GetOptions{})
			if err != nil {
				t.Errorf("%s gets %s: %v", c.who, paramsWS, err)
				continue
			}
			if p := got.(*aggv1.CoderWorkspace).Spec.Parameters; !slices.Equal(p, c.want) {
				t.Errorf("%s sees parameters %v, want %v", c.who, p, c.want)
			}
		}
		_, err := st.wss.Get(as("bob", nsMapped, nil), paramsWS, &metav1.GetOptions{})
		if want := fmt.Sprintf("coderworkspaces.aggregation.coder.com %q not found", paramsWS); err == nil || err.Error() != want {
			t.Errorf("bob gets %s: %v, want %q", paramsWS, err, want)
		}
	})

	t.Run("a member's update is what coderd allows her", func(t *testing.T) {
		ttl := int64(2 * time.Hour / time.Millisecond)
		dry := &metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
		out, _, err := st.wss.Update(as("alice", nsMapped, nil), paramsWS, rest.DefaultUpdatedObjectInfo(nil, func(_ context.Context, _, old runtime.Object) (runtime.Object, error) {
			ws := old.(*aggv1.CoderWorkspace).DeepCopy()
			ws.Spec.TTLMillis = &ttl
			return ws, nil
		}), nil, nil, false, dry)
		if err != nil {
			t.Fatalf("alice changes her workspace's TTL (dry run): %v", err)
		}
		if got := out.(*aggv1.CoderWorkspace).Spec.TTLMillis; got == nil || *got != ttl {
			t.Errorf("the answer shows TTL %v, want %d", got, ttl)
		}
		_, _, err = st.wss.Update(as("alice", nsMapped, nil), adminWS, rest.DefaultUpdatedObjectInfo(nil, func(_ context.Context, _, old runtime.Object) (runtime.Object, error) {
			return old, nil
		}), nil, nil, false, dry)
		if want := fmt.Sprintf("coderworkspaces.aggregation.coder.com %q not found", adminWS); err == nil || err.Error() != want {
			t.Errorf("alice updates the admin's workspace: %v, want %q", err, want)
		}

		// Templates: alice reads them (the Everyone group) but may not
		// change them; refused before anything reaches coderd, dry run or not.
		tpl := tplOf(st.templates[0])
		for _, opts := range []*metav1.UpdateOptions{dry, {}} {
			_, _, err = st.tpls.Update(as("alice", nsMapped, nil), tpl, rest.DefaultUpdatedObjectInfo(nil, func(_ context.Context, _, old runtime.Object) (runtime.Object, error) {
				c := old.(*aggv1.CoderTemplate).DeepCopy()
				c.Spec.DisplayName = "Alice's"
				return c, nil
			}), nil, nil, false, opts)
			want := fmt.Sprintf(`codertemplates.aggregation.coder.com %q is forbidden: Coder user "alice" may not update it in control plane mapped/coder`, tpl)
			if !apierrors.IsForbidden(err) || err.Error() != want {
				t.Errorf("alice renames %s (dry run %v): %v, want %q", tpl, len(opts.DryRun) > 0, err, want)
			}
		}
		got, err := st.coder.Client.TemplateByName(ctx, st.coder.OrganizationID, st.templates[0])
		if err != nil || got.DisplayName != "" {
			t.Errorf("the template's display name is %q (%v), want it unchanged", got.DisplayName, err)
		}
	})

	t.Run("a dry-run create from another template's version is refused as the real create is", func(t *testing.T) {
		src, err := st.coder.Client.TemplateByName(ctx, st.coder.OrganizationID, st.templates[0])
		if err != nil {
			t.Fatal(err)
		}
		for _, who := range []string{"alice", "tadmin"} {
			name := tplOf(who + "-copy")
			obj := func() *aggv1.CoderTemplate {
				return &aggv1.CoderTemplate{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: aggv1.CoderTemplateSpec{VersionID: src.ActiveVersionID.String()}}
			}
			_, dry := st.tpls.Create(as(who, nsMapped, nil), obj(), nil, dryCreate)
			_, real := st.tpls.Create(as(who, nsMapped, nil), obj(), nil, create)
			want := fmt.Sprintf(`CoderTemplate.aggregation.coder.com %q is invalid: Template version %s is already part of a template: spec.versionID: Invalid value: Template version is already part of a template`, name, src.ActiveVersionID)
			if real == nil || real.Error() != want || !apierrors.IsInvalid(real) {
				t.Errorf("%s creates %s: %v, want 422 %q", who, name, real, want)
			}
			if dry == nil || dry.Error() != want || !apierrors.IsInvalid(dry) {
				t.Errorf("%s's dry run of it: %v, want what the real create answers, 422 %q", who, dry, want)
			}
		}
		if _, err := st.coder.Client.TemplateByName(ctx, st.coder.OrganizationID, "alice-copy"); err == nil {
			t.Error("a template alice-copy exists in Coder")
		}
	})

	t.Run("a dry-run create of a taken name answers what the real create does", func(t *testing.T) {
		src, err := st.coder.Client.TemplateByName(ctx, st.coder.OrganizationID, st.templates[1])
		if err != nil {
			t.Fatal(err)
		}
		name := tplOf(st.templates[0])
		want := fmt.Sprintf("codertemplates.aggregation.coder.com %q already exists", name)
		for _, c := range []struct {
			who  string
			spec aggv1.CoderTemplateSpec
		}{
			{"tadmin", aggv1.CoderTemplateSpec{Files: map[string]string{"main.tf": "# nothing\n"}}},
			{"alice", aggv1.CoderTemplateSpec{VersionID: src.ActiveVersionID.String()}},
		} {
			for _, opts := range []*metav1.CreateOptions{dryCreate, create} {
				_, err := st.tpls.Create(as(c.who, nsMapped, nil), &aggv1.CoderTemplate{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: c.spec}, nil, opts)
				if !apierrors.IsAlreadyExists(err) || err.Error() != want {
					t.Errorf("%s creates %s (dry run %v): %v, want 409 %q", c.who, name, len(opts.DryRun) > 0, err, want)
				}
			}
		}
	})

	t.Run("a DELETED event carries only what the watcher may see", func(t *testing.T) {
		watchAs := func(who string) watch.Interface {
			w, err := st.tpls.Watch(as(who, nsMapped, nil), &metainternalversion.ListOptions{ResourceVersion: "0"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(w.Stop)
			if got := initialAdded(t, w, len(st.templates)+2); !slices.Contains(got, tplOf("doomed")) {
				t.Fatalf("%s's initial events add %v, without %s", who, got, tplOf("doomed"))
			}
			return w
		}
		aliceW, tadminW := watchAs("alice"), watchAs("tadmin")
		doomed, err := st.coder.Client.TemplateByName(ctx, st.coder.OrganizationID, "doomed")
		if err != nil {
			t.Fatal(err)
		}
		if err := st.coder.Client.DeleteTemplate(ctx, doomed.ID); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			who       string
			w         watch.Interface
			withFiles bool
		}{{"alice", aliceW, false}, {"tadmin", tadminW, true}} {
			ev := mustEvent(t, c.w, 20*time.Second)
			tpl := ev.Object.(*aggv1.CoderTemplate)
			if ev.Type != watch.Deleted || tpl.Name != tplOf("doomed") || (tpl.Spec.Files != nil) != c.withFiles {
				t.Errorf("%s's watch: %s %s with files %v, want DELETED %s with files %v", c.who, ev.Type, tpl.Name, tpl.Spec.Files != nil, tplOf("doomed"), c.withFiles)
			}
		}

		// A workspace tadmin may read but not update: no parameters in
		// any of its events, the DELETED one included.
		w, err := st.wss.Watch(as("tadmin", nsMapped, nil), &metainternalversion.ListOptions{ResourceVersion: "0"})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		if got, want := initialAdded(t, w, 3), sortedCopy([]string{paramsWS, adminWS, aliceWS}); !slices.Equal(got, want) {
			t.Errorf("tadmin's initial events add %v, want %v", got, want)
		}
		if _, err := st.coder.Client.CreateWorkspaceBuild(ctx, cw.ID, codersdk.CreateWorkspaceBuildRequest{Transition: codersdk.WorkspaceTransitionDelete}); err != nil {
			t.Fatal(err)
		}
		for {
			ev := mustEvent(t, w, 30*time.Second)
			ws := wsOf(ev)
			if ws.Name != paramsWS {
				continue
			}
			if ws.Spec.Parameters != nil {
				t.Errorf("tadmin's %s event shows parameters %v", ev.Type, ws.Spec.Parameters)
			}
			if ev.Type == watch.Deleted {
				break
			}
			if ev.Type != watch.Modified {
				t.Errorf("tadmin's event %s for the workspace being deleted, want MODIFIED until DELETED", ev.Type)
			}
		}
	})

	t.Run("a watch sends DELETED for what stops being readable and ADDED for what becomes readable, resumed or not", func(t *testing.T) {
		// A template admin reads every workspace; a member only their
		// own. Coder's site roles need no licence.
		for _, u := range []string{"tina", "uma", "vic"} {
			if _, err := st.coder.Client.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{
				Email: u + "@example.com", Username: u, Password: "SomeSecurePassword!1", OrganizationIDs: []uuid.UUID{st.coder.OrganizationID},
			}); err != nil {
				t.Fatal(err)
			}
		}
		roles := func(u string, r ...string) {
			t.Helper()
			if _, err := st.coder.Client.UpdateUserRoles(ctx, u, codersdk.UpdateRoles{Roles: append([]string{}, r...)}); err != nil {
				t.Fatal(err)
			}
		}
		roles("tina", codersdk.RoleTemplateAdmin)
		roles("uma", codersdk.RoleTemplateAdmin)
		watchAs := func(who, rv string) watch.Interface {
			w, err := st.wss.Watch(as(who, nsMapped, nil), &metainternalversion.ListOptions{ResourceVersion: rv})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(w.Stop)
			return w
		}
		both := sortedCopy([]string{adminWS, aliceWS})
		// tina watches from now; uma lists, and resumes from her list
		// once demoted; vic, a member, watches from now and is promoted.
		tina := watchAs("tina", "0")
		if got := initialAdded(t, tina, 2); !slices.Equal(got, both) {
			t.Fatalf("tina's initial events add %v, want %v", got, both)
		}
		obj, err := st.wss.List(as("uma", nsMapped, nil), &metainternalversion.ListOptions{})
		if got := listNames(t, obj, err); !slices.Equal(got, []string{nsMapped + "/" + adminWS, nsMapped + "/" + aliceWS}) {
			t.Fatalf("uma lists %v", got)
		}
		vic := watchAs("vic", "0")
		roles("tina")
		roles("uma")
		roles("vic", codersdk.RoleTemplateAdmin)
		// Past the time coderd's last answers are used without asking.
		time.Sleep(11 * time.Second)
		uma := watchAs("uma", obj.(*workspaceList).ResourceVersion)
		if _, err := st.coder.StopWorkspace(ctx, admin+"-ws"); err != nil {
			t.Fatal(err)
		}
		// Each watch until the stop build's changes have passed: alice's
		// workspace may change meanwhile too (its status is polled).
		for _, c := range []struct {
			who                string
			w                  watch.Interface
			adminMay, aliceMay string
		}{
			{"tina", tina, "DELETED", "|DELETED"},
			{"uma", uma, "DELETED", "|DELETED"},
			{"vic", vic, "ADDED|ADDED MODIFIED", "|ADDED|ADDED MODIFIED"},
		} {
			got := settled(t, c.w, 3*time.Second)
			if a := compactModified(got[adminWS]); !slices.Contains(strings.Split(c.adminMay, "|"), a) {
				t.Errorf("%s's watch after the change of %s: %q, want one of %q", c.who, adminWS, a, c.adminMay)
			}
			if a := compactModified(got[aliceWS]); !slices.Contains(strings.Split(c.aliceMay, "|"), a) {
				t.Errorf("%s's watch for %s: %q, want one of %q", c.who, aliceWS, a, c.aliceMay)
			}
			if len(got) > 2 {
				t.Errorf("%s's watch: events of %v", c.who, got)
			}
		}
		if got := listedBy(t)(st.wss.List(as("tina", nsMapped, nil), &metainternalversion.ListOptions{})); len(got) != 0 {
			t.Errorf("tina lists %v after her demotion, want nothing", got)
		}
	})
}

// initialAdded reads a new watch's events until n objects were ADDED
// (a change to one of those may arrive meanwhile) and returns their
// names, sorted.
func initialAdded(t *testing.T, w watch.Interface, n int) []string {
	t.Helper()
	var added []string
	for len(added) < n {
		ev := mustEvent(t, w, 10*time.Second)
		name := ev.Object.(metav1.Object).GetName()
		switch {
		case ev.Type == watch.Added && !slices.Contains(added, name):
			added = append(added, name)
		case ev.Type == watch.Modified && slices.Contains(added, name):
		default:
			t.Fatalf("initial events: %s %s after ADDED %v", ev.Type, name, added)
		}
	}
	slices.Sort(added)
	return added
}

// settled reads w's events until none arrives for quiet, and returns each
// object's event types in order.
func settled(t *testing.T, w watch.Interface, quiet time.Duration) map[string][]watch.EventType {
	t.Helper()
	out := map[string][]watch.EventType{}
	for {
		ev, ok := nextPollEvent(w, quiet)
		if !ok {
			return out
		}
		name := ev.Object.(metav1.Object).GetName()
		out[name] = append(out[name], ev.Type)
	}
}

// compactModified joins types with spaces, a run of MODIFIED as one.
func compactModified(types []watch.EventType) string {
	var out []string
	for _, ty := range types {
		if ty == watch.Modified && len(out) > 0 && out[len(out)-1] == string(watch.Modified) {
			continue
		}
		out = append(out, string(ty))
	}
	return strings.Join(out, " ")
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// pushParamsTemplate creates a template for coderd's echo provisioner
// whose version declares the mutable string parameter "region"
// (default "eu"), with Coder's classic parameter flow: the parameters
// come from the import's graph response, as coder's echo.Tar writes them.
func pushParamsTemplate(ctx context.Context, c *testenv.Coder, name string) (codersdk.Template, error) {
	files, err := testenv.EchoTemplate()
	if err != nil {
		return codersdk.Template{}, err
	}
	graph, err := protobuf.Marshal(&sdkproto.Response{Type: &sdkproto.Response_Graph{Graph: &sdkproto.GraphComplete{
		Parameters: []*sdkproto.RichParameter{{Name: "region", Type: "string", DefaultValue: "eu", Mutable: true}},
	}}})
	if err != nil {
		return codersdk.Template{}, err
	}
	files["0.graph.protobuf"] = string(graph)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range slices.Sorted(func(yield func(string) bool) {
		for p := range files {
			if !yield(p) {
				return
			}
		}
	}) {
		if err := tw.WriteHeader(&tar.Header{Name: p, Mode: 0o644, Size: int64(len(files[p]))}); err != nil {
			return codersdk.Template{}, err
		}
		if _, err := tw.Write([]byte(files[p])); err != nil {
			return codersdk.Template{}, err
		}
	}
	if err := tw.Close(); err != nil {
		return codersdk.Template{}, err
	}
	up, err := c.Client.Upload(ctx, codersdk.ContentTypeTar, &buf)
	if err != nil {
		return codersdk.Template{}, err
	}
	v, err := c.Client.CreateTemplateVersion(ctx, c.OrganizationID, codersdk.CreateTemplateVersionRequest{
		StorageMethod: codersdk.ProvisionerStorageMethodFile, FileID: up.ID, Provisioner: codersdk.ProvisionerTypeEcho,
	})
	if err != nil {
		return codersdk.Template{}, err
	}
	for v.Job.Status != codersdk.ProvisionerJobSucceeded {
		if v.Job.Status == codersdk.ProvisionerJobFailed || v.Job.Status == codersdk.ProvisionerJobCanceled {
			return codersdk.Template{}, fmt.Errorf("import of %s: %s: %s", name, v.Job.Status, v.Job.Error)
		}
		time.Sleep(200 * time.Millisecond)
		if v, err = c.Client.TemplateVersion(ctx, v.ID); err != nil {
			return codersdk.Template{}, err
		}
	}
	classic := true
	return c.Client.CreateTemplate(ctx, c.OrganizationID, codersdk.CreateTemplateRequest{Name: name, VersionID: v.ID, UseClassicParameterFlow: &classic})
}
