package backend

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/operatoraccess"
	"github.com/coder/coder-k8s/internal/identity"
	"github.com/coder/coder-k8s/internal/metrics"
)

// What the ControlPlaneProvider reads. Secrets are only those the operator
// labels, through a cache of their own.
//
// +kubebuilder:rbac:groups=coder.com,resources=codercontrolplanes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch

// ControlPlaneProvider serves, for each namespace, the CoderControlPlanes
// in it whose operator access is ready (all mode). It reads control planes
// and namespaces from the manager's shared cache and the operator token
// Secrets from a cache of its own that holds only the Secrets the operator
// labels (coderapi.OperatorSecretSelector), so that no replica caches
// every Secret of the cluster.
type ControlPlaneProvider struct {
	shared  client.Reader
	secrets client.Reader
	synced  []namedInformer
	timeout time.Duration
	log     logr.Logger
	// problems records events when coderd rejects the operator token or
	// does not answer.
	problems *problemReporter

	mu      sync.Mutex
	clients map[types.NamespacedName]*cachedClient
}

var _ Provider = (*ControlPlaneProvider)(nil)

type namedInformer struct {
	what     string
	informer cache.Informer
}

// cachedClient is the client of one control plane and what it was built
// from; it is rebuilt only when one of those changes.
type cachedClient struct {
	url           string
	secretUID     types.UID
	secretVersion string
	client        *codersdk.Client
}

// NewControlPlaneProvider registers the informers it needs with mgr's
// cache and adds its Secret cache to mgr, so both start and stop with mgr
// on every replica (caches are not subject to leader election). Call it
// before mgr.Start. coderTimeout bounds each call the clients make.
//
// recheck, when not nil, is called (at most every 30s per control plane)
// when coderd rejects a control plane's operator token, so that the
// controller can replace it without waiting for its next access check.
func NewControlPlaneProvider(mgr manager.Manager, coderTimeout time.Duration, recheck func(types.NamespacedName), log logr.Logger) (*ControlPlaneProvider, error) {
	// The informers are registered now so that they start with the cache
	// and Ready can report on them; before the cache starts this does not
	// block.
	ctx := context.Background()
	noWait := cache.BlockUntilSynced(false)
	shared := mgr.GetCache()
	ccpInformer, err := shared.GetInformer(ctx, &coderv1alpha1.CoderControlPlane{}, noWait)
	if err != nil {
		return nil, fmt.Errorf("informer for CoderControlPlanes: %w", err)
	}
	nsInformer, err := shared.GetInformer(ctx, &corev1.Namespace{}, noWait)
	if err != nil {
		return nil, fmt.Errorf("informer for Namespaces: %w", err)
	}

	selector, err := coderapi.OperatorSecretSelector()
	if err != nil {
		return nil, err
	}
	secrets, err := cache.New(mgr.GetConfig(), cache.Options{
		HTTPClient: mgr.GetHTTPClient(),
		Scheme:     mgr.GetScheme(),
		Mapper:     mgr.GetRESTMapper(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}: {Label: selector},
		},
		DefaultTransform: transformSecret,
		// This cache is for token Secrets only; reading anything else
		// through it is a bug, not a reason to start a new informer.
		ReaderFailOnMissingInformer: true,
	})
	if err != nil {
		return nil, fmt.Errorf("operator token Secret cache: %w", err)
	}
	secretInformer, err := secrets.GetInformer(ctx, &corev1.Secret{}, noWait)
	if err != nil {
		return nil, fmt.Errorf("operator token Secret informer: %w", err)
	}
	// Every replica serves, so the cache must run on every replica. With
	// per-object options cache.New returns a type the manager does not
	// recognise as a cache and would start on the leader only, leaving
	// followers never ready.
	if err := mgr.Add(everyReplica{secrets}); err != nil {
		return nil, fmt.Errorf("add operator token Secret cache to the manager: %w", err)
	}

	return &ControlPlaneProvider{
		shared:  shared,
		secrets: secrets,
		synced: []namedInformer{
			{"CoderControlPlane", ccpInformer},
			{"Namespace", nsInformer},
			{"operator token Secret", secretInformer},
		},
		timeout:  coderTimeout,
		log:      log.WithName("backends"),
		problems: newProblemReporter(mgr.GetEventRecorder("coder-k8s-aggregated-apiserver"), recheck),
		clients:  map[types.NamespacedName]*cachedClient{},
	}, nil
}

// everyReplica makes the manager run a runnable whether or not this
// replica is the leader.
type everyReplica struct{ manager.Runnable }

func (everyReplica) NeedLeaderElection() bool { return false }

// maxTokenBytes bounds the token kept from a token Secret: Coder API
// keys are 33 bytes ("<10-char id>-<22-char secret>"). A longer value is
// not a token the operator wrote and is not held.
const maxTokenBytes = 1024

// transformSecret decides what of a Secret the label selector let
// through stays in memory. The label is not proof of anything: whoever
// may create Secrets in a namespace can copy it. So only a Secret that
// looks like a control plane's operator token Secret as operatoraccess
// writes it keeps anything beyond its identity:
//
//   - named <cp>-operator-token (coderapi.TokenSecretName) for the
//     control plane <cp> its coder.com/control-plane label names, and
//   - controlled (controller owner reference) by the CoderControlPlane
//     <cp>;
//
// it keeps its name, namespace, UID, resourceVersion, that label, that
// owner reference, the coderd URL the token was issued for
// (coderapi.AnnotationCoderURL; Backends serves the token only at that
// URL) and the token (data["token"], at most maxTokenBytes). Every
// other Secret is cut down to name, namespace, UID and resourceVersion:
// no labels, annotations or data. The owner reference's UID is checked
// against the control plane's when the Secret is used (Backends), so a
// Secret made by someone else to look like a token Secret is never used;
// at most one such Secret per name holds at most maxTokenBytes.
func transformSecret(in any) (any, error) {
	s, ok := in.(*corev1.Secret)
	if !ok {
		return in, nil
	}
	out := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
		Name: s.Name, Namespace: s.Namespace, UID: s.UID, ResourceVersion: s.ResourceVersion,
	}}
	cp := s.Labels[coderv1alpha1.LabelControlPlane]
	owner := metav1.GetControllerOfNoCopy(s)
	token := s.Data[coderapi.TokenKey]
	if cp != "" && s.Name == coderapi.TokenSecretName(cp) && ownedByControlPlane(owner, cp) && len(token) <= maxTokenBytes {
		// The label stays: a transform must give the same result when
		// it is applied again to its own output.
		out.Labels = map[string]string{coderv1alpha1.LabelControlPlane: cp}
		if u, ok := s.Annotations[coderapi.AnnotationCoderURL]; ok {
			out.Annotations = map[string]string{coderapi.AnnotationCoderURL: u}
		}
		out.OwnerReferences = []metav1.OwnerReference{*owner}
		out.Data = map[string][]byte{coderapi.TokenKey: token}
	}
	return out, nil
}

// ownedByControlPlane reports whether ref is a CoderControlPlane called
// name.
func ownedByControlPlane(ref *metav1.OwnerReference, name string) bool {
	if ref == nil || ref.Kind != "CoderControlPlane" || ref.Name != name {
		return false
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	return err == nil && gv.Group == coderv1alpha1.GroupVersion.Group
}

// Ready reports whether the control plane, namespace and token Secret
// informers have synced.
func (p *ControlPlaneProvider) Ready() error {
	var waiting []string
	for _, i := range p.synced {
		if !i.informer.HasSynced() {
			waiting = append(waiting, i.what)
		}
	}
	if len(waiting) > 0 {
		return fmt.Errorf("%w: waiting for the %s informers to sync", ErrNotReady, strings.Join(waiting, ", "))
	}
	return nil
}

// Backends returns the control planes of namespace (every namespace when
// "") whose operator access is usable, with their clients. It reads only
// caches; in the steady state it builds no client and calls no API.
func (p *ControlPlaneProvider) Backends(ctx context.Context, namespace string) ([]Backend, error) {
	usable := map[string]bool{}
	if namespace != "" {
		// Checked first: a namespace being deleted needs no more work.
		ok, err := p.namespaceUsable(ctx, namespace)
		if err != nil {
			return nil, err
		}
		if !ok {
			p.forgetExcept(namespace, nil)
			return nil, nil
		}
		usable[namespace] = true
	}
	list, err := p.listControlPlanes(ctx, namespace)
	if err != nil {
		return nil, err
	}

	live := map[types.NamespacedName]bool{}
	var out []Backend
	for i := range list {
		ccp := &list[i]
		key := types.NamespacedName{Namespace: ccp.Namespace, Name: ccp.Name}
		ok, seen := usable[ccp.Namespace]
		if !seen {
			if ok, err = p.namespaceUsable(ctx, ccp.Namespace); err != nil {
				return nil, err
			}
			usable[ccp.Namespace] = ok
		}
		if !ok {
			continue
		}
		u, ref, why := eligible(ccp)
		if why != "" {
			p.log.V(1).Info("control plane not served", "controlPlane", key, "reason", why)
			continue
		}
		var secret corev1.Secret
		err := p.secrets.Get(ctx, types.NamespacedName{Namespace: ccp.Namespace, Name: ref.Name}, &secret, client.UnsafeDisableDeepCopy)
		if apierrors.IsNotFound(err) {
			p.log.V(1).Info("control plane not served: operator token Secret not found (or not labeled "+coderv1alpha1.LabelManagedBy+"="+coderv1alpha1.ManagedByValue+")",
				"controlPlane", key, "secret", ref.Name)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("control plane %s: read operator token Secret %s: %w", key, ref.Name, notReady(err))
		}
		if !metav1.IsControlledBy(&secret, ccp) {
			p.log.V(1).Info("control plane not served: operator token Secret is not controlled by the control plane", "controlPlane", key, "secret", ref.Name)
			continue
		}
		if issued := secret.Annotations[coderapi.AnnotationCoderURL]; !coderapi.SameURL(issued, u.String()) {
			// The token goes only to the coderd it was issued by, even if
			// someone edits the control plane's status.url.
			p.log.V(1).Info("control plane not served: operator token Secret was issued for another coderd URL",
				"controlPlane", key, "secret", ref.Name, "issuedFor", issued, "url", u.String())
			continue
		}
		token := string(secret.Data[ref.Key])
		if token == "" {
			p.log.V(1).Info("control plane not served: operator token Secret has no token", "controlPlane", key, "secret", ref.Name, "key", ref.Key)
			continue
		}
		live[key] = true
		out = append(out, Backend{
			Namespace:     ccp.Namespace,
			ControlPlane:  ccp.Name,
			URL:           u,
			Client:        p.client(ccp, u, &secret, token),
			Identity:      controlPlaneIdentity(ccp),
			ReservedUsers: controlPlaneReserved(ccp),
			// An extra namespace the operator's policy refuses gets no
			// RoleBinding, so coderd makes no pods there: looking finds
			// none.
			WorkspaceNamespaces: append([]string{ccp.Namespace}, ccp.Spec.WorkspaceRBAC.ExtraNamespaces...),
		})
	}
	p.forgetExcept(namespace, live)
	sortBackends(out)
	return out, nil
}

// controlPlaneIdentity reads spec.identity.
func controlPlaneIdentity(ccp *coderv1alpha1.CoderControlPlane) identity.Rules {
	id := ccp.Spec.Identity
	mappings := make([]identity.Mapping, len(id.Mappings))
	for i, m := range id.Mappings {
		mappings[i] = identity.Mapping{KubernetesUser: m.KubernetesUser, CoderUser: m.CoderUser}
	}
	return identityRules(id.Mode, id.UsernamePrefix, id.MatchBy, mappings)
}

// firstUsername is the username operatoraccess gives the first user when
// it sets a coderd up itself (createFirstUser).
const firstUsername = "admin"

// The reserved users of control planes, shared by every backend.
var (
	reservedOperator         = []string{operatoraccess.OperatorUsername}
	reservedOperatorAndFirst = []string{operatoraccess.OperatorUsername, firstUsername}
)

// controlPlaneReserved returns the Coder users coder-k8s created for
// itself in a control plane's coderd: its operator user, and the first
// user when the operator set coderd up (status.adminCredentialsSecretRef
// names that user's Secret), from the status already read.
func controlPlaneReserved(ccp *coderv1alpha1.CoderControlPlane) []string {
	if ccp.Status.AdminCredentialsSecretRef != nil {
		return reservedOperatorAndFirst
	}
	return reservedOperator
}

// listControlPlanes lists the control planes of namespace ("" for all)
// from the shared cache, without copying them (they are only read).
func (p *ControlPlaneProvider) listControlPlanes(ctx context.Context, namespace string) ([]coderv1alpha1.CoderControlPlane, error) {
	var list coderv1alpha1.CoderControlPlaneList
	opts := []client.ListOption{client.UnsafeDisableDeepCopy}
	if namespace != "" {
		opts = append(opts, client.InNamespace(namespace))
	}
	err := p.shared.List(ctx, &list, opts...)
	if err == nil {
		return list.Items, nil
	}
	if namespace == "" {
		return nil, fmt.Errorf("list CoderControlPlanes: %w", notReady(err))
	}
	// A manager cache restricted to some namespaces refuses to list any
	// other (with an untyped error): list what it holds and filter, which
	// finds none there.
	if allErr := p.shared.List(ctx, &list, client.UnsafeDisableDeepCopy); allErr != nil {
		return nil, fmt.Errorf("list CoderControlPlanes in namespace %s: %w", namespace, notReady(err))
	}
	var out []coderv1alpha1.CoderControlPlane
	for _, ccp := range list.Items {
		if ccp.Namespace == namespace {
			out = append(out, ccp)
		}
	}
	return out, nil
}

// eligible returns the coderd URL and token reference of a control plane
// the operator has working access to, or why it has none.
func eligible(ccp *coderv1alpha1.CoderControlPlane) (*url.URL, *coderv1alpha1.SecretKeyReference, string) {
	switch {
	case ccp.DeletionTimestamp != nil:
		return nil, nil, "being deleted"
	case ccp.Spec.OperatorAccess.Disabled:
		return nil, nil, "operator access is disabled"
	case apimeta.IsStatusConditionFalse(ccp.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady) ||
		apimeta.FindStatusCondition(ccp.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady) == nil:
		// Unknown (coderd does not answer, the last token is kept) is
		// served: requests then fail with 503 rather than the objects
		// disappearing from lists and watches.
		return nil, nil, "condition " + coderv1alpha1.ConditionOperatorAccessReady + " is not True"
	case ccp.Status.URL == "":
		return nil, nil, "status.url is not set"
	case ccp.Status.OperatorTokenSecretRef == nil || ccp.Status.OperatorTokenSecretRef.Name == "":
		return nil, nil, "status.operatorTokenSecretRef is not set"
	}
	u, err := parseCoderURL(ccp.Status.URL)
	if err != nil {
		return nil, nil, "status.url: " + err.Error()
	}
	ref := *ccp.Status.OperatorTokenSecretRef
	if ref.Key == "" {
		ref.Key = coderapi.TokenKey
	}
	return u, &ref, ""
}

func (p *ControlPlaneProvider) namespaceUsable(ctx context.Context, name string) (bool, error) {
	var ns corev1.Namespace
	err := p.shared.Get(ctx, types.NamespacedName{Name: name}, &ns, client.UnsafeDisableDeepCopy)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read namespace %s: %w", name, notReady(err))
	}
	return namespaceUsable(&ns), nil
}

// client returns the cached client of a control plane, rebuilt when the
// token Secret (by UID and resourceVersion) or the URL changed.
func (p *ControlPlaneProvider) client(ccp *coderv1alpha1.CoderControlPlane, u *url.URL, secret *corev1.Secret, token string) *codersdk.Client {
	key := types.NamespacedName{Namespace: ccp.Namespace, Name: ccp.Name}
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.clients[key]
	if ok && c.url == u.String() && c.secretUID == secret.UID && c.secretVersion == secret.ResourceVersion {
		return c.client
	}
	if ok {
		coderapi.CloseIdle(c.client)
		p.log.V(1).Info("operator token or coderd URL changed: new client", "controlPlane", key, "url", u.String())
	}
	c = &cachedClient{
		url:           u.String(),
		secretUID:     secret.UID,
		secretVersion: secret.ResourceVersion,
		client: coderapi.NewClient(u, token, p.timeout, coderapi.Target{
			ControlPlane: metrics.ControlPlane(ccp.Namespace, ccp.Name),
			Component:    metrics.ComponentAggregated,
			Observe:      p.problems.observer(ccp, u.String()),
		}),
	}
	p.clients[key] = c
	return c.client
}

// forgetExcept drops the clients of control planes in namespace (all
// when "") that are no longer served.
func (p *ControlPlaneProvider) forgetExcept(namespace string, live map[types.NamespacedName]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, c := range p.clients {
		if (namespace == "" || key.Namespace == namespace) && !live[key] {
			coderapi.CloseIdle(c.client)
			delete(p.clients, key)
		}
	}
}

// notReady marks the errors of a cache that has not started, so that
// callers can answer "try again" rather than "internal error".
func notReady(err error) error {
	var notStarted *cache.ErrCacheNotStarted
	if errors.As(err, &notStarted) {
		return fmt.Errorf("%w: %w", ErrNotReady, err)
	}
	return err
}
