package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/identity"
	"github.com/coder/coder-k8s/internal/metrics"
)

// tokenFileCheckInterval is how often the session token file is checked
// for a new token: a Secret mounted as a file changes in place when it
// is rotated.
const tokenFileCheckInterval = time.Second

const maxTokenFile = 64 << 10

// staticTarget labels the static backend's requests to coderd.
var staticTarget = coderapi.Target{ControlPlane: metrics.StaticControlPlane, Component: metrics.ComponentAggregated}

// StaticProvider serves the one coderd of the configuration file
// (aggregatedAPIServer.coder.staticBackend) in its one namespace
// (aggregated-apiserver mode). Start must run for it to become ready.
type StaticProvider struct {
	namespace string
	url       *url.URL
	tokenFile string // "" when the token came from the flag
	identity  identity.Rules
	timeout   time.Duration
	log       logr.Logger

	factory   informers.SharedInformerFactory
	informer  toolscache.SharedIndexInformer
	started   atomic.Bool
	checkTick time.Duration

	mu       sync.RWMutex
	client   *codersdk.Client
	token    string
	fileInfo os.FileInfo
	fileErr  string // the last problem reading the token file, logged once
}

var _ Provider = (*StaticProvider)(nil)

// StaticOptions are the one coderd a StaticProvider serves, and how.
type StaticOptions struct {
	// URL of coderd.
	URL string
	// SessionToken, when not blank, is the session token (from the
	// --coder-session-token flag); it wins over SessionTokenFile.
	SessionToken string
	// SessionTokenFile holds the session token otherwise (a mounted
	// Secret); Start watches it, since a rotated Secret changes in place.
	SessionTokenFile string
	// Namespace is the one Kubernetes namespace the backend's objects
	// appear in.
	Namespace string
	// Identity says whose Coder identity callers act with; an empty Mode
	// or MatchField means Mapped or Email.
	Identity identity.Rules
	// CoderTimeout bounds each call the client makes to coderd.
	CoderTimeout time.Duration
}

// NewStaticProvider validates o and reads the session token:
// o.SessionToken when set, else the file o.SessionTokenFile, which Start
// then watches for changes. kube is used only to watch o.Namespace.
func NewStaticProvider(o StaticOptions, kube kubernetes.Interface, log logr.Logger) (*StaticProvider, error) {
	if kube == nil {
		return nil, errors.New("static backend: no Kubernetes client")
	}
	if o.Namespace == "" {
		return nil, errors.New("static backend: namespace is required (the namespace its objects appear in)")
	}
	if errs := validation.IsDNS1123Label(o.Namespace); len(errs) > 0 {
		return nil, fmt.Errorf("static backend: namespace %q: %s", o.Namespace, strings.Join(errs, "; "))
	}
	if o.URL == "" {
		return nil, errors.New("static backend: url is required")
	}
	u, err := parseCoderURL(o.URL)
	if err != nil {
		return nil, fmt.Errorf("static backend: %w", err)
	}
	id := o.Identity
	rules := identityRules(string(id.Mode), id.UsernamePrefix, string(id.MatchField), id.Mappings)
	if err := rules.Validate("aggregatedAPIServer.coder.staticBackend.identity"); err != nil {
		return nil, fmt.Errorf("static backend: %w", err)
	}
	p := &StaticProvider{
		identity:  rules,
		namespace: o.Namespace,
		url:       u,
		timeout:   o.CoderTimeout,
		log:       log.WithName("static-backend").WithValues("url", u.String(), "namespace", o.Namespace),
		checkTick: tokenFileCheckInterval,
	}
	switch token := strings.TrimSpace(o.SessionToken); {
	case token != "":
		p.token = token
	case o.SessionTokenFile == "":
		return nil, errors.New("static backend: a session token is required: set sessionTokenFile or --coder-session-token")
	default:
		p.tokenFile = o.SessionTokenFile
		token, info, err := readToken(o.SessionTokenFile)
		if err != nil {
			return nil, fmt.Errorf("static backend: %w", err)
		}
		p.token, p.fileInfo = token, info
	}
	p.client = coderapi.NewClient(u, p.token, o.CoderTimeout, staticTarget)
	if !rules.Mapped() {
		p.log.Info("WARNING: identity mode Operator: every caller of coderworkspaces, codertemplates and codertemplateversions in namespace " + o.Namespace +
			" acts in Coder as the session token's user, so whoever Kubernetes RBAC lets read or change them there reads and changes what that user may in Coder")
	}

	// Only the one namespace is watched: its existence and deletion
	// decide whether the backend is served, without an API call per
	// request.
	p.factory = informers.NewSharedInformerFactoryWithOptions(kube, 0,
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", o.Namespace).String()
		}))
	p.informer = p.factory.Core().V1().Namespaces().Informer()
	if err := p.informer.SetTransform(stripManagedFields); err != nil {
		return nil, fmt.Errorf("static backend: namespace informer: %w", err)
	}
	return p, nil
}

// Start runs the namespace informer and the token file check until ctx
// ends; it returns nil then. Run it once, in a goroutine of its own or as
// a manager runnable.
func (p *StaticProvider) Start(ctx context.Context) error {
	if !p.started.CompareAndSwap(false, true) {
		return errors.New("static backend: already started")
	}
	p.factory.Start(ctx.Done())
	defer p.factory.Shutdown()
	if p.tokenFile == "" {
		<-ctx.Done()
		return nil
	}
	tick := time.NewTicker(p.checkTick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			p.refreshToken()
		}
	}
}

// NeedLeaderElection is false: every replica serves.
func (p *StaticProvider) NeedLeaderElection() bool { return false }

// Ready reports whether the namespace informer has synced.
func (p *StaticProvider) Ready() error {
	if !p.informer.HasSynced() {
		return fmt.Errorf("%w: waiting for the informer of namespace %s to sync", ErrNotReady, p.namespace)
	}
	return nil
}

// Backends returns the static backend for its namespace (or for ""),
// unless that namespace does not exist or is being deleted.
func (p *StaticProvider) Backends(_ context.Context, namespace string) ([]Backend, error) {
	if namespace != "" && namespace != p.namespace {
		return nil, nil
	}
	if err := p.Ready(); err != nil {
		return nil, err
	}
	obj, exists, err := p.informer.GetStore().GetByKey(p.namespace)
	if err != nil {
		return nil, fmt.Errorf("read namespace %s from the informer: %w", p.namespace, err)
	}
	if !exists {
		return nil, nil
	}
	ns, ok := obj.(*corev1.Namespace)
	if !ok || !namespaceUsable(ns) {
		return nil, nil
	}
	p.mu.RLock()
	c := p.client
	p.mu.RUnlock()
	// No reserved users: the administrator chose the token's user, and
	// coder-k8s creates none of its own here.
	return []Backend{{Namespace: p.namespace, URL: p.url, Client: c, Identity: p.identity, WorkspaceNamespaces: []string{p.namespace}}}, nil
}

// refreshToken re-reads the token file when its identity, size or
// modification time changed, and swaps in a new client when the token
// did. A file that cannot be read, or is empty (as during a Secret
// update), keeps the current token.
func (p *StaticProvider) refreshToken() {
	info, err := os.Stat(p.tokenFile)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.fileProblem(err.Error())
		return
	}
	if prev := p.fileInfo; prev != nil && os.SameFile(prev, info) && prev.ModTime().Equal(info.ModTime()) && prev.Size() == info.Size() {
		return
	}
	token, info, err := readToken(p.tokenFile)
	if err != nil {
		p.fileProblem(err.Error())
		return
	}
	p.fileInfo, p.fileErr = info, ""
	if token == p.token {
		return
	}
	old := p.client
	p.token = token
	p.client = coderapi.NewClient(p.url, token, p.timeout, staticTarget)
	coderapi.CloseIdle(old)
	p.log.Info("session token file changed: using the new token", "file", p.tokenFile)
}

// fileProblem logs a token file problem once, not once a second; p.mu is
// held.
func (p *StaticProvider) fileProblem(msg string) {
	if msg == p.fileErr {
		return
	}
	p.fileErr = msg
	p.log.Info("cannot read the session token file; keeping the current token", "file", p.tokenFile, "error", msg)
}

// readToken reads a token file; surrounding whitespace (a trailing
// newline) is not part of the token.
func readToken(path string) (string, os.FileInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", nil, fmt.Errorf("read session token file: %w", err)
	}
	defer f.Close()
	// Stat the opened file, so the identity recorded is the one read.
	info, err := f.Stat()
	if err != nil {
		return "", nil, fmt.Errorf("read session token file: %w", err)
	}
	// A token is short; the limit keeps a wrong path (a log file) from
	// being read whole.
	b, err := io.ReadAll(io.LimitReader(f, maxTokenFile))
	if err != nil {
		return "", nil, fmt.Errorf("read session token file: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", nil, fmt.Errorf("session token file %s is empty", path)
	}
	return token, info, nil
}

func stripManagedFields(in any) (any, error) {
	if obj, ok := in.(metav1.Object); ok {
		obj.SetManagedFields(nil)
	}
	return in, nil
}
