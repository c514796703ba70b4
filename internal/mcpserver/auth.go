package mcpserver

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sync/singleflight"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// tokenCacheTTL is how long a TokenReview answer is reused: agents call
// tools in bursts, and a revoked token stops working within this time.
const tokenCacheTTL = 10 * time.Second

// Rejected tokens are remembered briefly too, so that a caller repeating a
// bad token (a misconfigured agent, or someone probing) cannot make every
// request cost a TokenReview. The bound keeps the memory of a flood of
// distinct bad tokens small; each of those costs one TokenReview anyway.
const (
	failureCacheTTL  = 10 * time.Second
	maxCachedFailure = 10000
)

// identityKey holds the caller's Kubernetes identity in auth.TokenInfo.Extra.
const identityKey = "kubernetes.identity"

// identity is who an agent is in Kubernetes, from a TokenReview.
type identity struct {
	User   string
	UID    string
	Groups []string
	Extra  map[string]authorizationv1.ExtraValue
}

// tokenReviewer checks bearer tokens with kube-apiserver's TokenReview.
// Its caches are keyed by a SHA-256 of the token; tokens are never kept.
type tokenReviewer struct {
	kube kubernetes.Interface
	now  func() time.Time
	// inflight makes concurrent checks of one token share one TokenReview.
	inflight singleflight.Group

	mu       sync.Mutex
	cache    map[[sha256.Size]byte]cachedReview
	failures map[[sha256.Size]byte]failedReview
}

type cachedReview struct {
	id      *identity
	expires time.Time
}

// failedReview is a token kube-apiserver did not authenticate, and why.
type failedReview struct {
	msg     string
	expires time.Time
}

func newTokenReviewer(kube kubernetes.Interface) *tokenReviewer {
	return &tokenReviewer{kube: kube, now: time.Now,
		cache: map[[sha256.Size]byte]cachedReview{}, failures: map[[sha256.Size]byte]failedReview{}}
}

// verify is an auth.TokenVerifier.
func (r *tokenReviewer) verify(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	key := sha256.Sum256([]byte(token))
	c, msg, ok := r.cached(key)
	if !ok {
		// Detached from the first caller, whose cancellation must not fail
		// the others sharing the review; bounded on its own.
		ch := r.inflight.DoChan(string(key[:]), func() (any, error) {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tokenReviewTimeout)
			defer cancel()
			return r.review(rctx, key, token)
		})
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case res := <-ch:
			if res.Err != nil {
				return nil, res.Err
			}
			c, msg = res.Val.(reviewed).ok, res.Val.(reviewed).rejected
		}
	}
	if c.id == nil {
		return nil, fmt.Errorf("%s: %w", msg, auth.ErrInvalidToken)
	}
	return &auth.TokenInfo{UserID: c.id.User, Expiration: c.expires, Extra: map[string]any{identityKey: c.id}}, nil
}

// tokenReviewTimeout bounds one TokenReview.
const tokenReviewTimeout = 10 * time.Second

// reviewed is a TokenReview's outcome: ok.id set, or why the token was
// rejected.
type reviewed struct {
	ok       cachedReview
	rejected string
}

// cached returns the remembered outcome for the token hashed to key:
// c.id set when it was authenticated, msg when it was rejected.
func (r *tokenReviewer) cached(key [sha256.Size]byte) (c cachedReview, msg string, ok bool) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.cache[key]; ok {
		if now.Before(c.expires) {
			return c, "", true
		}
		delete(r.cache, key)
	}
	if f, ok := r.failures[key]; ok {
		if now.Before(f.expires) {
			return cachedReview{}, f.msg, true
		}
		delete(r.failures, key)
	}
	return cachedReview{}, "", false
}

// review asks kube-apiserver about token and remembers the answer.
func (r *tokenReviewer) review(ctx context.Context, key [sha256.Size]byte, token string) (reviewed, error) {
	review, err := r.kube.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token},
	}, metav1.CreateOptions{})
	if err != nil {
		// Not the caller's fault, and not remembered: a 500 says so,
		// unlike a 401.
		return reviewed{}, fmt.Errorf("check the token with kube-apiserver: %w", err)
	}
	now := r.now()
	if !review.Status.Authenticated {
		msg := "the bearer token is not valid for this cluster"
		if review.Status.Error != "" {
			msg += ": " + review.Status.Error
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.failures) >= maxCachedFailure {
			pruneExpired(r.failures, now, func(f failedReview) time.Time { return f.expires })
		}
		// Still full of live entries: drop some at random (map order).
		for k := range r.failures {
			if len(r.failures) < maxCachedFailure {
				break
			}
			delete(r.failures, k)
		}
		r.failures[key] = failedReview{msg: msg, expires: now.Add(failureCacheTTL)}
		return reviewed{rejected: msg}, nil
	}
	u := review.Status.User
	id := &identity{User: u.Username, UID: u.UID, Groups: u.Groups, Extra: map[string]authorizationv1.ExtraValue{}}
	for k, v := range u.Extra {
		id.Extra[k] = authorizationv1.ExtraValue(v)
	}
	c := cachedReview{id: id, expires: now.Add(tokenCacheTTL)}
	r.mu.Lock()
	defer r.mu.Unlock()
	// Drop expired entries so the cache stays as small as the set of
	// active tokens.
	pruneExpired(r.cache, now, func(c cachedReview) time.Time { return c.expires })
	r.cache[key] = c
	return reviewed{ok: c}, nil
}

// pruneExpired deletes the entries of m that expired before now.
func pruneExpired[V any](m map[[sha256.Size]byte]V, now time.Time, expires func(V) time.Time) {
	for k, v := range m {
		if now.After(expires(v)) {
			delete(m, k)
		}
	}
}

// errForbidden marks a tool call the caller's RBAC does not allow.
var errForbidden = errors.New("forbidden")

// Allowed SubjectAccessReviews are remembered for accessCacheTTL: agents
// call tools in bursts, and each review is a request to kube-apiserver,
// rate limited with all of coder-k8s's others. A permission revoked keeps
// working for at most that long, as a revoked token does (tokenCacheTTL);
// denials are not remembered, so a permission just granted works at once.
// The bound keeps the memory of many callers and objects small.
const (
	accessCacheTTL  = 10 * time.Second
	maxCachedAccess = 10000
)

// authorizer checks tool calls against the caller's RBAC.
type authorizer struct {
	kube kubernetes.Interface
	// none means auth "none": every call is allowed (local development).
	none bool
	now  func() time.Time

	mu sync.Mutex
	// allowed maps a hash of (identity, access) to when the allowance
	// expires.
	allowed map[[sha256.Size]byte]time.Time
}

func newAuthorizer(kube kubernetes.Interface, none bool) *authorizer {
	return &authorizer{kube: kube, none: none, now: time.Now, allowed: map[[sha256.Size]byte]time.Time{}}
}

// access is the Kubernetes request a tool call amounts to.
type access struct {
	Verb, Group, Resource, Subresource, Namespace, Name string
}

func (a access) String() string {
	r := a.Resource
	if a.Group != "" {
		r += "." + a.Group
	}
	if a.Subresource != "" {
		r += "/" + a.Subresource
	}
	s := a.Verb + " " + r
	if a.Name != "" {
		s += " " + a.Name
	}
	if a.Namespace != "" {
		return s + " in namespace " + a.Namespace
	}
	return s + " in all namespaces"
}

// authorize asks kube-apiserver whether the caller of req may do a.
func (a *authorizer) authorize(ctx context.Context, req *mcp.CallToolRequest, acc access) error {
	if a.none {
		return nil
	}
	id := identityOf(req)
	if id == nil {
		return fmt.Errorf("no authenticated caller: %w", errForbidden)
	}
	key, err := accessKey(id, acc)
	if err != nil {
		return err
	}
	if a.wasAllowed(key) {
		return nil
	}
	sar, err := a.kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: id.User, UID: id.UID, Groups: id.Groups, Extra: id.Extra,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: acc.Verb, Group: acc.Group, Resource: acc.Resource, Subresource: acc.Subresource,
				Namespace: acc.Namespace, Name: acc.Name,
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("check %q's permission to %s with kube-apiserver: %w", id.User, acc, err)
	}
	if !sar.Status.Allowed {
		msg := fmt.Sprintf("%q may not %s (the same RBAC as kubectl applies; ask for a Role granting it)", id.User, acc)
		if sar.Status.Reason != "" {
			msg += ": " + sar.Status.Reason
		}
		return fmt.Errorf("%s: %w", msg, errForbidden)
	}
	a.remember(key)
	return nil
}

// accessKey hashes everything a SubjectAccessReview is asked about.
func accessKey(id *identity, acc access) ([sha256.Size]byte, error) {
	// JSON orders map keys, so equal identities give equal bytes.
	b, err := json.Marshal(struct {
		ID  *identity
		Acc access
	}{id, acc})
	if err != nil {
		return [sha256.Size]byte{}, fmt.Errorf("authorization cache key: %w", err)
	}
	return sha256.Sum256(b), nil
}

func (a *authorizer) wasAllowed(key [sha256.Size]byte) bool {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	exp, ok := a.allowed[key]
	if ok && !now.Before(exp) {
		delete(a.allowed, key)
		return false
	}
	return ok
}

func (a *authorizer) remember(key [sha256.Size]byte) {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.allowed) >= maxCachedAccess {
		pruneExpired(a.allowed, now, func(exp time.Time) time.Time { return exp })
	}
	// Still full of live entries: drop some at random (map order).
	for k := range a.allowed {
		if len(a.allowed) < maxCachedAccess {
			break
		}
		delete(a.allowed, k)
	}
	a.allowed[key] = now.Add(accessCacheTTL)
}

func identityOf(req *mcp.CallToolRequest) *identity {
	if req == nil || req.Extra == nil || req.Extra.TokenInfo == nil {
		return nil
	}
	id, _ := req.Extra.TokenInfo.Extra[identityKey].(*identity)
	return id
}
