package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	rbacv1 "k8s.io/api/rbac/v1"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

// TestBuildLogs reads build and import logs through the log subresources
// with kubectl get --raw, through kube-apiserver, against the real coderd
// and OpenTofu (Mapped identity): a finished build's log is exactly the
// entries coderd's logs endpoint returns, with the CLI's stage headers;
// tailLines, timestamps and build select what is shown; a follow of a
// running build streams its lines as they are written and ends with the
// build; a finished build's follow returns at once; a member reads their
// own workspace's log and gets 404 for another user's; a template
// version's import log likewise; bad options are 422 naming the field; a
// newer build, and a new workspace of the same name, show their own log
// (the subresource remembers ended logs and workspace IDs).
func TestBuildLogs(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := context.Background()
	if _, err := s.coder.PushTemplate(ctx, "loglines", testenv.LogLinesTemplate(40, 0)); err != nil {
		t.Fatal(err)
	}
	ws, err := s.coder.CreateWorkspace(ctx, "loglines", "logs")
	if err != nil {
		t.Fatal(err)
	}
	wsPath := s.logPath("coderworkspaces", s.workspaceName("logs"))
	build := ws.LatestBuild

	t.Run("a finished build's log is coderd's entries with the stage headers", func(t *testing.T) {
		want := renderJobLog(s.jobLogEntries(t, "/api/v2/workspacebuilds/"+build.ID.String()+"/logs"), build.Job, false)
		got := s.must(t, "get", "--raw", wsPath)
		if got != want {
			t.Fatalf("log:\n%s\nwant:\n%s", got, want)
		}
		for _, line := range []string{"==> ⧗ Setting up\n", "(local-exec): log line 40\n", "(local-exec): the end\n"} {
			if !strings.Contains(got, line) {
				t.Errorf("the log has no %q:\n%s", line, got)
			}
		}
		if !strings.Contains(got, "=== ✔ ") {
			t.Errorf("the log has no stage end:\n%s", got)
		}
	})

	t.Run("tailLines keeps the last lines, timestamps prefixes them, build selects a build", func(t *testing.T) {
		full := strings.SplitAfter(s.must(t, "get", "--raw", wsPath), "\n")
		full = full[:len(full)-1] // after the last newline
		if got, want := s.must(t, "get", "--raw", wsPath+"?tailLines=5"), strings.Join(full[len(full)-5:], ""); got != want {
			t.Errorf("tailLines=5:\n%s\nwant:\n%s", got, want)
		}
		if got := s.must(t, "get", "--raw", wsPath+"?tailLines=0"); got != "" {
			t.Errorf("tailLines=0: %q", got)
		}
		want := renderJobLog(s.jobLogEntries(t, "/api/v2/workspacebuilds/"+build.ID.String()+"/logs"), build.Job, true)
		if got := s.must(t, "get", "--raw", wsPath+"?timestamps=true"); got != want {
			t.Errorf("timestamps=true:\n%s\nwant:\n%s", got, want)
		}
		if got := s.must(t, "get", "--raw", fmt.Sprintf("%s?build=%d", wsPath, build.BuildNumber)); got != strings.Join(full, "") {
			t.Errorf("build=%d differs from the latest build's log:\n%s", build.BuildNumber, got)
		}
		out, err := s.run("get", "--raw", wsPath+"?build=99")
		if err == nil || !strings.Contains(out, "NotFound") {
			t.Errorf("build=99: %v %s, want NotFound", err, out)
		}
	})

	t.Run("bad options are 422 naming the field", func(t *testing.T) {
		for q, field := range map[string]string{"?tailLines=-1": "tailLines", "?build=0": "build"} {
			out, err := s.run("get", "--raw", wsPath+q)
			if err == nil || !strings.Contains(out, "is invalid") || !strings.Contains(out, field) {
				t.Errorf("%s: %v %s, want 422 naming %s", q, err, out, field)
			}
		}
		out, err := s.run("get", "--raw", wsPath+"?follow=maybe")
		if err == nil || !strings.Contains(out, "BadRequest") || !strings.Contains(out, "follow") {
			t.Errorf("follow=maybe: %v %s, want 400 naming follow", err, out)
		}
		out, err = s.run("get", "--raw", s.logPath("coderworkspaces", s.workspaceName("nothing")))
		if err == nil || !strings.Contains(out, "NotFound") {
			t.Errorf("a workspace that does not exist: %v %s, want NotFound", err, out)
		}
	})

	t.Run("a finished build's follow returns at once", func(t *testing.T) {
		start := time.Now()
		got := s.must(t, "get", "--raw", wsPath+"?follow=true")
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("follow of a finished build took %s", took)
		}
		if want := s.must(t, "get", "--raw", wsPath); got != want {
			t.Errorf("follow:\n%s\nwant:\n%s", got, want)
		}
	})

	t.Run("follow streams a running build to its end", func(t *testing.T) {
		if _, err := s.coder.PushTemplate(ctx, "slowlog", testenv.LogLinesTemplate(6, 1)); err != nil {
			t.Fatal(err)
		}
		tpl := s.coderTemplate(t, "slowlog")
		w, err := s.coder.Client.CreateUserWorkspace(ctx, s.coder.Username, codersdk.CreateWorkspaceRequest{TemplateID: tpl.ID, Name: "slow"})
		if err != nil {
			t.Fatal(err)
		}
		follow := s.startKubectl(t, "get", "--raw", s.logPath("coderworkspaces", s.workspaceName("slow"))+"?follow=true")
		follow.waitLine(t, time.Minute, "log line 1")
		if b, err := s.coder.Client.WorkspaceBuild(ctx, w.LatestBuild.ID); err != nil || b.Job.CompletedAt != nil {
			t.Fatalf("the build ended (%v) before the follow showed its first line; it must stream", err)
		}
		done := make(chan error, 1)
		go func() { done <- follow.cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("the follow ended with %v:\n%s", err, follow.output())
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("the follow did not end with the build:\n%s", follow.output())
		}
		b, err := s.coder.WaitBuild(ctx, w.LatestBuild.ID)
		if err != nil {
			t.Fatal(err)
		}
		want := renderJobLog(s.jobLogEntries(t, "/api/v2/workspacebuilds/"+b.ID.String()+"/logs"), b.Job, false)
		if got := follow.output() + "\n"; got != want {
			t.Errorf("followed log:\n%s\nwant:\n%s", got, want)
		}
	})

	t.Run("a template version's import log", func(t *testing.T) {
		tpl := s.coderTemplate(t, "loglines")
		v, err := s.coder.Client.TemplateVersion(ctx, tpl.ActiveVersionID)
		if err != nil {
			t.Fatal(err)
		}
		path := s.logPath("codertemplateversions", s.org+".loglines."+v.Name)
		want := renderJobLog(s.jobLogEntries(t, "/api/v2/templateversions/"+v.ID.String()+"/logs"), v.Job, false)
		if got := s.must(t, "get", "--raw", path); got != want {
			t.Errorf("import log:\n%s\nwant:\n%s", got, want)
		}
		if !strings.Contains(want, "==> ⧗ ") {
			t.Errorf("the import log has no stage header:\n%s", want)
		}
		out, err := s.run("get", "--raw", path+"?build=1")
		if err == nil || !strings.Contains(out, "is invalid") {
			t.Errorf("build on a version: %v %s, want 422", err, out)
		}
	})

	t.Run("a member reads their own build log and gets 404 for another user's", func(t *testing.T) {
		if _, err := s.coder.Client.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{
			Email: "logreader@example.com", Username: "logreader", Password: "SomeSecurePassword!1",
			OrganizationIDs: []uuid.UUID{s.coder.OrganizationID}}); err != nil {
			t.Fatal(err)
		}
		tpl := s.coderTemplate(t, "loglines")
		own, err := s.coder.Client.CreateUserWorkspace(ctx, "logreader", codersdk.CreateWorkspaceRequest{TemplateID: tpl.ID, Name: "mine"})
		if err != nil {
			t.Fatal(err)
		}
		b, err := s.coder.WaitBuild(ctx, own.LatestBuild.ID)
		if err != nil {
			t.Fatal(err)
		}
		member := s.kubectlAs(t, "logreader@example.com", "members", "log-reader",
			rbacv1.PolicyRule{APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderworkspaces", "coderworkspaces/log", "codertemplateversions/log"}, Verbs: []string{"get"}})
		r, err := member.Run(ctx, "", "get", "--raw", s.logPath("coderworkspaces", s.org+".logreader.mine"))
		want := renderJobLog(s.jobLogEntries(t, "/api/v2/workspacebuilds/"+b.ID.String()+"/logs"), b.Job, false)
		if err != nil || r.Stdout != want {
			t.Errorf("the member's own log: %v %s\nwant:\n%s", err, r.Combined, want)
		}
		r, err = member.Run(ctx, "", "get", "--raw", wsPath)
		if err == nil || !strings.Contains(r.Combined, "NotFound") {
			t.Errorf("another user's log: %v %s, want NotFound", err, r.Combined)
		}
		r, err = member.Run(ctx, "", "get", "cws", s.workspaceName("logs"), "-n", s.ns)
		if err == nil || !strings.Contains(r.Combined, "NotFound") {
			t.Errorf("GET of another user's workspace: %v %s, want the same NotFound", err, r.Combined)
		}
		unmapped := s.kubectlAs(t, "nobody@example.com", "members", "log-reader-unmapped",
			rbacv1.PolicyRule{APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderworkspaces/log"}, Verbs: []string{"get"}})
		r, err = unmapped.Run(ctx, "", "get", "--raw", wsPath)
		if err == nil || !strings.Contains(r.Combined, "NotFound") {
			t.Errorf("an unmapped caller: %v %s, want NotFound as for a GET", err, r.Combined)
		}
	})

	t.Run("a newer build, and a workspace made again with the same name, show their own log", func(t *testing.T) {
		check := func(t *testing.T, what string, b codersdk.WorkspaceBuild) {
			t.Helper()
			want := renderJobLog(s.jobLogEntries(t, "/api/v2/workspacebuilds/"+b.ID.String()+"/logs"), b.Job, false)
			if got := s.must(t, "get", "--raw", wsPath); got != want {
				t.Errorf("%s: log:\n%s\nwant build %d's:\n%s", what, got, b.BuildNumber, want)
			}
		}
		stopped, err := s.coder.StopWorkspace(ctx, "logs")
		if err != nil {
			t.Fatal(err)
		}
		check(t, "after a stop", stopped.LatestBuild)
		del, err := s.coder.Client.CreateWorkspaceBuild(ctx, stopped.ID, codersdk.CreateWorkspaceBuildRequest{Transition: codersdk.WorkspaceTransitionDelete})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.coder.WaitBuild(ctx, del.ID); err != nil {
			t.Fatal(err)
		}
		again, err := s.coder.CreateWorkspace(ctx, "loglines", "logs")
		if err != nil {
			t.Fatal(err)
		}
		if again.ID == ws.ID {
			t.Fatal("coderd gave the new workspace the old one's ID")
		}
		check(t, "a new workspace of the same name", again.LatestBuild)
	})
}

// logPath is the log subresource of object name of resource in the
// stack's namespace.
func (s *aggStack) logPath(resource, name string) string {
	return fmt.Sprintf("/apis/%s/namespaces/%s/%s/%s/log", aggv1.SchemeGroupVersion, s.ns, resource, name)
}

// jobLogEntries reads a job's log entries from coderd's logs endpoint as
// the first user.
func (s *aggStack) jobLogEntries(t testing.TB, path string) []codersdk.ProvisionerJobLog {
	t.Helper()
	res, err := s.coder.Client.Request(context.Background(), http.MethodGet, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatal(codersdk.ReadBodyAsError(res))
	}
	var out []codersdk.ProvisionerJobLog
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// renderJobLog is what the log subresource shows of a finished job's
// entries: the coder CLI's stage headers ("==> ⧗ <stage>" in place of a
// stage's empty first entry, "=== ✔ <stage> [<ms>ms]" at its end, ✘ for
// the last stage of a job that did not succeed) and every entry's output.
func renderJobLog(entries []codersdk.ProvisionerJobLog, job codersdk.ProvisionerJob, timestamps bool) string {
	var b strings.Builder
	line := func(at time.Time, s string) {
		if timestamps {
			b.WriteString(at.UTC().Format(time.RFC3339Nano) + " ")
		}
		b.WriteString(s + "\n")
	}
	stage, started := "", time.Time{}
	end := func(at time.Time, mark string) {
		if stage != "" {
			line(at, fmt.Sprintf("=== %s %s [%dms]", mark, stage, max(at.Sub(started), 0).Milliseconds()))
		}
	}
	for _, e := range entries {
		if e.Stage != "" && e.Stage != stage {
			end(e.CreatedAt, "✔")
			stage, started = e.Stage, e.CreatedAt
			line(e.CreatedAt, "==> ⧗ "+e.Stage)
			if e.Output == "" {
				continue
			}
		}
		line(e.CreatedAt, e.Output)
	}
	if job.CompletedAt != nil {
		mark := "✔"
		if job.Status != codersdk.ProvisionerJobSucceeded {
			mark = "✘"
		}
		end(*job.CompletedAt, mark)
	}
	return b.String()
}
