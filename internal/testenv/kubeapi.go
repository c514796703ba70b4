package testenv

// One file (over 500 lines) for the KubeAPI's lifecycle: starting it, its
// certificates, its users and the APIService registration all work on the
// KubeAPI's process handles and fields.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// quietEnvtestLog gives controller-runtime a logger that drops everything
// unless the test package set its own first (controllertest does; only the
// first SetLogger takes effect). envtest logs through controller-runtime's
// root logger, which otherwise prints a stack trace to stderr when it is
// first used more than 30 s after the process started, and then drops
// everything all the same.
var quietEnvtestLog = sync.OnceFunc(func() { ctrllog.SetLogger(logr.Discard()) })

// KubeAPI is a real kube-apiserver backed by a real etcd, with the
// aggregation layer's front proxy configured as in a cluster and the
// project's CRDs installed.
type KubeAPI struct {
	// Config is an admin (system:masters) client configuration.
	Config *rest.Config
	// KubeconfigPath is a kubeconfig file for Config, for kubectl, helm and
	// the coder-k8s binary.
	KubeconfigPath string
	Clientset      *kubernetes.Clientset
	// Dir holds the kubeconfig and the front-proxy certificates.
	Dir string
	// KubectlCacheDir is this server's own discovery cache for kubectl and
	// helm. Their default cache is keyed by host and port only, and a port
	// another (stopped) kube-apiserver used before would serve that
	// server's resource list: a category or a kind could then name
	// resources this server does not have.
	KubectlCacheDir string
	// ServingCAPath is the CA that signed kube-apiserver's serving
	// certificate (what pods find in kube-root-ca.crt).
	ServingCAPath string

	env *envtest.Environment
}

// KubeAPIOptions tunes StartKubeAPI.
type KubeAPIOptions struct {
	// CRDDirs are directories of CRD manifests to install; empty means the
	// repository's config/crd/bases.
	CRDDirs []string
	// Node prepares the stack for a real node on the network it describes
	// (package nodeenv creates the network and fills it in): kube-apiserver
	// listens on the host's end of that network (not loopback, which pods
	// cannot reach), advertises that address for the kubernetes Service,
	// takes the network's Service subnet, routes aggregated APIs to their
	// Service endpoints, and runs the ServiceAccount admission plugin that
	// gives pods their API credentials.
	Node *NodeServing
	// Args are more kube-apiserver flags, set as given: for example
	// runtime-config and disable-admission-plugins, to serve what an older
	// Kubernetes serves.
	Args map[string]string
}

// NodeServing is what kube-apiserver needs to serve a node's network. The
// network is not the KubeAPI's: its creator removes it after the KubeAPI
// stops.
type NodeServing struct {
	// HostIP is the host's end of the node's network: kube-apiserver
	// listens there, on a free port, and advertises it.
	HostIP net.IP
	// ServiceCIDR is kube-apiserver's --service-cluster-ip-range.
	ServiceCIDR string
	// KubernetesServiceIP is the kubernetes Service's address, the first of
	// ServiceCIDR; the serving certificate is valid for it.
	KubernetesServiceIP net.IP
}

// kubeAPIStartTimeout bounds each attempt to start etcd and kube-apiserver.
const kubeAPIStartTimeout = 90 * time.Second

// frontProxyUser is the identity kube-apiserver presents when it proxies a
// request to an aggregated API server, as in clusters set up by kubeadm.
const frontProxyUser = "front-proxy-client"

// StartKubeAPI starts etcd and kube-apiserver and installs the CRDs.
func StartKubeAPI(ctx context.Context, opts KubeAPIOptions) (*KubeAPI, error) {
	Sweep()
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if _, err := Binary(name); err != nil {
			return nil, err
		}
	}
	crdDirs := opts.CRDDirs
	if len(crdDirs) == 0 {
		root, err := RepoRoot()
		if err != nil {
			return nil, err
		}
		if d := filepath.Join(root, "config", "crd", "bases"); dirExists(d) {
			crdDirs = []string{d}
		}
	}
	dir, err := newStackDir("kube")
	if err != nil {
		return nil, err
	}
	k := &KubeAPI{Dir: dir}

	// The front proxy: kube-apiserver authenticates to aggregated API
	// servers with this client certificate and passes the user in
	// X-Remote-* headers, which aggregated servers trust because the
	// certificate chains to the requestheader CA.
	proxyCA, err := NewCA("front-proxy-ca")
	if err != nil {
		return nil, err
	}
	proxyClient, err := proxyCA.ClientCert(frontProxyUser)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		"front-proxy-ca.crt":     proxyCA.CertPEM,
		"front-proxy-client.crt": proxyClient.CertPEM,
		"front-proxy-client.key": proxyClient.KeyPEM,
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return nil, fmt.Errorf("write %s: %w", name, err)
		}
	}

	k.env = &envtest.Environment{
		BinaryAssetsDirectory: bin,
		CRDDirectoryPaths:     crdDirs,
		ErrorIfCRDPathMissing: len(opts.CRDDirs) > 0,
		// envtest's 20 s per attempt is too short on a loaded two-core
		// machine: each retry kills a kube-apiserver that was about to
		// become ready and starts over.
		ControlPlaneStartTimeout: kubeAPIStartTimeout,
	}
	// A certificate directory of our own: envtest removes one it made
	// itself when kube-apiserver stops, and a restart would then come back
	// with new serving and service account keys.
	certDir := filepath.Join(dir, "apiserver")
	if err := os.Mkdir(certDir, 0o700); err != nil {
		return nil, fmt.Errorf("create kube-apiserver certificate directory: %w", err)
	}
	api := k.env.ControlPlane.GetAPIServer()
	api.CertDir = certDir
	args := api.Configure()
	// 10.0.0.1: the kubernetes Service in envtest's service range.
	servingIPs := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 0, 0, 1)}
	if node := opts.Node; node != nil {
		host := node.HostIP.String()
		port, err := freePortOn(host)
		if err != nil {
			k.Stop()
			return nil, err
		}
		api.SecureServing.Address, api.SecureServing.Port = host, strconv.Itoa(port)
		servingIPs = []net.IP{net.IPv4(127, 0, 0, 1), node.KubernetesServiceIP, node.HostIP}
		args.Set("service-cluster-ip-range", node.ServiceCIDR)
		args.Set("advertise-address", host)
		args.Set("enable-aggregator-routing", "true")
		args.Set("kubelet-preferred-address-types", "InternalIP")
		args.Disable("disable-admission-plugins")
	}
	if err := k.writeServingCerts(certDir, servingIPs); err != nil {
		k.Stop()
		return nil, err
	}
	for flag, value := range opts.Args {
		args.Set(flag, value)
	}
	args.Set("requestheader-client-ca-file", filepath.Join(dir, "front-proxy-ca.crt"))
	args.Set("requestheader-allowed-names", frontProxyUser)
	args.Set("requestheader-username-headers", "X-Remote-User")
	args.Set("requestheader-group-headers", "X-Remote-Group")
	args.Set("requestheader-extra-headers-prefix", "X-Remote-Extra-")
	args.Set("proxy-client-cert-file", filepath.Join(dir, "front-proxy-client.crt"))
	args.Set("proxy-client-key-file", filepath.Join(dir, "front-proxy-client.key"))
	// On SIGTERM, end open watches (clients re-establish them elsewhere)
	// instead of waiting for them until the one-minute request timeout.
	args.Set("shutdown-watch-termination-grace-period", "2s")

	quietEnvtestLog()
	cfg, err := k.env.Start()
	if err != nil {
		k.Stop()
		return nil, fmt.Errorf("start kube-apiserver and etcd: %w", err)
	}
	k.Config = cfg
	if k.Clientset, err = kubernetes.NewForConfig(cfg); err != nil {
		k.Stop()
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	user, err := k.env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		k.Stop()
		return nil, fmt.Errorf("add admin user: %w", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		k.Stop()
		return nil, fmt.Errorf("admin kubeconfig: %w", err)
	}
	k.KubeconfigPath = filepath.Join(dir, "kubeconfig")
	k.KubectlCacheDir = filepath.Join(dir, "kubectl-cache")
	if err := os.WriteFile(k.KubeconfigPath, kubeconfig, 0o600); err != nil {
		k.Stop()
		return nil, fmt.Errorf("write kubeconfig: %w", err)
	}
	return k, nil
}

// writeServingCerts writes kube-apiserver's serving certificate, valid for
// the kubernetes Service's names and address as well as loopback (envtest's
// own is valid for loopback only, so pods could not verify it), and its
// service account signing key, where envtest expects them; envtest then
// keeps them.
func (k *KubeAPI) writeServingCerts(certDir string, ips []net.IP) error {
	ca, err := NewCA("kube-apiserver-ca")
	if err != nil {
		return err
	}
	serving, err := ca.ServingCert([]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
		"kubernetes.default.svc.cluster.local"}, ips)
	if err != nil {
		return err
	}
	signer, err := NewCA("service-account-signer")
	if err != nil {
		return err
	}
	signerKey, err := signer.KeyPEM()
	if err != nil {
		return err
	}
	k.ServingCAPath = filepath.Join(certDir, "ca.crt")
	files := map[string][]byte{
		"apiserver.crt": serving.CertPEM, "apiserver.key": serving.KeyPEM,
		"sa-signer.crt": signer.CertPEM, "sa-signer.key": signerKey,
		"ca.crt": ca.CertPEM,
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(certDir, name), b, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	k.env.ControlPlane.GetAPIServer().SecureServing.CA = ca.CertPEM
	return nil
}

// KubectlFlags are the flags that point kubectl at k as the cluster admin,
// with k's own discovery cache.
func (k *KubeAPI) KubectlFlags() []string {
	return []string{"--kubeconfig", k.KubeconfigPath, "--cache-dir", k.KubectlCacheDir}
}

// NewKubeAPI starts a KubeAPI for a test and stops it when the test ends.
func NewKubeAPI(t testing.TB, opts KubeAPIOptions) *KubeAPI {
	t.Helper()
	k, err := StartKubeAPI(context.Background(), opts)
	if err != nil {
		t.Fatalf("kube-apiserver: %v", err)
	}
	t.Cleanup(k.Stop)
	return k
}

// Stop stops kube-apiserver and etcd and removes their data.
func (k *KubeAPI) Stop() {
	if k.env != nil {
		_ = k.env.Stop()
		k.env = nil
	}
	if k.Dir != "" {
		removeStackDir(k.Dir)
	}
}

// StopAPIServer stops kube-apiserver alone: etcd keeps running, and the
// port, certificates and service account keys stay, so StartAPIServer
// brings back the same cluster.
func (k *KubeAPI) StopAPIServer() error {
	if k.env == nil {
		return errors.New("stop kube-apiserver: the stack is not running")
	}
	if err := k.env.ControlPlane.APIServer.Stop(); err != nil {
		return fmt.Errorf("stop kube-apiserver: %w", err)
	}
	return nil
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, on the
// same port with the same certificates, flags and etcd, and waits until
// its /readyz answers ok.
func (k *KubeAPI) StartAPIServer(ctx context.Context) error {
	if k.env == nil {
		return errors.New("start kube-apiserver: the stack is not running")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("start kube-apiserver: %w", err)
	}
	// envtest's Start waits for /healthz up to its start timeout (20s by
	// default): ctx's deadline, when it has one, bounds it instead.
	api := k.env.ControlPlane.APIServer
	if deadline, ok := ctx.Deadline(); ok {
		api.StartTimeout = time.Until(deadline)
	}
	if err := api.Start(); err != nil {
		return fmt.Errorf("start kube-apiserver: %w", err)
	}
	// /healthz can pass before the post-start hooks (RBAC bootstrap, the
	// aggregator's controllers) have finished; /readyz waits for them.
	var last error
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		body, err := k.Clientset.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(rctx)
		cancel()
		if err == nil {
			return nil
		}
		last = fmt.Errorf("%w: %s", err, body)
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready after a restart: %v", last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// UserConfig returns a client configuration authenticating as user name in
// groups, with no permissions beyond what RBAC grants them.
func (k *KubeAPI) UserConfig(name string, groups ...string) (*rest.Config, error) {
	u, err := k.env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return nil, fmt.Errorf("add user %q: %w", name, err)
	}
	return u.Config(), nil
}

// UserKubeconfig returns a kubeconfig file's content authenticating as
// user name in groups (a client certificate), with no permissions beyond
// what RBAC grants them.
func (k *KubeAPI) UserKubeconfig(name string, groups ...string) ([]byte, error) {
	u, err := k.env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return nil, fmt.Errorf("add user %q: %w", name, err)
	}
	b, err := u.KubeConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig of user %q: %w", name, err)
	}
	return b, nil
}

// APIService describes an aggregated API server running on this machine
// that kube-apiserver should route a group version to.
type APIService struct {
	Group, Version string
	// Port is where the server listens on localhost.
	Port int
	// CABundle verifies the server's certificate, which must be valid for
	// ServiceDNSName(ServiceName, ServiceNamespace).
	CABundle []byte
	// ServiceName and ServiceNamespace name the ExternalName Service that
	// points at the server.
	ServiceName, ServiceNamespace string
	// Timeout bounds the wait for discovery; zero means one minute.
	Timeout time.Duration
}

// ServiceDNSName is the name kube-apiserver's aggregator checks an
// aggregated server's certificate against.
func ServiceDNSName(name, namespace string) string { return name + "." + namespace + ".svc" }

// RegisterAPIService routes svc's group version through kube-apiserver to
// a server on localhost: an ExternalName Service (Endpoints may not hold
// loopback addresses) and an APIService carrying the CA bundle. It waits
// until kube-apiserver's discovery lists the group version's resources.
func (k *KubeAPI) RegisterAPIService(ctx context.Context, svc APIService) error {
	if svc.Group == "" || svc.Version == "" || svc.Port == 0 || svc.ServiceName == "" || svc.ServiceNamespace == "" {
		return errors.New("register APIService: group, version, port, service name and namespace are required")
	}
	if err := k.EnsureNamespace(ctx, svc.ServiceNamespace); err != nil {
		return err
	}
	service := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svc.ServiceName, Namespace: svc.ServiceNamespace},
		Spec: corev1.ServiceSpec{
			Type:         corev1.ServiceTypeExternalName,
			ExternalName: "localhost",
			Ports: []corev1.ServicePort{{
				Name: "https", Port: int32(svc.Port), TargetPort: intstr.FromInt(svc.Port), Protocol: corev1.ProtocolTCP,
			}},
		},
	}
	services := k.Clientset.CoreV1().Services(svc.ServiceNamespace)
	if _, err := services.Create(ctx, service, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		existing, err := services.Get(ctx, svc.ServiceName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get service %s: %w", svc.ServiceName, err)
		}
		existing.Spec = service.Spec
		if _, err := services.Update(ctx, existing, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update service %s: %w", svc.ServiceName, err)
		}
	} else if err != nil {
		return fmt.Errorf("create service %s: %w", svc.ServiceName, err)
	}

	agg, err := aggregatorclient.NewForConfig(k.Config)
	if err != nil {
		return fmt.Errorf("aggregator client: %w", err)
	}
	port := int32(svc.Port)
	apiService := &apiregistrationv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: svc.Version + "." + svc.Group},
		Spec: apiregistrationv1.APIServiceSpec{
			Group:                svc.Group,
			Version:              svc.Version,
			Service:              &apiregistrationv1.ServiceReference{Namespace: svc.ServiceNamespace, Name: svc.ServiceName, Port: &port},
			CABundle:             svc.CABundle,
			GroupPriorityMinimum: 1000,
			VersionPriority:      15,
		},
	}
	apiServices := agg.ApiregistrationV1().APIServices()
	if _, err := apiServices.Create(ctx, apiService, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		// The aggregator writes the status meanwhile: retry on conflicts.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			existing, err := apiServices.Get(ctx, apiService.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			existing.Spec = apiService.Spec
			_, err = apiServices.Update(ctx, existing, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			return fmt.Errorf("update APIService %s: %w", apiService.Name, err)
		}
	} else if err != nil {
		return fmt.Errorf("create APIService %s: %w", apiService.Name, err)
	}

	timeout := svc.Timeout
	if timeout == 0 {
		timeout = time.Minute
	}
	return k.WaitForDiscovery(ctx, svc.Group+"/"+svc.Version, timeout)
}

// UnregisterAPIService removes the APIService for group/version, so that
// kube-apiserver stops routing (and reporting discovery errors for) it.
func (k *KubeAPI) UnregisterAPIService(ctx context.Context, group, version string) error {
	agg, err := aggregatorclient.NewForConfig(k.Config)
	if err != nil {
		return fmt.Errorf("aggregator client: %w", err)
	}
	err = agg.ApiregistrationV1().APIServices().Delete(ctx, version+"."+group, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete APIService %s.%s: %w", version, group, err)
	}
	return nil
}

// EnsureNamespace creates namespace name unless it exists.
func (k *KubeAPI) EnsureNamespace(ctx context.Context, name string) error {
	return EnsureNamespace(ctx, k.Clientset, name)
}

// EnsureNamespace creates namespace name with cs unless it exists.
func EnsureNamespace(ctx context.Context, cs kubernetes.Interface, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", name, err)
	}
	return nil
}

// WaitForDiscovery waits until kube-apiserver's discovery serves resources
// for groupVersion; on timeout the error includes the APIService status.
func (k *KubeAPI) WaitForDiscovery(ctx context.Context, groupVersion string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		list, err := k.Clientset.Discovery().ServerResourcesForGroupVersion(groupVersion)
		switch {
		case err != nil:
			last = err
		case len(list.APIResources) == 0:
			last = errors.New("no resources listed")
		default:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("discovery of %s through kube-apiserver: %v; %s", groupVersion, last, k.apiServiceStatus(groupVersion))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (k *KubeAPI) apiServiceStatus(groupVersion string) string {
	agg, err := aggregatorclient.NewForConfig(k.Config)
	if err != nil {
		return ""
	}
	group, version := splitGroupVersion(groupVersion)
	s, err := agg.ApiregistrationV1().APIServices().Get(context.Background(), version+"."+group, metav1.GetOptions{})
	if err != nil {
		return fmt.Sprintf("APIService: %v", err)
	}
	out := "APIService conditions:"
	for _, c := range s.Status.Conditions {
		out += fmt.Sprintf(" %s=%s (%s: %s)", c.Type, c.Status, c.Reason, c.Message)
	}
	return out
}

func splitGroupVersion(gv string) (group, version string) {
	for i := len(gv) - 1; i >= 0; i-- {
		if gv[i] == '/' {
			return gv[:i], gv[i+1:]
		}
	}
	return "", gv
}

func dirExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}
