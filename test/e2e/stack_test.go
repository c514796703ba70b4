package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/scheme"
	"github.com/coder/coder-k8s/internal/testenv"
)

// The Service the test APIService points at; the serving certificate names
// it, as it must in a cluster.
const (
	aggServiceName      = "coder-k8s"
	aggServiceNamespace = "coder-system"
	// pollInterval is the operator's watch poll interval in these tests.
	pollInterval = time.Second
	// ownerSecret is the Secret, in every namespace a test adopts a
	// coderd in, whose key "token" holds an owner's session token.
	ownerSecret = "owner"
)

// ownerMappedUsers are the Kubernetes users the suites act as: the admin
// kubeconfig and the MCP agents' ServiceAccounts (namespace agents). The
// stack's backends run in Mapped mode, the default, and map each of them
// explicitly to the stack coderd's first user, an owner the test stack
// created (not a user coder-k8s created, which Mapped mode refuses). Tests
// of other users map them themselves (identity_test.go).
var ownerMappedUsers = []string{
	"admin",
	"system:serviceaccount:agents:agent",
	"system:serviceaccount:agents:reader",
	"system:serviceaccount:agents:nobody",
	"system:serviceaccount:agents:fault-agent",
	"system:serviceaccount:agents:hostile",
	"system:serviceaccount:agents:metrics-agent",
	"system:serviceaccount:agents:bench-agent",
}

// mappedIdentity is the identity of the stack's backends: Mapped, with
// ownerMappedUsers mapped to Coder user owner.
func mappedIdentity(owner string) coderv1alpha1.IdentitySpec {
	id := coderv1alpha1.IdentitySpec{Mode: "Mapped"}
	for _, u := range ownerMappedUsers {
		id.Mappings = append(id.Mappings, coderv1alpha1.IdentityMapping{KubernetesUser: u, CoderUser: owner})
	}
	return id
}

// identityConfig is id as the flow mapping of a static backend's
// identity in the configuration file.
func identityConfig(id coderv1alpha1.IdentitySpec) string {
	var mappings []string
	for _, m := range id.Mappings {
		mappings = append(mappings, fmt.Sprintf("{kubernetesUser: %q, coderUser: %q}", m.KubernetesUser, m.CoderUser))
	}
	return fmt.Sprintf("{mode: %s, mappings: [%s]}", id.Mode, strings.Join(mappings, ", "))
}

var (
	workspacesGVR = aggv1.SchemeGroupVersion.WithResource("coderworkspaces")
	templatesGVR  = aggv1.SchemeGroupVersion.WithResource("codertemplates")
)

// aggStack is the e2e stack every suite builds with newStack:
// kube-apiserver (with etcd), coderd (with PostgreSQL), optionally a
// counting proxy in front of coderd, and the coder-k8s binary (all mode by
// default) serving aggregation.coder.com through an APIService, with a
// CoderControlPlane coder/coder adopting the coderd.
type aggStack struct {
	k     *testenv.KubeAPI
	coder *testenv.Coder
	// proxy is a CountingProxy in front of coderd (withCoderdProxy), or
	// nil.
	proxy *testenv.CountingProxy
	// recorder is the RecordingProxy behind proxy (withCoderdRecorder),
	// or nil.
	recorder *testenv.RecordingProxy
	// op is the operator the stack started (nil with withoutOperator).
	op      *Operator
	c       client.Client
	dyn     dynamic.Interface
	kubectl string
	org     string
	ns      string
	// certDir holds the operator's serving certificate, for the Service
	// the APIService names (and localhost); caPEM is its CA.
	certDir string
	caPEM   []byte
	// node is the test node and what runs on it (withNode), or nil.
	node *stackNode

	cfg stackConfig
}

// stackConfig is what the stack options set.
type stackConfig struct {
	// operator holds options of every operator the stack starts beyond
	// its own (all mode, the kubeconfig, certDir and watchPollInterval):
	// Aggregated entries are added to the stack's, the rest as they are.
	operator OperatorOptions
	// noOperator: the stack starts no operator and does not wait for the
	// control plane it creates; the test starts operators with
	// startOperator and routes the APIService with routeAPIService.
	noOperator bool
	// staticTokenFile, when set, runs the operator in aggregated-apiserver
	// mode serving the stack's coderd as its static backend in namespace
	// ns, with the first user's session token in this file; no
	// CoderControlPlane is created.
	staticTokenFile string
	// proxy puts a CountingProxy in front of coderd; adoptViaProxy makes
	// coder/coder adopt coderd through it.
	proxy, adoptViaProxy bool
	// noAPIService leaves the APIService unregistered.
	noAPIService bool
	// qps and burst, when set, are the rate limits of the stack's dynamic
	// client.
	qps   float32
	burst int
	// watchPollInterval, when set, replaces pollInterval as the operator's
	// watch poll interval.
	watchPollInterval time.Duration
	// coder configures the stack's coderd.
	coder testenv.CoderOptions
	// operatorIdentity runs the stack's backends in Operator mode (for
	// tests of that mode) instead of Mapped.
	operatorIdentity bool
	// record puts a RecordingProxy between the CountingProxy and coderd.
	record bool
	// node starts a real node (withNode).
	node bool
}

// stackOption configures newStack.
type stackOption func(*stackConfig)

// withOperator adds o to the stack's operator configuration (see
// stackConfig.operator).
func withOperator(o OperatorOptions) stackOption {
	return func(c *stackConfig) { c.operator = mergeOperatorOptions(c.operator, o) }
}

// withAggregated adds entries to the operator's aggregatedAPIServer
// mapping, for example `coder: {requestTimeout: 3s}`.
func withAggregated(entries string) stackOption {
	return withOperator(OperatorOptions{Aggregated: entries})
}

// withoutOperator builds the stack without starting an operator.
func withoutOperator() stackOption { return func(c *stackConfig) { c.noOperator = true } }

// withStaticBackend runs the operator in aggregated-apiserver mode with
// the stack's coderd as its static backend; tokenFile receives the session
// token (see stackConfig.staticTokenFile).
func withStaticBackend(tokenFile string) stackOption {
	return func(c *stackConfig) { c.staticTokenFile = tokenFile }
}

// withCoderdProxy puts a CountingProxy in front of coderd (s.proxy); with
// adoptThroughIt, coder/coder adopts coderd through the proxy, so that it
// sees every request coder-k8s makes to that control plane's coderd.
func withCoderdProxy(adoptThroughIt bool) stackOption {
	return func(c *stackConfig) { c.proxy, c.adoptViaProxy = true, adoptThroughIt }
}

// withOperatorIdentity runs the stack's control planes and static backend
// in identity mode Operator, for tests of that mode.
func withOperatorIdentity() stackOption { return func(c *stackConfig) { c.operatorIdentity = true } }

// withCoderdRecorder puts a RecordingProxy (s.recorder) between the
// counting proxy (which it implies) and coderd, keeping every request
// coder-k8s made to the stack's control plane coder/coder.
func withCoderdRecorder() stackOption {
	return func(c *stackConfig) { c.proxy, c.adoptViaProxy, c.record = true, true, true }
}

// identity is the identity of the stack's backends for coderd owner user
// owner: Mapped with ownerMappedUsers (mappedIdentity), or Operator with
// withOperatorIdentity.
func (s *aggStack) identity(owner string) coderv1alpha1.IdentitySpec {
	if s.cfg.operatorIdentity {
		return coderv1alpha1.IdentitySpec{Mode: "Operator"}
	}
	return mappedIdentity(owner)
}

// withoutAPIService leaves aggregation.coder.com unregistered (for tests
// of the controller alone).
func withoutAPIService() stackOption { return func(c *stackConfig) { c.noAPIService = true } }

// withPollInterval runs the operator with watch poll interval d instead of
// pollInterval (the benchmarks run the default).
func withPollInterval(d time.Duration) stackOption {
	return func(c *stackConfig) { c.watchPollInterval = d }
}

// watchPollInterval is the operator's watch poll interval.
func (s *aggStack) watchPollInterval() time.Duration {
	if s.cfg.watchPollInterval > 0 {
		return s.cfg.watchPollInterval
	}
	return pollInterval
}

// withClientRate sets the rate limits of the stack's dynamic client.
func withClientRate(qps float32, burst int) stackOption {
	return func(c *stackConfig) { c.qps, c.burst = qps, burst }
}

// withCoder starts the stack's coderd with opts.
func withCoder(opts testenv.CoderOptions) stackOption {
	return func(c *stackConfig) { c.coder = opts }
}

// newStack builds the stack: kube-apiserver, coderd, the clients, the
// operator (ready), the control plane coder/coder adopting coderd (with
// operator access) and the APIService (discovery working), each as the
// options say.
func newStack(t testing.TB, opts ...stackOption) *aggStack {
	t.Helper()
	s := &aggStack{org: "coder", ns: "coder"}
	for _, o := range opts {
		o(&s.cfg)
	}
	var err error
	if s.kubectl, err = testenv.Binary("kubectl"); err != nil {
		t.Fatal(err)
	}
	s.k = testenv.NewKubeAPI(t, s.kubeAPIOptions(t))
	if s.cfg.node {
		s.startNode(t)
	}
	s.coder = testenv.NewCoder(t, s.cfg.coder)
	if s.cfg.proxy {
		target := s.coder.URL
		if s.cfg.record {
			s.recorder = testenv.NewRecordingProxy(t, s.coder.URL)
			target = s.recorder.URL
		}
		s.proxy = testenv.NewCountingProxy(t, target)
	}
	s.certDir, s.caPEM = servingCert(t)
	// scheme.New has the aggregated types too.
	if s.c, err = client.New(s.k.Config, client.Options{Scheme: scheme.New()}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(s.k.Config)
	if s.cfg.qps > 0 {
		cfg.QPS, cfg.Burst = s.cfg.qps, s.cfg.burst
	}
	if s.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}

	if s.cfg.noOperator {
		// Reconciled by whichever operator the test starts first.
		createAdoptingControlPlane(t, s, s.ns, "coder", s.coderURL(), s.coder.SessionToken)
		return s
	}
	if s.cfg.staticTokenFile != "" {
		writeTokenFile(t, s.cfg.staticTokenFile, s.coder.SessionToken)
	}
	s.op = s.startOperator(t, OperatorOptions{})
	if s.cfg.staticTokenFile == "" {
		adoptControlPlane(t, s, s.ns, "coder", s.coderURL())
	}
	if !s.cfg.noAPIService {
		s.routeAPIService(t, s.op)
	}
	return s
}

// coderURL is where coder/coder reaches coderd: directly, or through the
// counting proxy (withCoderdProxy(true)).
func (s *aggStack) coderURL() string {
	if s.cfg.adoptViaProxy {
		return s.proxy.URL.String()
	}
	return s.coder.URL.String()
}

// startOperator runs the operator with the stack's configuration and the
// stack's serving certificate, with extra added (mergeOperatorOptions),
// and waits until every component its mode runs is ready.
func (s *aggStack) startOperator(t testing.TB, extra OperatorOptions) *Operator {
	t.Helper()
	o := mergeOperatorOptions(s.cfg.operator, extra)
	if o.Mode == "" {
		o.Mode = "all"
	}
	o.Kubeconfig = s.k.KubeconfigPath
	aggregated := fmt.Sprintf("certDir: %q, watchPollInterval: %s", s.certDir, s.watchPollInterval())
	if s.cfg.staticTokenFile != "" {
		o.Mode = "aggregated-apiserver"
		aggregated += fmt.Sprintf(", coder: {staticBackend: {url: %q, sessionTokenFile: %q, namespace: %s, identity: %s}}",
			s.coder.URL.String(), s.cfg.staticTokenFile, s.ns, identityConfig(s.identity(s.coder.Username)))
	}
	if o.Aggregated != "" {
		aggregated += ", " + o.Aggregated
	}
	o.Aggregated = aggregated
	op := StartOperator(t, o)
	switch o.Mode {
	case "all":
		op.WaitOK(t, op.Health+"/readyz")
		op.WaitOK(t, op.Aggregated+"/readyz")
		op.WaitOK(t, op.MCP+"/readyz")
	case "aggregated-apiserver":
		op.WaitOK(t, op.Aggregated+"/readyz")
	default:
		t.Fatalf("the stack runs the operator in all or aggregated-apiserver mode, not %s", o.Mode)
	}
	return op
}

// mergeOperatorOptions returns base with extra's settings added: entries
// of Aggregated, MCP, LeaderElection, ExtraConfig, Controller and Args are
// added to base's, other fields set in extra replace base's.
func mergeOperatorOptions(base, extra OperatorOptions) OperatorOptions {
	join := func(a, b string) string {
		if a == "" || b == "" {
			return a + b
		}
		return a + ", " + b
	}
	o := base
	o.Aggregated = join(base.Aggregated, extra.Aggregated)
	o.MCP = join(base.MCP, extra.MCP)
	o.LeaderElection = join(base.LeaderElection, extra.LeaderElection)
	o.ExtraConfig = base.ExtraConfig + extra.ExtraConfig
	o.Controller = append(append([]string(nil), base.Controller...), extra.Controller...)
	o.Args = append(append([]string(nil), base.Args...), extra.Args...)
	if extra.Mode != "" {
		o.Mode = extra.Mode
	}
	if extra.KubeQPS != 0 {
		o.KubeQPS = extra.KubeQPS
	}
	if extra.LeaseName != "" {
		o.LeaseName = extra.LeaseName
	}
	if extra.Release != "" {
		o.Release = extra.Release
	}
	if extra.EditRBAC != nil {
		o.EditRBAC = extra.EditRBAC
	}
	if extra.ExpectForbidden {
		o.ExpectForbidden = true
	}
	return o
}

// routeAPIService points the APIService of aggregation.coder.com/v1alpha1
// at op's secure port, with the stack's CA as its caBundle, as a Service
// would select op's pod, and waits for kube-apiserver's discovery.
func (s *aggStack) routeAPIService(t testing.TB, op *Operator) {
	t.Helper()
	if err := s.k.RegisterAPIService(context.Background(), testenv.APIService{
		Group: aggv1.GroupName, Version: "v1alpha1", Port: operatorPort(t, op), CABundle: s.caPEM,
		ServiceName: aggServiceName, ServiceNamespace: aggServiceNamespace,
	}); err != nil {
		t.Fatalf("register APIService: %v\noperator log:\n%s", err, op.LogTail(40))
	}
}

// servingCert writes a serving certificate for the test Service (and
// localhost) to a new directory and returns it with the CA's PEM.
func servingCert(t testing.TB) (string, []byte) {
	t.Helper()
	ca, err := testenv.NewCA("coder-k8s-e2e-ca")
	if err != nil {
		t.Fatal(err)
	}
	serving, err := ca.ServingCert([]string{testenv.ServiceDNSName(aggServiceName, aggServiceNamespace), "localhost"}, []net.IP{net.ParseIP("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := serving.WriteTo(dir); err != nil {
		t.Fatal(err)
	}
	return dir, ca.CertPEM
}

// writeTokenFile replaces a token file atomically (a new file renamed
// over it), as the kubelet updates a mounted Secret.
func writeTokenFile(t testing.TB, path, token string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// adoptControlPlane creates CoderControlPlane ns/name adopting the coderd
// at coderURL (the stack's, or a proxy in front of it) with the stack
// coderd's owner token (createAdoptingControlPlane), and waits for its
// operator access (waitOperatorAccess).
func adoptControlPlane(t testing.TB, s *aggStack, ns, name, coderURL string) *coderv1alpha1.CoderControlPlane {
	t.Helper()
	createAdoptingControlPlane(t, s, ns, name, coderURL, s.coder.SessionToken)
	return waitOperatorAccess(t, s, ns, name, coderURL, 60*time.Second)
}

// createAdoptingControlPlane creates namespace ns (if needed) and
// CoderControlPlane ns/name with spec.externalURL coderURL, as a user
// adopting an existing coderd does. With ownerToken, Secret "owner" in ns
// holds it (created if missing) and the control plane references it;
// without, the coderd has no users yet and the operator creates the first
// one. The control plane's identity is s.identity: with ownerToken the
// stack's users are mapped to Coder user admin, the first user every
// testenv coderd has; without, no one is (Mapped mode refuses the first
// user coder-k8s created). It does not wait for the operator.
func createAdoptingControlPlane(t testing.TB, s *aggStack, ns, name, coderURL, ownerToken string) *coderv1alpha1.CoderControlPlane {
	t.Helper()
	ctx := context.Background()
	if err := s.k.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	ccp := &coderv1alpha1.CoderControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       coderv1alpha1.CoderControlPlaneSpec{ExternalURL: coderURL, Identity: s.identity(s.coder.Username)},
	}
	if ownerToken == "" && !s.cfg.operatorIdentity {
		ccp.Spec.Identity.Mappings = nil
	}
	if ownerToken != "" {
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: ownerSecret, Namespace: ns},
			Data:       map[string][]byte{"token": []byte(ownerToken)},
		}
		if err := s.c.Create(ctx, secret); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		ccp.Spec.OperatorAccess.OwnerTokenSecretRef = &coderv1alpha1.SecretKeyReference{Name: ownerSecret, Key: "token"}
	}
	if err := s.c.Create(ctx, ccp); err != nil {
		t.Fatal(err)
	}
	return ccp
}

// waitOperatorAccess waits until control plane ns/name serves coderURL
// (status.url) with working operator access: OperatorAccessReady True for
// its current generation and status.operatorTokenSecretRef set.
func waitOperatorAccess(t testing.TB, s *aggStack, ns, name, coderURL string, timeout time.Duration) *coderv1alpha1.CoderControlPlane {
	t.Helper()
	ctx := context.Background()
	ccp := &coderv1alpha1.CoderControlPlane{}
	testenv.WaitFor(t, timeout, func() error {
		if err := s.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, ccp); err != nil {
			return err
		}
		c := apimeta.FindStatusCondition(ccp.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady)
		switch {
		case ccp.Status.URL != coderURL:
			return errNotYet(fmt.Sprintf("%s/%s: status.url is %q, want %q", ns, name, ccp.Status.URL, coderURL))
		case c == nil || c.Status != metav1.ConditionTrue:
			return errNotYet(fmt.Sprintf("%s/%s: OperatorAccessReady is not True: %s", ns, name, conditionSummary(ccp.Status.Conditions)))
		case c.ObservedGeneration != ccp.Generation:
			return errNotYet(fmt.Sprintf("%s/%s: OperatorAccessReady observed generation %d of %d", ns, name, c.ObservedGeneration, ccp.Generation))
		case ccp.Status.OperatorTokenSecretRef == nil:
			return errNotYet(fmt.Sprintf("%s/%s: status.operatorTokenSecretRef is not set", ns, name))
		}
		return nil
	})
	return ccp
}

// secretValue reads key of Secret ns/name and fails the test unless it
// holds something.
func secretValue(t testing.TB, s *aggStack, ns, name, key string) string {
	t.Helper()
	var secret corev1.Secret
	if err := s.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &secret); err != nil {
		t.Fatal(err)
	}
	v := string(secret.Data[key])
	if v == "" {
		t.Fatalf("Secret %s/%s has no key %q", ns, name, key)
	}
	return v
}

// operatorToken reads the operator token a control plane's status
// references.
func operatorToken(t testing.TB, s *aggStack, ccp *coderv1alpha1.CoderControlPlane) string {
	t.Helper()
	ref := ccp.Status.OperatorTokenSecretRef
	if ref == nil {
		t.Fatalf("control plane %s/%s has no status.operatorTokenSecretRef: %s", ccp.Namespace, ccp.Name, conditionSummary(ccp.Status.Conditions))
	}
	return secretValue(t, s, ccp.Namespace, ref.Name, ref.Key)
}

// coderEnv is the environment of the coder CLI acting as coderd's first
// user.
func (s *aggStack) coderEnv(t testing.TB) []string {
	return append(os.Environ(), "CODER_URL="+s.coder.URL.String(), "CODER_SESSION_TOKEN="+s.coder.SessionToken,
		"CODER_CONFIG_DIR="+t.TempDir(), "CODER_NO_VERSION_WARNING=1", "CODER_TELEMETRY_ENABLE=false")
}

// run runs kubectl as the cluster admin.
func (s *aggStack) run(args ...string) (string, error) {
	return s.runIn("", args...)
}

// runIn runs kubectl with stdin.
func (s *aggStack) runIn(stdin string, args ...string) (string, error) {
	return runKubectl(s.kubectl, s.k, 3*time.Minute, stdin, args...)
}

// runKubectl runs the kubectl binary as k's admin (stdin unless empty),
// bounded by timeout, and returns its combined output.
func runKubectl(kubectl string, k *testenv.KubeAPI, timeout time.Duration, stdin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	r, err := k.Kubectl(kubectl).Run(ctx, stdin, args...)
	return r.Combined, err
}

// must runs kubectl and fails the test on error.
func (s *aggStack) must(t *testing.T, args ...string) string {
	t.Helper()
	out, err := s.run(args...)
	if err != nil {
		t.Fatalf("%v\noperator log:\n%s", err, s.op.LogTail(30))
	}
	return out
}

// coderCLI runs the real coder CLI against the stack's coderd as its first
// user: a change made in Coder, not through Kubernetes.
func (s *aggStack) coderCLI(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := testenv.Binary("coder")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = s.coderEnv(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("coder %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// coderWorkspace reads workspace name of the first user from coderd.
func (s *aggStack) coderWorkspace(t testing.TB, name string) codersdk.Workspace {
	t.Helper()
	w, err := s.coder.Client.WorkspaceByOwnerAndName(context.Background(), s.coder.Username, name, codersdk.WorkspaceOptions{})
	if err != nil {
		t.Fatalf("coderd: workspace %s: %v", name, err)
	}
	return w
}

// coderTemplate reads template name of the default organization from
// coderd.
func (s *aggStack) coderTemplate(t testing.TB, name string) codersdk.Template {
	t.Helper()
	tpl, err := s.coder.Client.TemplateByName(context.Background(), s.coder.OrganizationID, name)
	if err != nil {
		t.Fatalf("coderd: template %s: %v", name, err)
	}
	return tpl
}

// getTemplate reads CoderTemplate name of the stack's namespace with
// kubectl.
func (s *aggStack) getTemplate(t *testing.T, name string) *aggv1.CoderTemplate {
	t.Helper()
	var obj aggv1.CoderTemplate
	if err := json.Unmarshal([]byte(s.must(t, "get", "ctpl", name, "-n", s.ns, "-o", "json")), &obj); err != nil {
		t.Fatal(err)
	}
	return &obj
}

// workspaceName is the Kubernetes name of a workspace of the first user.
func (s *aggStack) workspaceName(name string) string {
	return s.org + "." + s.coder.Username + "." + name
}

// seedWorkspace pushes template "base" (free of providers) to Coder,
// creates workspace name from it there, and returns the workspace's name
// in Kubernetes.
func (s *aggStack) seedWorkspace(t *testing.T, name string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := s.coder.PushTemplate(ctx, "base", testenv.ProviderFreeTemplate()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.coder.CreateWorkspace(ctx, "base", name); err != nil {
		t.Fatal(err)
	}
	return s.workspaceName(name)
}

// lineWatcher follows a long-running command's output line by line.
type lineWatcher struct {
	mu    sync.Mutex
	lines []string
	cmd   *exec.Cmd
	stop  func()
}

func (s *aggStack) startKubectl(t *testing.T, args ...string) *lineWatcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := s.k.Kubectl(s.kubectl).Command(ctx, args...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	w := &lineWatcher{cmd: cmd}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			w.mu.Lock()
			w.lines = append(w.lines, sc.Text())
			w.mu.Unlock()
		}
	}()
	var once sync.Once
	// stop ends the command and waits until its output is read.
	w.stop = func() {
		once.Do(func() {
			cancel()
			_ = cmd.Wait()
			pw.Close()
			<-done
		})
	}
	t.Cleanup(w.stop)
	return w
}

// output is every line read so far.
func (w *lineWatcher) output() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.lines, "\n")
}

// waitLine waits for a line containing every one of parts.
func (w *lineWatcher) waitLine(t *testing.T, timeout time.Duration, parts ...string) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		w.mu.Lock()
		for _, l := range w.lines {
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(l, p)
			}
			if ok {
				w.mu.Unlock()
				return l
			}
		}
		w.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	t.Fatalf("no line with %q within %s; got:\n%s", parts, timeout, strings.Join(w.lines, "\n"))
	return ""
}

// kubectlAs is kubectl as Kubernetes user (a client certificate, in
// group), granted rules in the stack's namespace by a Role and
// RoleBinding named role (none without rules).
func (s *aggStack) kubectlAs(t testing.TB, user, group, role string, rules ...rbacv1.PolicyRule) testenv.Kubectl {
	t.Helper()
	if len(rules) > 0 {
		r := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: role, Namespace: s.ns}, Rules: rules}
		binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role, Namespace: s.ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
		for _, o := range []client.Object{r, binding} {
			if err := s.c.Create(context.Background(), o); err != nil {
				t.Fatal(err)
			}
		}
	}
	kubeconfig, err := s.k.UserKubeconfig(user, group)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "user.kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	return testenv.Kubectl{Path: s.kubectl, Flags: []string{"--kubeconfig", path}}
}

// writeManifest writes a manifest to a temporary file for kubectl -f.
func writeManifest(t testing.TB, manifest string) string {
	t.Helper()
	// Not t.TempDir(): kubectl -f splits paths at commas, which subtest
	// names contain.
	dir, err := os.MkdirTemp("", "manifest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := filepath.Join(dir, "manifest.yaml")
	if err := os.WriteFile(p, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// indent indents every line of s by n spaces (for YAML block scalars).
func indent(s string, n int) string {
	pad := strings.Repeat(" ", n)
	var b bytes.Buffer
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString(pad + l + "\n")
	}
	return b.String()
}

// subtest is one named subtest of a test whose subtests share a fixture
// of type E.
type subtest[E any] struct {
	name string
	run  func(*testing.T, E)
}

// runSubtests runs subtests in order, each as t.Run(name) with env.
func runSubtests[E any](t *testing.T, env E, subtests []subtest[E]) {
	t.Helper()
	for _, st := range subtests {
		t.Run(st.name, func(t *testing.T) { st.run(t, env) })
	}
}
