package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coder/coder-k8s/internal/testenv"
)

// TestRealWorkspace runs a workspace of the Kubernetes template on the
// test node, created with kubectl by a mapped member (not an owner): its
// pod (labelled as Coder's example labels it, holding the agent token
// only through a Secret) runs on the node, the agent connects to coderd
// and finishes its startup script, its app is healthy, and the token is
// nowhere in the build log; running:false deletes the pod and the Secret, running:true brings
// them back with a connected agent. It prints how long kubectl create
// takes to a ready agent.
func TestRealWorkspace(t *testing.T) {
	t.Parallel()
	s := newNodeStack(t)
	ctx := t.Context()
	alice := s.nodeMember(t, "alice")
	const name = "dev"
	kname := s.org + ".alice." + name

	manifest := runningWorkspaceManifest(t, kname, s.ns, kubernetesTemplate, [2]string{"cpu", "4"}, [2]string{"greeting", "hello from kubectl"})
	start := time.Now()
	if r, err := alice.Run(ctx, "", "create", "-f", manifest); err != nil {
		t.Fatalf("kubectl create as alice@example.com: %v\n%s\noperator log:\n%s", err, r.Combined, s.op.LogTail(30))
	}
	ws := s.waitAgentReady(t, "alice", name, 5*time.Minute)
	t.Logf("kubectl create → agent connected and ready: %s", time.Since(start).Round(100*time.Millisecond))

	if ws.LatestBuild.InitiatorUsername != "alice" {
		t.Errorf("the build was started by %q, want alice (Mapped mode acts as the caller)", ws.LatestBuild.InitiatorUsername)
	}
	pod := s.onePod(t, ws)
	want := map[string]string{
		"app.kubernetes.io/name":   "coder-workspace",
		"com.coder.workspace.id":   ws.ID.String(),
		"com.coder.workspace.name": name,
		"com.coder.user.id":        ws.OwnerID.String(),
		"com.coder.user.username":  "alice",
	}
	for k, v := range want {
		if got := pod.Labels[k]; got != v {
			t.Errorf("pod label %s = %q, want %q", k, got, v)
		}
	}
	if pod.Spec.NodeName != "coder-k8s-node" {
		t.Errorf("the pod runs on %q, want the test node", pod.Spec.NodeName)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range pod.Spec.Containers[0].Env {
		env[e.Name] = e
	}
	if tok := env["CODER_AGENT_TOKEN"]; tok.Value != "" || tok.ValueFrom == nil || tok.ValueFrom.SecretKeyRef == nil {
		t.Errorf("CODER_AGENT_TOKEN is %+v, want it only from a Secret", tok)
	}
	if got := env["CODER_AGENT_URL"].Value; got != s.coder.URL.String() {
		t.Errorf("CODER_AGENT_URL = %q, want coderd's URL on the node network %s", got, s.coder.URL)
	}
	for k, v := range map[string]string{"CPU": "4", "MEMORY": "2", "GREETING": "hello from kubectl"} {
		if got := env[k].Value; got != v {
			t.Errorf("pod env %s = %q, want %q (the workspace's parameter)", k, got, v)
		}
	}

	var a codersdk.WorkspaceAgent
	for _, r := range ws.LatestBuild.Resources {
		if len(r.Agents) > 0 {
			a = r.Agents[0]
		}
	}
	// The app's health check is the agent's own metrics endpoint, so
	// coderd reports it healthy once the agent serves.
	testenv.WaitFor(t, time.Minute, func() error {
		w, err := s.coder.Client.WorkspaceByOwnerAndName(ctx, "alice", name, codersdk.WorkspaceOptions{})
		if err != nil {
			return err
		}
		for _, r := range w.LatestBuild.Resources {
			for _, ag := range r.Agents {
				for _, app := range ag.Apps {
					if app.Slug == "metrics" && app.Health == codersdk.WorkspaceAppHealthHealthy {
						return nil
					}
					if app.Slug == "metrics" {
						return errNotYet(fmt.Sprintf("app metrics is %s", app.Health))
					}
				}
			}
		}
		return errNotYet("the agent has no app metrics")
	})
	startup := s.agentStartupLog(t, a)
	if !strings.Contains(startup, "hello from kubectl from "+name) {
		t.Errorf("the agent's startup script log does not show the greeting; it is:\n%s", startup)
	}

	// The token is in the Secret and the pod's environment, never in the
	// build log.
	token := secretValue(t, s, s.ns, env["CODER_AGENT_TOKEN"].ValueFrom.SecretKeyRef.Name, "token")
	log := s.buildLog(t, ws.LatestBuild.ID)
	if strings.Contains(log, token) {
		t.Errorf("the build log holds the agent token")
	}
	if !strings.Contains(log, "pod/"+pod.Name+" created") {
		t.Errorf("the build log does not show kubectl creating the pod; it is:\n%s", log)
	}

	t.Run("running:false deletes the pod and its Secret", func(t *testing.T) {
		if r, err := alice.Run(ctx, "", "patch", "cws", kname, "-n", s.ns, "--type", "merge", "-p", `{"spec":{"running":false}}`); err != nil {
			t.Fatalf("%v\n%s", err, r.Combined)
		}
		testenv.WaitFor(t, 3*time.Minute, func() error {
			w, err := s.coder.Client.WorkspaceByOwnerAndName(ctx, "alice", name, codersdk.WorkspaceOptions{})
			if err != nil {
				return err
			}
			if b := w.LatestBuild; b.Transition != codersdk.WorkspaceTransitionStop || b.Job.Status != codersdk.ProvisionerJobSucceeded {
				return errNotYet(fmt.Sprintf("build %d: %s %s %s", b.BuildNumber, b.Transition, b.Job.Status, b.Job.Error))
			}
			return nil
		})
		pods, err := s.workspacePods(ctx, ws.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(pods) != 0 {
			t.Errorf("after the stop build the workspace still has pods: %s", podNames(pods))
		}
		if _, err := s.k.Clientset.CoreV1().Secrets(s.ns).Get(ctx, env["CODER_AGENT_TOKEN"].ValueFrom.SecretKeyRef.Name, metav1.GetOptions{}); err == nil {
			t.Errorf("after the stop build the agent token's Secret is still there")
		}
	})

	t.Run("running:true brings the pod back with a connected agent", func(t *testing.T) {
		start := time.Now()
		if r, err := alice.Run(ctx, "", "patch", "cws", kname, "-n", s.ns, "--type", "merge", "-p", `{"spec":{"running":true}}`); err != nil {
			t.Fatalf("%v\n%s", err, r.Combined)
		}
		w := s.waitAgentReady(t, "alice", name, 5*time.Minute)
		t.Logf("running:true → agent connected and ready: %s", time.Since(start).Round(100*time.Millisecond))
		if w.LatestBuild.Transition != codersdk.WorkspaceTransitionStart {
			t.Errorf("latest build is a %s, want a start", w.LatestBuild.Transition)
		}
		if p := s.onePod(t, w); p.UID == pod.UID {
			t.Errorf("the pod is the one of the first start, want a new one")
		}
	})
}

// onePod is the one running pod of workspace ws on the node.
func (s *aggStack) onePod(t *testing.T, ws codersdk.Workspace) corev1.Pod {
	t.Helper()
	pods, err := s.workspacePods(t.Context(), ws.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 1 {
		t.Fatalf("workspace %s has %d pods (%s), want 1", ws.Name, len(pods), podNames(pods))
	}
	if pods[0].Status.Phase != corev1.PodRunning {
		t.Errorf("pod %s is %s, want Running", pods[0].Name, pods[0].Status.Phase)
	}
	return pods[0]
}

func podNames(pods []corev1.Pod) string {
	names := make([]string, len(pods))
	for i, p := range pods {
		names[i] = p.Name
	}
	return strings.Join(names, ", ")
}

// agentStartupLog is the output of agent a's startup script, as coderd
// keeps it.
func (s *aggStack) agentStartupLog(t *testing.T, a codersdk.WorkspaceAgent) string {
	t.Helper()
	var out string
	testenv.WaitFor(t, time.Minute, func() error {
		logs, closer, err := s.coder.Client.WorkspaceAgentLogsAfter(t.Context(), a.ID, 0, false)
		if err != nil {
			return err
		}
		defer closer.Close()
		var b strings.Builder
		for batch := range logs {
			for _, l := range batch {
				b.WriteString(l.Output + "\n")
			}
		}
		out = b.String()
		if out == "" {
			return errNotYet("no startup log yet")
		}
		return nil
	})
	return out
}
