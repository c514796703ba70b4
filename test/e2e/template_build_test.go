package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"

	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/testenv"
)

// slowImport is how long the slow template's import takes: longer than
// kube-apiserver's default request timeout (60 s) and k8s.io/apiserver's
// create/update handler timeout (34 s), so a request that waited for it
// would fail.
const slowImport = 90 * time.Second

// TestTemplateBuilds drives CoderTemplates whose versions build in the
// background, through kube-apiserver with its default request timeout and
// real coderd imports: a 90 s import that kubectl create does not wait for,
// applying the same files again, a build that fails, and SIGKILL of the
// operator mid-build with two replicas taking over.
func TestTemplateBuilds(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := context.Background()
	slow := newSlowState(t)
	gate := newStateGate(t)

	manifest := func(name, tf string) string { return templateManifest(t, s.ns, name, "", tf) }
	ready := func(name string) string {
		return strings.TrimSpace(s.must(t, "get", "ctpl", "coder."+name, "-n", s.ns, "-o",
			`jsonpath={.status.conditions[?(@.type=="Ready")].status}/{.status.conditions[?(@.type=="Ready")].reason}`))
	}
	versions := func(t *testing.T, name string) []codersdk.TemplateVersion {
		t.Helper()
		tpl := s.coderTemplate(t, name)
		vs, err := s.coder.Client.TemplateVersionsByTemplate(ctx, codersdk.TemplateVersionsByTemplateRequest{TemplateID: tpl.ID})
		if err != nil {
			t.Fatal(err)
		}
		return vs
	}

	t.Run("a 90 s import: kubectl create returns at once, the object shows Building, then Ready", func(t *testing.T) {
		m := manifest("slow", slow.template())
		// The dry run shows what the create does: Building, the files as
		// given, and nothing in Coder.
		dry := s.must(t, "create", "--dry-run=server", "-f", m, "-o",
			`jsonpath={.status.conditions[?(@.type=="Ready")].status}/{.status.conditions[?(@.type=="Ready")].reason} {.spec.files.main\.tf}`)
		if state, files, _ := strings.Cut(dry, " "); state != "False/Building" || strings.TrimSpace(files) != strings.TrimSpace(slow.template()) {
			t.Errorf("kubectl create --dry-run=server shows %q, want False/Building and the files as given", dry)
		}
		if _, err := s.coder.Client.TemplateByName(ctx, s.coder.OrganizationID, "slow"); !coderapi.IsNotFound(err) {
			t.Errorf("after the dry run, Coder's template slow: %v, want 404", err)
		}
		slow.holdFor(slowImport)
		start := time.Now()
		out, err := s.run("create", "-f", m)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("kubectl create: %v\n%s\noperator log:\n%s", err, out, s.op.LogTail(40))
		}
		t.Logf("kubectl create returned in %s: %s", took.Round(time.Millisecond), strings.TrimSpace(out))
		if took > 5*time.Second {
			t.Errorf("kubectl create took %s, want < 5s whatever the build takes", took)
		}
		// Coder has the template at once, with the importing version.
		tpl := s.coderTemplate(t, "slow")
		if got := ready("slow"); got != "False/Building" {
			t.Errorf("Ready right after the create = %q, want False/Building", got)
		}
		msg := s.must(t, "get", "ctpl", "coder.slow", "-n", s.ns, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].message}`)
		if !strings.Contains(msg, tpl.ActiveVersionID.String()) {
			t.Errorf("the Building message does not name the version %s: %q", tpl.ActiveVersionID, msg)
		}
		// The spec as applied: no drift for a GitOps tool.
		if files := s.must(t, "get", "ctpl", "coder.slow", "-n", s.ns, "-o", `jsonpath={.spec.files.main\.tf}`); strings.TrimSpace(files) != strings.TrimSpace(slow.template()) {
			t.Errorf("spec.files while building:\n%s\nwant:\n%s", files, slow.template())
		}
		if out, err := s.run("diff", "--server-side", "-f", m); err != nil {
			t.Errorf("kubectl diff --server-side shows drift while building: %v\n%s", err, out)
		}

		// The same files again while it builds: nothing new uploaded.
		s.must(t, "apply", "--server-side", "-f", m)
		if vs := versions(t, "slow"); len(vs) != 1 {
			t.Errorf("re-applying the same files while building: %d versions in Coder, want 1", len(vs))
		}

		out, err = runKubectl(s.kubectl, s.k, 5*time.Minute, "", "wait", "--for=condition=Ready", "ctpl/coder.slow", "-n", s.ns, "--timeout=4m")
		if err != nil {
			t.Fatalf("kubectl wait --for=condition=Ready: %v\n%s\noperator log:\n%s", err, out, s.op.LogTail(40))
		}
		t.Logf("Ready %s after the create (import held %s)", time.Since(start).Round(time.Second), slowImport)
		if got := ready("slow"); got != "True/Succeeded" {
			t.Errorf("Ready after the build = %q, want True/Succeeded", got)
		}
		if got := s.must(t, "get", "ctpl", "coder.slow", "-n", s.ns, "-o", "jsonpath={.status.buildingVersionID}"); got != "" {
			t.Errorf("status.buildingVersionID after the build = %q, want empty", got)
		}

		// And again once built: still nothing new.
		s.must(t, "apply", "--server-side", "-f", m)
		if vs := versions(t, "slow"); len(vs) != 1 {
			t.Errorf("re-applying the same files: %d versions in Coder, want 1", len(vs))
		}
		if s.coderTemplate(t, "slow").ActiveVersionID != tpl.ActiveVersionID {
			t.Errorf("re-applying the same files changed the active version")
		}
	})

	t.Run("a build that fails: BuildFailed with Coder's error, the previous version stays active, fixed files replace it", func(t *testing.T) {
		s.must(t, "create", "-f", manifest("fails", mainTF))
		s.must(t, "wait", "--for=condition=Ready", "ctpl/coder.fails", "-n", s.ns, "--timeout=3m")
		good := s.coderTemplate(t, "fails").ActiveVersionID

		broken := "this is not terraform {\n"
		start := time.Now()
		// The files were created with kubectl create: taking them over with
		// an apply is a field-manager conflict, as for any resource.
		s.must(t, "apply", "--server-side", "--force-conflicts", "-f", manifest("fails", broken))
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("kubectl apply took %s, want < 5s", took)
		}
		s.must(t, "wait", `--for=jsonpath={.status.conditions[?(@.type=="Ready")].reason}=BuildFailed`, "ctpl/coder.fails", "-n", s.ns, "--timeout=3m")
		// The promoter records the failure with the end of the build log
		// within a poll interval of the import ending.
		var msg string
		testenv.WaitFor(t, 30*time.Second, func() error {
			msg = s.must(t, "get", "ctpl", "coder.fails", "-n", s.ns, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].message}`)
			if !strings.Contains(msg, "last log lines") {
				return errNotYet("the BuildFailed message has no log lines yet: " + msg)
			}
			return nil
		})
		vs := versions(t, "fails")
		var failed codersdk.TemplateVersion
		for _, v := range vs {
			if v.ID != good {
				failed = v
			}
		}
		if failed.Job.Status != codersdk.ProvisionerJobFailed {
			t.Fatalf("coderd: the broken version %s is %s, want failed", failed.ID, failed.Job.Status)
		}
		for _, want := range []string{"did not build", failed.ID.String(), failed.Job.Error, "stays active"} {
			if !strings.Contains(msg, want) {
				t.Errorf("the BuildFailed message lacks %q:\n%s", want, msg)
			}
		}
		if got := ready("fails"); got != "False/BuildFailed" {
			t.Errorf("Ready = %q, want False/BuildFailed", got)
		}
		if active := s.coderTemplate(t, "fails").ActiveVersionID; active != good {
			t.Errorf("the failed build changed the active version: %s → %s", good, active)
		}
		out := s.must(t, "get", "ctpl", "coder.fails", "-n", s.ns, "-o", `jsonpath={.status.activeVersionID} {.status.buildingVersionID}`)
		if out != good.String()+" "+failed.ID.String() {
			t.Errorf("status active/building = %q, want %s %s", out, good, failed.ID)
		}
		// The broken files are what was applied: applying them again is
		// no drift and uploads nothing.
		s.must(t, "apply", "--server-side", "-f", manifest("fails", broken))
		if n := len(versions(t, "fails")); n != 2 {
			t.Errorf("re-applying the broken files: %d versions, want 2", n)
		}

		fixed := mainTF + "\noutput \"fixed\" {\n  value = true\n}\n"
		s.must(t, "apply", "--server-side", "-f", manifest("fails", fixed))
		s.must(t, "wait", "--for=condition=Ready", "ctpl/coder.fails", "-n", s.ns, "--timeout=3m")
		tpl := s.coderTemplate(t, "fails")
		if tpl.ActiveVersionID == good || tpl.ActiveVersionID == failed.ID {
			t.Errorf("the fixed files were not promoted: active %s", tpl.ActiveVersionID)
		}
		if n := len(versions(t, "fails")); n != 3 {
			t.Errorf("%d versions after the fix, want 3", n)
		}
	})

	t.Run("SIGKILL mid-build: the replicas that follow promote it exactly once", func(t *testing.T) {
		s.must(t, "create", "-f", manifest("killed", gate.template()))
		s.must(t, "wait", "--for=condition=Ready", "ctpl/coder.killed", "-n", s.ns, "--timeout=3m")
		before := s.coderTemplate(t, "killed").ActiveVersionID

		gate.hold()
		reads := gate.reads()
		s.must(t, "apply", "--server-side", "--force-conflicts", "-f", manifest("killed", gate.template()+"\noutput \"second\" {\n  value = 2\n}\n"))
		testenv.WaitFor(t, 90*time.Second, func() error {
			if gate.reads() == reads {
				return errNotYet("the new version's import has not reached the gate")
			}
			return nil
		})
		var pending uuid.UUID
		for _, v := range versions(t, "killed") {
			if v.ID != before {
				pending = v.ID
			}
		}
		if err := s.op.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 10*time.Second, func() error {
			if exited, _ := s.op.Exited(); !exited {
				return errNotYet("the operator still runs after SIGKILL")
			}
			return nil
		})

		// Two replicas sharing the leader Lease: both serve the API and
		// both run the promoter.
		opts := OperatorOptions{LeaseName: "coder-k8s-build-replicas"}
		r1 := s.startOperator(t, opts)
		r2 := s.startOperator(t, opts)
		s.routeAPIService(t, r1)
		gate.release()
		out, err := runKubectl(s.kubectl, s.k, 4*time.Minute, "", "wait", "--for=condition=Ready", "ctpl/coder.killed", "-n", s.ns, "--timeout=3m")
		if err != nil {
			t.Fatalf("kubectl wait after the kill: %v\n%s\nreplica 1:\n%s\nreplica 2:\n%s", err, out, r1.LogTail(30), r2.LogTail(30))
		}
		tpl := s.coderTemplate(t, "killed")
		if tpl.ActiveVersionID != pending {
			t.Errorf("active version %s, want the one building at the kill, %s", tpl.ActiveVersionID, pending)
		}
		if n := len(versions(t, "killed")); n != 2 {
			t.Errorf("%d versions, want 2 (the first and the one promoted)", n)
		}
		// Exactly one replica recorded the promotion.
		var promoted float64
		for _, r := range []*Operator{r1, r2} {
			n, err := metricSum(ctx, r.Metrics, "coder_k8s_template_build_wait_duration_seconds_count", `outcome="succeeded"`)
			if err != nil {
				t.Fatal(err)
			}
			promoted += n
		}
		if promoted != 1 {
			t.Errorf("the replicas recorded %v promotions, want exactly 1", promoted)
		}
		if got := s.must(t, "get", "ctpl", "coder.killed", "-n", s.ns, "-o", "jsonpath={.status.activeVersionID}"); got != pending.String() {
			t.Errorf("kubectl shows active version %q, want %s", got, pending)
		}
	})
}

// slowState is a Terraform HTTP state backend on loopback that answers
// only at a set time: a template reading it in a terraform_remote_state
// data source imports slowly, offline.
type slowState struct {
	srv   *httptest.Server
	mu    sync.Mutex
	until time.Time
}

func newSlowState(t *testing.T) *slowState {
	t.Helper()
	st := &slowState{}
	st.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st.mu.Lock()
		wait := time.Until(st.until)
		st.mu.Unlock()
		if wait > 0 {
			select {
			case <-time.After(wait):
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"version":4,"terraform_version":"1.6.0","serial":1,"lineage":"coder-k8s-slow","outputs":{},"resources":[]}`)
	}))
	t.Cleanup(st.srv.Close)
	return st
}

// holdFor makes reads answer d from now.
func (st *slowState) holdFor(d time.Duration) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.until = time.Now().Add(d)
}

func (st *slowState) template() string {
	return fmt.Sprintf(`# The import reads this state, which answers late.
data "terraform_remote_state" "slow" {
  backend = "http"
  config = {
    address = "%s/state"
  }
}

output "slow" {
  value = "done"
}
`, st.srv.URL)
}
