package autotls

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	apiregistrationv1client "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset/typed/apiregistration/v1"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

// Timing of the loop.
const (
	// DefaultResync is the longest the Rotator goes without re-reading the
	// Secret and the APIService, watch events aside.
	DefaultResync = time.Hour
	// heldRetry is how soon a plan that held back a serving certificate
	// is made again.
	heldRetry = 2 * time.Second
	// minInterval separates two passes, so that replicas disagreeing
	// (a rollout changing serviceName) cannot write in a tight loop.
	minInterval = time.Second
	// maxBackoff caps the wait after failed passes.
	maxBackoff = time.Minute
	// writeAttempts bounds the re-reads after lost write races in one pass.
	writeAttempts = 5
)

// Options configure a Rotator.
type Options struct {
	// SecretName is the Secret holding the CA and the serving
	// certificate, shared by every replica.
	SecretName string
	// Namespace of the Secret and the Service; empty means the pod's own
	// (see ResolveNamespace).
	Namespace string
	// ServiceName is the Service kube-apiserver reaches the server
	// through: the certificate names <service>.<namespace>.svc.
	ServiceName string
	// APIServiceName is the APIService whose caBundle is kept equal to
	// the CA bundle.
	APIServiceName string
	// CertValidity is how long a serving certificate is valid; it is
	// renewed when a third of that is left.
	CertValidity time.Duration
	// REST reaches kube-apiserver. The Rotator reads and writes the Secret
	// and the APIService directly (no shared cache), and watches only
	// those two objects (field selector metadata.name).
	REST *rest.Config
	Log  logr.Logger

	// caValidity overrides DefaultCAValidity (tests).
	caValidity time.Duration
	// resync overrides DefaultResync (tests).
	resync time.Duration
}

// Rotator keeps the CA and the serving certificate in one Secret that
// every replica shares, renews them before they expire, serves the
// certificate through ServingCert, and keeps the APIService's caBundle
// equal to the CA bundle. Every replica runs one (NeedLeaderElection is
// false); they converge on the Secret's content through optimistic
// concurrency: create-if-absent, and updates carrying the resourceVersion,
// where the loser of a race re-reads and uses the winner's certificates.
type Rotator struct {
	secretName     string
	serviceName    string
	apiServiceName string
	certValidity   time.Duration
	namespace      string
	dnsNames       []string
	caValidity     time.Duration
	resync         time.Duration

	secrets     corev1client.SecretInterface
	apiServices apiregistrationv1client.APIServiceInterface

	cert *ServingCert
	log  logr.Logger
	now  func() time.Time
	poke chan struct{}

	// apiServiceMissing avoids repeating the same log line every pass.
	apiServiceMissing bool
}

// New returns a Rotator for o. It fails when the namespace cannot be
// determined or the configuration is incomplete.
func New(o Options) (*Rotator, error) {
	switch {
	case o.SecretName == "":
		return nil, errors.New("secretName is empty")
	case o.ServiceName == "":
		return nil, errors.New("serviceName is empty")
	case o.APIServiceName == "":
		return nil, errors.New("apiServiceName is empty")
	case o.CertValidity <= 0:
		return nil, fmt.Errorf("certValidity %s is not positive", o.CertValidity)
	case o.REST == nil:
		return nil, errors.New("no Kubernetes client configuration")
	}
	ns, err := ResolveNamespace(o.Namespace)
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(o.REST)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	agg, err := aggregatorclient.NewForConfig(o.REST)
	if err != nil {
		return nil, fmt.Errorf("apiregistration client: %w", err)
	}
	r := &Rotator{
		secretName:     o.SecretName,
		serviceName:    o.ServiceName,
		apiServiceName: o.APIServiceName,
		certValidity:   o.CertValidity,
		namespace:      ns,
		dnsNames:       DNSNames(o.ServiceName, ns),
		caValidity:     o.caValidity,
		resync:         o.resync,
		secrets:        kube.CoreV1().Secrets(ns),
		apiServices:    agg.ApiregistrationV1().APIServices(),
		cert:           NewServingCert(fmt.Sprintf("secret %s/%s", ns, o.SecretName)),
		log:            o.Log.WithName("autotls").WithValues("secret", ns+"/"+o.SecretName, "apiService", o.APIServiceName),
		now:            time.Now,
		poke:           make(chan struct{}, 1),
	}
	if r.caValidity == 0 {
		r.caValidity = DefaultCAValidity
	}
	if r.resync == 0 {
		r.resync = DefaultResync
	}
	return r, nil
}

// ServingCert is the certificate to serve; it changes whenever the
// Secret's does.
func (r *Rotator) ServingCert() *ServingCert { return r.cert }

// Namespace is the namespace of the Secret and the Service.
func (r *Rotator) Namespace() string { return r.namespace }

// DNSNames are the names the serving certificate carries.
func (r *Rotator) DNSNames() []string { return append([]string(nil), r.dnsNames...) }

// NeedLeaderElection is false: every replica serves TLS.
func (r *Rotator) NeedLeaderElection() bool { return false }

// Start keeps the certificates until ctx is cancelled. It makes a pass
// at once, whenever the Secret or the APIService changes, when a
// certificate falls due, and at least every resync period; failed passes
// are retried with backoff (doubling from a second to a minute) and
// logged. It returns nil when ctx ends.
func (r *Rotator) Start(ctx context.Context) error {
	r.log.Info("managing the aggregated API server's serving certificate", "dnsNames", r.dnsNames, "certValidity", r.certValidity.String())
	ctx, cancel := context.WithCancel(ctx)
	var watchers sync.WaitGroup
	defer watchers.Wait()
	defer cancel()
	for _, inf := range r.informers() {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { r.wake() },
			UpdateFunc: func(any, any) { r.wake() },
			DeleteFunc: func(any) { r.wake() },
		}); err != nil {
			return fmt.Errorf("watch: %w", err)
		}
		watchers.Go(func() { inf.RunWithContext(ctx) })
	}

	backoff := time.Second
	for {
		start := time.Now()
		wait, err := r.Sync(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			r.log.Error(err, "keeping the serving certificate failed; retrying", "retryIn", backoff.String())
			wait, backoff = backoff, min(2*backoff, maxBackoff)
		} else {
			backoff = time.Second
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-r.poke:
		case <-timer.C:
		}
		timer.Stop()
		// Space passes out; a poke arriving meanwhile is kept.
		if d := minInterval - time.Since(start); d > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(d):
			}
		}
	}
}

// wake makes the loop run a pass soon.
func (r *Rotator) wake() {
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

// informers watch the Secret and the APIService, each alone (a field
// selector on metadata.name, which RBAC resourceNames can authorize), so
// that a change made by another replica or by a person is acted on
// within a second. Their caches hold those two objects only; passes read
// from kube-apiserver directly.
func (r *Rotator) informers() []cache.SharedIndexInformer {
	secrets := listWatchOne(r.secretName, r.secrets.List, r.secrets.Watch)
	apiServices := listWatchOne(r.apiServiceName, r.apiServices.List, r.apiServices.Watch)
	return []cache.SharedIndexInformer{
		cache.NewSharedIndexInformer(secrets, &corev1.Secret{}, 0, cache.Indexers{}),
		cache.NewSharedIndexInformer(apiServices, &apiregistrationv1.APIService{}, 0, cache.Indexers{}),
	}
}

// Sync makes one pass: it brings the Secret up to date (creating it if
// absent), serves its certificate, and writes the CA bundle into the
// APIService. When a serving certificate signed by a new CA was held back
// until the APIService trusts that CA, it makes a second pass. It returns
// how long until the next pass is due.
func (r *Rotator) Sync(ctx context.Context) (time.Duration, error) {
	for pass := 1; ; pass++ {
		secret, p, err := r.ensureSecret(ctx)
		if err != nil {
			return 0, err
		}
		if err := r.serve(secret); err != nil {
			return 0, err
		}
		err = r.ensureAPIService(ctx, secret)
		if errors.Is(err, errStaleSecret) && pass < writeAttempts {
			continue
		}
		if err != nil {
			return 0, err
		}
		if p.held {
			if pass < 2 {
				continue
			}
			return heldRetry, nil
		}
		return min(max(p.next.Sub(r.now()), minInterval), r.resync), nil
	}
}

// errStaleSecret means the Secret changed while the APIService was being
// brought up to date from it.
var errStaleSecret = errors.New("the Secret changed meanwhile")

// ensureSecret reads the Secret and writes it when the plan changes it.
// Losing a race (AlreadyExists on create, Conflict on update) means
// another replica wrote first: re-read and plan from its content, which
// normally needs nothing more.
func (r *Rotator) ensureSecret(ctx context.Context) (*corev1.Secret, plan, error) {
	name := r.secretName
	for range writeAttempts {
		cur, err := r.secrets.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			cur, err = nil, nil
		}
		if err != nil {
			return nil, plan{}, fmt.Errorf("get secret %s/%s: %w", r.namespace, name, err)
		}
		var data map[string][]byte
		if cur != nil {
			data = cur.Data
		}
		p, err := makePlan(planInput{
			data:         data,
			now:          r.now(),
			dnsNames:     r.dnsNames,
			certValidity: r.certValidity,
			caValidity:   r.caValidity,
			caName:       r.serviceName + "-ca",
			trusted:      r.trusted(ctx),
		})
		if err != nil {
			return nil, plan{}, err
		}
		if !p.changed {
			if p.held {
				r.log.Info("waiting for the APIService to trust the CA", "reasons", p.reasons)
			}
			return cur, p, nil
		}
		var written *corev1.Secret
		if cur == nil {
			written, err = r.secrets.Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{
					Name: name, Namespace: r.namespace,
					Labels: map[string]string{coderv1alpha1.LabelManagedBy: coderv1alpha1.ManagedByValue},
				},
				Type: corev1.SecretTypeTLS,
				Data: p.data,
			}, metav1.CreateOptions{})
		} else {
			upd := cur.DeepCopy()
			upd.Data = p.data // the resourceVersion read above guards the update
			written, err = r.secrets.Update(ctx, upd, metav1.UpdateOptions{})
		}
		if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) {
			r.log.V(1).Info("another replica wrote the Secret first; using its content")
			continue
		}
		if err != nil {
			return nil, plan{}, fmt.Errorf("write secret %s/%s: %w", r.namespace, name, err)
		}
		r.log.Info("updated the Secret", "reasons", p.reasons, "caExpires", p.ca.NotAfter.UTC(), "servingCertExpires", p.leaf.NotAfter.UTC())
		return written, p, nil
	}
	return nil, plan{}, fmt.Errorf("write secret %s/%s: lost %d races in a row", r.namespace, name, writeAttempts)
}

// trusted returns the plan's question: does the APIService's caBundle
// hold ca? A missing APIService has nothing to break; an error counts as
// no (the serving certificate in use is kept).
func (r *Rotator) trusted(ctx context.Context) func(*x509.Certificate) bool {
	return func(ca *x509.Certificate) bool {
		svc, err := r.apiServices.Get(ctx, r.apiServiceName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true
		}
		if err != nil {
			r.log.Error(err, "get APIService")
			return false
		}
		return bundleContains(svc.Spec.CABundle, ca)
	}
}

// serve hands the Secret's serving certificate to the server.
func (r *Rotator) serve(secret *corev1.Secret) error {
	changed, err := r.cert.Set(secret.Data[TLSCertKey], secret.Data[TLSKeyKey])
	if err != nil {
		return fmt.Errorf("secret %s/%s: %w", r.namespace, r.secretName, err)
	}
	if changed {
		if leaf := parseCerts(secret.Data[TLSCertKey]); len(leaf) > 0 {
			r.log.Info("serving a new certificate", "serial", leaf[0].SerialNumber.Text(16), "notAfter", leaf[0].NotAfter.UTC(), "issuer", leaf[0].Issuer.CommonName)
		}
	}
	return nil
}

// ensureAPIService makes the APIService's caBundle equal to the Secret's
// CA bundle. It never sets insecureSkipTLSVerify (it clears it: the two
// are mutually exclusive), and it refuses an APIService that routes to
// another Service. To never write a bundle from a Secret that another
// replica has just rotated, it re-reads the Secret after the APIService
// and updates the APIService with the resourceVersion it read.
func (r *Rotator) ensureAPIService(ctx context.Context, secret *corev1.Secret) error {
	bundle := secret.Data[CABundleKey]
	name := r.apiServiceName
	for range writeAttempts {
		svc, err := r.apiServices.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			if !r.apiServiceMissing {
				r.log.Info("APIService not found; the CA bundle goes into it once it exists")
				r.apiServiceMissing = true
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("get APIService %s: %w", name, err)
		}
		r.apiServiceMissing = false
		ref := svc.Spec.Service
		if ref == nil || ref.Name != r.serviceName || ref.Namespace != r.namespace {
			return fmt.Errorf("APIService %s routes to %s, not to Service %s/%s: not writing its caBundle", name, describeRef(ref), r.namespace, r.serviceName)
		}
		if bytes.Equal(svc.Spec.CABundle, bundle) && !svc.Spec.InsecureSkipTLSVerify {
			return nil
		}
		latest, err := r.secrets.Get(ctx, r.secretName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get secret %s/%s: %w", r.namespace, r.secretName, err)
		}
		if latest.ResourceVersion != secret.ResourceVersion {
			return errStaleSecret
		}
		upd := svc.DeepCopy()
		upd.Spec.CABundle = bundle
		upd.Spec.InsecureSkipTLSVerify = false
		_, err = r.apiServices.Update(ctx, upd, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("update APIService %s caBundle: %w", name, err)
		}
		r.log.Info("wrote the CA bundle into the APIService", "certificates", len(parseCerts(bundle)), "wasInsecureSkipTLSVerify", svc.Spec.InsecureSkipTLSVerify)
		return nil
	}
	return fmt.Errorf("update APIService %s caBundle: lost %d races in a row", name, writeAttempts)
}

func describeRef(ref *apiregistrationv1.ServiceReference) string {
	if ref == nil {
		return "no Service (a local APIService)"
	}
	return "Service " + ref.Namespace + "/" + ref.Name
}

// listWatchOne lists and watches, with list and watch, only the object
// called name.
func listWatchOne[L runtime.Object](name string, list func(context.Context, metav1.ListOptions) (L, error), watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) *cache.ListWatch {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return watchFn(ctx, o)
		},
	}
}
