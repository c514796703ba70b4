package autotls

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/server"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

// The integration tests share one kube-apiserver, started by the first
// test that needs it (the unit tests run without one).
var (
	kubeOnce sync.Once
	kube     *testenv.KubeAPI
	kubeErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if kube != nil {
		kube.Stop()
	}
	os.Exit(code)
}

func kubeAPI(t *testing.T) *testenv.KubeAPI {
	t.Helper()
	kubeOnce.Do(func() { kube, kubeErr = testenv.StartKubeAPI(context.Background(), testenv.KubeAPIOptions{}) })
	if kubeErr != nil {
		t.Fatalf("kube-apiserver: %v", kubeErr)
	}
	return kube
}

// fixture is a namespace and an APIService without caBundle routing to
// Service "aggregated" there, as the Helm chart creates them.
type fixture struct {
	k   *testenv.KubeAPI
	agg aggregatorclient.Interface
	// opts are the Rotator's options but its client and logger.
	opts Options
	ns   string
}

func newFixture(t *testing.T, prefix string) *fixture {
	t.Helper()
	k := kubeAPI(t)
	ctx := context.Background()
	id := randomHex(3)
	ns := prefix + "-" + id
	if err := k.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	agg, err := aggregatorclient.NewForConfig(k.Config)
	if err != nil {
		t.Fatal(err)
	}
	group := prefix + "-" + id + ".autotls.test"
	svc := &apiregistrationv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: "v1." + group},
		Spec: apiregistrationv1.APIServiceSpec{
			Group: group, Version: "v1",
			Service:              &apiregistrationv1.ServiceReference{Namespace: ns, Name: "aggregated"},
			GroupPriorityMinimum: 100, VersionPriority: 10,
		},
	}
	if _, err := agg.ApiregistrationV1().APIServices().Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = agg.ApiregistrationV1().APIServices().Delete(context.Background(), svc.Name, metav1.DeleteOptions{})
	})
	return &fixture{
		k: k, agg: agg, ns: ns,
		opts: Options{
			SecretName: "aggregated-tls", Namespace: ns, ServiceName: "aggregated",
			APIServiceName: svc.Name, CertValidity: 24 * time.Hour,
		},
	}
}

// serviceDNSName is the name kube-apiserver verifies.
func (f *fixture) serviceDNSName() string { return testenv.ServiceDNSName(f.opts.ServiceName, f.ns) }

func (f *fixture) secret(t *testing.T) *corev1.Secret {
	t.Helper()
	s, err := f.k.Clientset.CoreV1().Secrets(f.ns).Get(context.Background(), f.opts.SecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (f *fixture) apiService(t *testing.T) *apiregistrationv1.APIService {
	t.Helper()
	s, err := f.agg.ApiregistrationV1().APIServices().Get(context.Background(), f.opts.APIServiceName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// updateAPIService changes the APIService's spec as a person would
// (kube-apiserver writes its status meanwhile: retry on conflicts).
func (f *fixture) updateAPIService(t *testing.T, mutate func(*apiregistrationv1.APIServiceSpec)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc := f.apiService(t)
		mutate(&svc.Spec)
		_, err := f.agg.ApiregistrationV1().APIServices().Update(context.Background(), svc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// newRotator builds a Rotator for f as the identity of rc.
func (f *fixture) newRotator(t *testing.T, rc *rest.Config, mutate func(*Options)) *Rotator {
	t.Helper()
	o := f.opts
	o.REST, o.Log = rc, testr.New(t)
	if mutate != nil {
		mutate(&o)
	}
	r, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// run starts r until the test ends.
func run(t *testing.T, r *Rotator) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	})
}

func waitContent(t *testing.T, r *Rotator) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.ServingCert().WaitForContent(ctx); err != nil {
		t.Fatalf("no serving certificate: %v", err)
	}
}

// rbacMarker matches the RBAC markers of rbac.go.
var rbacMarker = regexp.MustCompile(`(?m)^// \+kubebuilder:rbac:groups=([^,]*),resources=([^,]+)(?:,resourceNames=([^,]+))?,verbs=(\S+)$`)

// restrictedConfig is a user holding exactly the RBAC markers' verbs,
// restricted as the Helm chart restricts them: the Secret's verbs to its
// name in a Role (except create, which resourceNames cannot restrict), the
// APIService's to its name.
func (f *fixture) restrictedConfig(t *testing.T) *rest.Config {
	t.Helper()
	src, err := os.ReadFile("rbac.go")
	if err != nil {
		t.Fatal(err)
	}
	var role, clusterRole []rbacv1.PolicyRule
	for _, m := range rbacMarker.FindAllStringSubmatch(string(src), -1) {
		group, resources, names, verbs := strings.Trim(m[1], `"`), strings.Split(m[2], ";"), m[3], strings.Split(m[4], ";")
		switch {
		case group == "" && slices.Equal(resources, []string{"secrets"}):
			named := slices.DeleteFunc(slices.Clone(verbs), func(v string) bool { return v == "create" })
			role = append(role, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: resources, ResourceNames: []string{f.opts.SecretName}, Verbs: named})
			if slices.Contains(verbs, "create") {
				role = append(role, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: resources, Verbs: []string{"create"}})
			}
		case group == apiregistrationv1.GroupName && slices.Equal(resources, []string{"apiservices"}):
			if names != "v1alpha1.aggregation.coder.com" {
				t.Fatalf("apiservices marker names %q", names)
			}
			clusterRole = append(clusterRole, rbacv1.PolicyRule{APIGroups: []string{group}, Resources: resources, ResourceNames: []string{f.opts.APIServiceName}, Verbs: verbs})
		default:
			t.Fatalf("marker for %s %v: teach restrictedConfig about it", group, resources)
		}
	}
	if len(role) == 0 || len(clusterRole) == 0 {
		t.Fatal("RBAC markers not found in rbac.go")
	}
	user := "autotls-" + f.ns
	ctx := context.Background()
	rb := f.k.Clientset.RbacV1()
	subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(rb.Roles(f.ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: role}, metav1.CreateOptions{}))
	must(rb.RoleBindings(f.ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user}, Subjects: subjects,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
	}, metav1.CreateOptions{}))
	must(rb.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: clusterRole}, metav1.CreateOptions{}))
	must(rb.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user}, Subjects: subjects,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
	}, metav1.CreateOptions{}))
	t.Cleanup(func() {
		_ = rb.ClusterRoleBindings().Delete(context.Background(), user, metav1.DeleteOptions{})
		_ = rb.ClusterRoles().Delete(context.Background(), user, metav1.DeleteOptions{})
	})
	rc, err := f.k.UserConfig(user)
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// serve serves r's certificate the way the aggregated API server does (a
// k8s.io/apiserver SecureServingInfo with a dynamic certificate) and
// returns the address.
func serve(t *testing.T, r *Rotator) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	info := &server.SecureServingInfo{Listener: ln, Cert: r.ServingCert()}
	stop := make(chan struct{})
	stopped, _, err := info.Serve(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }), time.Second, stop)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(stop); <-stopped })
	return ln.Addr().String()
}

// servedLeaf connects to addr and returns the certificate it presents,
// unverified.
func servedLeaf(t *testing.T, addr string) *x509.Certificate {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // verified by the caller
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

// verifiedLeaf connects to addr as kube-apiserver's aggregator does: the
// APIService's caBundle as the roots, <service>.<namespace>.svc as the
// name.
func (f *fixture) verifiedLeaf(t *testing.T, addr string) (*x509.Certificate, error) {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(f.apiService(t).Spec.CABundle) {
		return nil, errors.New("APIService caBundle holds no certificate")
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{RootCAs: pool, ServerName: f.serviceDNSName()})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

// Two replicas starting together, with only the RBAC the chart grants,
// agree on one CA and one serving certificate, and put the CA into the
// APIService.
func TestReplicasConvergeOnOneCA(t *testing.T) {
	f := newFixture(t, "converge")
	rc := f.restrictedConfig(t)
	replicas := []*Rotator{f.newRotator(t, rc, nil), f.newRotator(t, rc, nil)}
	for _, r := range replicas {
		run(t, r)
	}
	for _, r := range replicas {
		waitContent(t, r)
	}

	var secret *corev1.Secret
	testenv.WaitFor(t, 10*time.Second, func() error {
		secret = f.secret(t)
		for i, r := range replicas {
			if cert, _ := r.ServingCert().CurrentCertKeyContent(); !bytes.Equal(cert, secret.Data[TLSCertKey]) {
				return fmt.Errorf("replica %d serves another certificate than the Secret's", i)
			}
		}
		if got := f.apiService(t).Spec.CABundle; !bytes.Equal(got, secret.Data[CABundleKey]) {
			return fmt.Errorf("APIService caBundle (%d bytes) is not the Secret's bundle", len(got))
		}
		return nil
	})

	if secret.Type != corev1.SecretTypeTLS || secret.Labels[coderv1alpha1.LabelManagedBy] != coderv1alpha1.ManagedByValue {
		t.Errorf("Secret type %s labels %v", secret.Type, secret.Labels)
	}
	ca := mustParse(t, secret.Data[CACertKey])
	if b := parseCerts(secret.Data[CABundleKey]); len(b) != 1 || !b[0].Equal(ca) {
		t.Errorf("bundle holds %d certificates, want the CA alone", len(b))
	}
	if d := time.Until(ca.NotAfter); d < DefaultCAValidity-time.Minute {
		t.Errorf("CA valid for %s, want 10 years", d)
	}
	leaf := mustParse(t, secret.Data[TLSCertKey])
	if want := DNSNames("aggregated", f.ns); !slices.Equal(leaf.DNSNames, want) {
		t.Errorf("serving certificate names %v, want %v", leaf.DNSNames, want)
	}
	if err := verifyServing(leaf, []*x509.Certificate{ca}, f.serviceDNSName(), time.Now()); err != nil {
		t.Errorf("serving certificate: %v", err)
	}
	if svc := f.apiService(t); svc.Spec.InsecureSkipTLSVerify {
		t.Error("insecureSkipTLSVerify set")
	}

	// Settled: the replicas stop writing.
	rv := secret.ResourceVersion
	time.Sleep(3 * time.Second)
	if got := f.secret(t).ResourceVersion; got != rv {
		t.Errorf("Secret still changing after convergence (resourceVersion %s -> %s)", rv, got)
	}
}

// Many replicas making their first pass at the same moment race to create
// the Secret; the losers adopt the winner's certificates.
func TestConcurrentFirstPassesAgree(t *testing.T) {
	f := newFixture(t, "race")
	replicas := make([]*Rotator, 6)
	for i := range replicas {
		replicas[i] = f.newRotator(t, f.k.Config, nil)
	}
	start := make(chan struct{})
	errs := make([]error, len(replicas))
	var wg sync.WaitGroup
	for i, r := range replicas {
		wg.Go(func() {
			<-start
			_, errs[i] = r.Sync(context.Background())
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	secret := f.secret(t)
	for i, r := range replicas {
		if cert, _ := r.ServingCert().CurrentCertKeyContent(); !bytes.Equal(cert, secret.Data[TLSCertKey]) {
			t.Errorf("replica %d serves a certificate that is not the Secret's", i)
		}
	}
	if !bytes.Equal(f.apiService(t).Spec.CABundle, secret.Data[CABundleKey]) {
		t.Error("APIService caBundle is not the Secret's bundle")
	}
	// Another pass by each changes nothing.
	rv := secret.ResourceVersion
	for _, r := range replicas {
		if _, err := r.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.secret(t).ResourceVersion; got != rv {
		t.Errorf("a second pass rewrote the Secret (%s -> %s)", rv, got)
	}
}

// A serving certificate due for renewal is replaced in the Secret, and the
// server serves the new one without a restart; kube-apiserver's view (the
// APIService's caBundle) verifies both.
func TestRenewalChangesTheServedCertificateWithoutRestart(t *testing.T) {
	f := newFixture(t, "renew")
	f.opts.CertValidity = 6 * time.Second // renewed about 4s after issue
	r := f.newRotator(t, f.k.Config, nil)
	run(t, r)
	waitContent(t, r)
	addr := serve(t, r)

	var first *x509.Certificate
	testenv.WaitFor(t, 10*time.Second, func() (err error) {
		first, err = f.verifiedLeaf(t, addr)
		return err
	})
	caPEM := f.secret(t).Data[CACertKey]

	var renewed *x509.Certificate
	testenv.WaitFor(t, 20*time.Second, func() error {
		leaf, err := f.verifiedLeaf(t, addr)
		if err != nil {
			return err
		}
		if leaf.Equal(first) {
			return errors.New("still serving the first certificate")
		}
		renewed = leaf
		return nil
	})
	if !renewed.NotAfter.After(first.NotAfter) {
		t.Errorf("renewed certificate expires %s, not after the first (%s)", renewed.NotAfter, first.NotAfter)
	}
	if got := renewed.NotAfter.Sub(renewed.NotBefore); got > 7*time.Second {
		t.Errorf("renewed certificate valid for %s, want certValidity (6s) plus the backdate", got)
	}
	secret := f.secret(t)
	if !bytes.Equal(secret.Data[CACertKey], caPEM) {
		t.Error("the CA changed on a serving certificate renewal")
	}
	if stored := mustParse(t, secret.Data[TLSCertKey]); stored.NotBefore.Before(renewed.NotBefore) {
		t.Error("the Secret holds an older certificate than the one served")
	}
}

// A CA due for renewal is replaced; the APIService trusts old and new CA,
// the served certificate moves to the new CA, and at every moment the
// served certificate verifies against the APIService's caBundle.
func TestCARotationKeepsTheServerTrusted(t *testing.T) {
	f := newFixture(t, "carotate")
	f.opts.CertValidity = time.Hour // capped by the CA's expiry
	r := f.newRotator(t, f.k.Config, func(o *Options) { o.caValidity = 12 * time.Second })
	run(t, r)
	waitContent(t, r)
	addr := serve(t, r)
	testenv.WaitFor(t, 10*time.Second, func() error { _, err := f.verifiedLeaf(t, addr); return err })
	oldCA := mustParse(t, f.secret(t).Data[CACertKey])

	deadline := time.Now().Add(25 * time.Second)
	var newCA *x509.Certificate
	for {
		if time.Now().After(deadline) {
			t.Fatalf("the served certificate did not move to a new CA; Secret CA %s", mustParse(t, f.secret(t).Data[CACertKey]).Subject.CommonName)
		}
		// The certificate served now must verify against the caBundle
		// kube-apiserver holds from now on.
		leaf := servedLeaf(t, addr)
		bundle := parseCerts(f.apiService(t).Spec.CABundle)
		if err := verifyServing(leaf, bundle, f.serviceDNSName(), time.Now()); err != nil {
			t.Fatalf("served certificate (issuer %s) does not verify against the APIService caBundle (%d certificates): %v", leaf.Issuer.CommonName, len(bundle), err)
		}
		if ca := mustParse(t, f.secret(t).Data[CACertKey]); !ca.Equal(oldCA) && leaf.CheckSignatureFrom(ca) == nil {
			newCA = ca
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	bundle := parseCerts(f.apiService(t).Spec.CABundle)
	if !slices.ContainsFunc(bundle, newCA.Equal) || !slices.ContainsFunc(bundle, oldCA.Equal) {
		t.Errorf("APIService caBundle holds %d certificates, want the new and the old CA", len(bundle))
	}
}

// A caBundle removed from the APIService (a manifest re-applied) is
// written back within seconds, and insecureSkipTLSVerify is cleared.
func TestAPIServiceCABundleIsRestored(t *testing.T) {
	f := newFixture(t, "restore")
	r := f.newRotator(t, f.k.Config, nil)
	run(t, r)
	waitContent(t, r)
	want := func() error {
		svc := f.apiService(t)
		if !bytes.Equal(svc.Spec.CABundle, f.secret(t).Data[CABundleKey]) || svc.Spec.InsecureSkipTLSVerify {
			return fmt.Errorf("caBundle %d bytes, insecureSkipTLSVerify %v", len(svc.Spec.CABundle), svc.Spec.InsecureSkipTLSVerify)
		}
		return nil
	}
	testenv.WaitFor(t, 10*time.Second, want)

	f.updateAPIService(t, func(s *apiregistrationv1.APIServiceSpec) {
		s.CABundle = nil
		s.InsecureSkipTLSVerify = true
	})
	testenv.WaitFor(t, 5*time.Second, want)
}

// The caBundle is never written into an APIService that routes to another
// Service.
func TestAPIServiceOfAnotherServiceIsLeftAlone(t *testing.T) {
	f := newFixture(t, "other")
	f.updateAPIService(t, func(s *apiregistrationv1.APIServiceSpec) { s.Service.Name = "someone-else" })
	r := f.newRotator(t, f.k.Config, nil)
	_, err := r.Sync(context.Background())
	if err == nil || !strings.Contains(err.Error(), "someone-else") {
		t.Fatalf("Sync: %v, want an error naming the other Service", err)
	}
	if got := f.apiService(t).Spec.CABundle; len(got) != 0 {
		t.Error("caBundle written")
	}
	// The certificate is served all the same.
	if c, _ := r.ServingCert().CurrentCertKeyContent(); len(c) == 0 {
		t.Error("no serving certificate")
	}
}

func TestNewUsesThePodNamespace(t *testing.T) {
	t.Setenv(PodNamespaceEnv, "from-env")
	r, err := New(Options{
		SecretName: "s", ServiceName: "svc", APIServiceName: "v1.x", CertValidity: time.Hour,
		REST: &rest.Config{Host: "https://127.0.0.1:1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Namespace() != "from-env" || !slices.Contains(r.DNSNames(), "svc.from-env.svc") {
		t.Errorf("namespace %q names %v", r.Namespace(), r.DNSNames())
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
