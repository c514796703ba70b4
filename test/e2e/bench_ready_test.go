package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"

	"github.com/coder/coder-k8s/internal/config"
	"github.com/coder/coder-k8s/internal/testenv"
)

// benchReadyPairs is how many (kubectl, coder CLI) pairs
// BenchmarkWorkspaceReady times; BENCH_READY_PAIRS overrides it.
const benchReadyPairs = 5

// benchReadyAgentPoll is how often the coder CLI side asks coderd whether
// the agent is connected and ready: fine enough that the reference loses
// at most this much to its own polling.
const benchReadyAgentPoll = 100 * time.Millisecond

// benchReadyParams are the parameters both sides give, the template's
// defaults spelled out so neither depends on a default or a preset.
var benchReadyParams = [][2]string{{"cpu", "2"}, {"memory", "2"}, {"home_disk_size", "10"}, {"greeting", "hello"}}

// BenchmarkWorkspaceReady measures, on one node stack with the operator
// at the default watch poll interval, the time from `kubectl create -f`
// of a CoderWorkspace of the Kubernetes template (a pod on the node
// running coder agent) as a mapped member to `kubectl wait
// --for=condition=Ready` returning, against `coder create --yes` of the
// same template with the same parameters as the same Coder user followed
// by polling coderd every 100 ms until every agent is connected with
// lifecycle ready. Pairs alternate which side goes first; each workspace
// is deleted (and its pod gone) before the next, so both find the node,
// the image and the template's provider cache in the same state. The
// first pair is a warm-up that is not counted.
func BenchmarkWorkspaceReady(b *testing.B) {
	pairs := benchReadyPairs
	if v := os.Getenv("BENCH_READY_PAIRS"); v != "" {
		var err error
		if pairs, err = strconv.Atoi(v); err != nil || pairs < 1 {
			b.Fatalf("BENCH_READY_PAIRS=%q: want a positive number", v)
		}
	}
	s := newNodeStack(b, withPollInterval(config.Default().AggregatedAPIServer.WatchPollInterval.Duration))
	ctx := b.Context()
	const member = "alice"
	alice := s.nodeMember(b, member)
	login, err := s.coder.Client.LoginWithPassword(ctx, codersdk.LoginWithPasswordRequest{
		Email: member + "@example.com", Password: "SomeSecurePassword!1"})
	if err != nil {
		b.Fatalf("log in to coderd as %s: %v", member, err)
	}
	coderBin, err := testenv.Binary("coder")
	if err != nil {
		b.Fatal(err)
	}
	coderEnv := append(os.Environ(), "CODER_URL="+s.coder.URL.String(), "CODER_SESSION_TOKEN="+login.SessionToken,
		"CODER_CONFIG_DIR="+b.TempDir(), "CODER_NO_VERSION_WARNING=1", "CODER_TELEMETRY_ENABLE=false")
	memberClient := codersdk.New(s.coder.URL)
	memberClient.SetSessionToken(login.SessionToken)

	viaKubectl := func(name string) time.Duration {
		kname := s.org + "." + member + "." + name
		manifest := runningWorkspaceManifest(b, kname, s.ns, kubernetesTemplate, benchReadyParams...)
		start := time.Now()
		if r, err := alice.Run(ctx, "", "create", "-f", manifest); err != nil {
			b.Fatalf("kubectl create as %s@example.com: %v\n%s\noperator log:\n%s", member, err, r.Combined, s.op.LogTail(30))
		}
		if r, err := alice.Run(ctx, "", "wait", "--for=condition=Ready", "cws/"+kname, "-n", s.ns, "--timeout=5m"); err != nil {
			b.Fatalf("kubectl wait --for=condition=Ready: %v\n%s\noperator log:\n%s", err, r.Combined, s.op.LogTail(30))
		}
		d := time.Since(start)
		// Like with like: Ready=True must mean what the reference waits for.
		ws, err := memberClient.WorkspaceByOwnerAndName(ctx, member, name, codersdk.WorkspaceOptions{})
		if err != nil {
			b.Fatalf("coderd: workspace %s/%s: %v", member, name, err)
		}
		if why := testenv.AgentsNotReady(ws); why != "" {
			b.Fatalf("kubectl wait returned but coderd says workspace %s/%s is not usable: %s", member, name, why)
		}
		return d
	}
	// viaCoder returns the time to a usable workspace and the time coder
	// create itself took (it returns once the build has ended).
	viaCoder := func(name string) (time.Duration, time.Duration) {
		args := []string{"create", name, "--yes", "--template", kubernetesTemplate, "--preset", "none"}
		for _, p := range benchReadyParams {
			args = append(args, "--parameter", p[0]+"="+p[1])
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		start := time.Now()
		cmd := exec.CommandContext(cctx, coderBin, args...)
		cmd.Env = coderEnv
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("coder %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		cli := time.Since(start)
		for {
			ws, err := memberClient.WorkspaceByOwnerAndName(cctx, member, name, codersdk.WorkspaceOptions{})
			if err != nil {
				b.Fatalf("coderd: workspace %s/%s: %v", member, name, err)
			}
			why := testenv.AgentsNotReady(ws)
			if why == "" {
				return time.Since(start), cli
			}
			if ws.LatestBuild.Job.Status == codersdk.ProvisionerJobFailed {
				b.Fatalf("workspace %s/%s: %s", member, name, why)
			}
			select {
			case <-cctx.Done():
				b.Fatalf("workspace %s/%s not usable within 5m: %s", member, name, why)
			case <-time.After(benchReadyAgentPoll):
			}
		}
	}
	// remove deletes workspace name in Coder and waits until coderd no
	// longer has it and its pod is gone.
	remove := func(name string) {
		ws, err := memberClient.WorkspaceByOwnerAndName(ctx, member, name, codersdk.WorkspaceOptions{})
		if err != nil {
			b.Fatalf("coderd: workspace %s/%s: %v", member, name, err)
		}
		if _, err := memberClient.CreateWorkspaceBuild(ctx, ws.ID, codersdk.CreateWorkspaceBuildRequest{
			Transition: codersdk.WorkspaceTransitionDelete}); err != nil {
			b.Fatalf("delete workspace %s/%s: %v", member, name, err)
		}
		testenv.WaitFor(b, 3*time.Minute, func() error {
			_, err := memberClient.WorkspaceByOwnerAndName(ctx, member, name, codersdk.WorkspaceOptions{})
			var sdkErr *codersdk.Error
			if err == nil || !errors.As(err, &sdkErr) || sdkErr.StatusCode() != http.StatusNotFound {
				return errNotYet(fmt.Sprintf("workspace %s/%s still in coderd (%v)", member, name, err))
			}
			pods, err := s.workspacePods(ctx, ws.ID)
			if err != nil {
				return err
			}
			if len(pods) > 0 {
				return errNotYet("pods left: " + podNames(pods))
			}
			return nil
		})
	}

	b.ResetTimer()
	var kubectls, coders []time.Duration
	for i := range pairs + 1 {
		kFirst := i%2 == 0
		var k, c, cli time.Duration
		kname, cname := fmt.Sprintf("rk%d", i), fmt.Sprintf("rc%d", i)
		for _, kTurn := range []bool{kFirst, !kFirst} {
			if kTurn {
				k = viaKubectl(kname)
				remove(kname)
			} else {
				c, cli = viaCoder(cname)
				remove(cname)
			}
		}
		order := "coder first"
		if kFirst {
			order = "kubectl first"
		}
		if i == 0 {
			fmt.Printf("workspace ready: warm-up pair (%s): kubectl %s, coder %s (coder create itself %s)\n", order,
				k.Round(10*time.Millisecond), c.Round(10*time.Millisecond), cli.Round(10*time.Millisecond))
			continue
		}
		kubectls, coders = append(kubectls, k), append(coders, c)
		fmt.Printf("workspace ready: pair %d (%s): kubectl create → Ready=True %s, coder create → agent ready %s (coder create itself %s), ratio %.2f\n",
			i, order, k.Round(10*time.Millisecond), c.Round(10*time.Millisecond), cli.Round(10*time.Millisecond), k.Seconds()/c.Seconds())
	}
	b.StopTimer()
	kMed, cMed := percentile(kubectls, 50), percentile(coders, 50)
	ratio := kMed.Seconds() / cMed.Seconds()
	b.ReportMetric(ratio, "ready-ratio")
	b.ReportMetric(kMed.Seconds(), "kubectl-ready-s")
	b.ReportMetric(cMed.Seconds(), "coder-ready-s")
	b.ReportMetric(float64(pairs), "pairs")
	fmt.Printf("workspace ready ratio=%.2f (target ≤ 1.1): kubectl create → kubectl wait --for=condition=Ready median %s, coder create → every agent connected and ready median %s; %d alternating pairs, watch poll interval %s\n",
		ratio, kMed.Round(10*time.Millisecond), cMed.Round(10*time.Millisecond), pairs, s.watchPollInterval())
}
