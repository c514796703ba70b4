package mcpserver

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// tokenCacheTTL is how long a TokenReview answer is reused: agents call
// tools in bursts, and a revoked token stops working within this time.
const tokenCacheTTL = 10 * time.Second

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
type tokenReviewer struct {
	kube kubernetes.Interface
	now  func() time.Time

	mu    sync.Mutex
	cache map[[sha256.Size]byte]cachedReview
}

type cachedReview struct {
	id      *identity
	expires time.Time
}

func newTokenReviewer(kube kubernetes.Interface) *tokenReviewer {
	return &tokenReviewer{kube: kube, now: time.Now, cache: map[[sha256.Size]byte]cachedReview{}}
}

// verify is an auth.TokenVerifier. Only a hash of the token is kept.
func (r *tokenReviewer) verify(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	key := sha256.Sum256([]byte(token))
	now := r.now()
	r.mu.Lock()
	c, ok := r.cache[key]
	if ok && now.After(c.expires) {
		delete(r.cache, key)
		ok = false
	}
	r.mu.Unlock()
	if !ok {
		review, err := r.kube.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
			Spec: authenticationv1.TokenReviewSpec{Token: token},
		}, metav1.CreateOptions{})
		if err != nil {
			// Not the caller's fault: a 500 says so, unlike a 401.
			return nil, fmt.Errorf("check the token with kube-apiserver: %w", err)
		}
		if !review.Status.Authenticated {
			msg := "the bearer token is not valid for this cluster"
			if review.Status.Error != "" {
				msg += ": " + review.Status.Error
			}
			return nil, fmt.Errorf("%s: %w", msg, auth.ErrInvalidToken)
		}
		u := review.Status.User
		id := &identity{User: u.Username, UID: u.UID, Groups: u.Groups, Extra: map[string]authorizationv1.ExtraValue{}}
		for k, v := range u.Extra {
			id.Extra[k] = authorizationv1.ExtraValue(v)
		}
		c = cachedReview{id: id, expires: now.Add(tokenCacheTTL)}
		r.mu.Lock()
		r.prune(now)
		r.cache[key] = c
		r.mu.Unlock()
	}
	return &auth.TokenInfo{UserID: c.id.User, Expiration: c.expires, Extra: map[string]any{identityKey: c.id}}, nil
}

// prune drops expired entries so the cache stays as small as the set of
// active tokens.
func (r *tokenReviewer) prune(now time.Time) {
	for k, c := range r.cache {
		if now.After(c.expires) {
			delete(r.cache, k)
		}
	}
}

// errForbidden marks a tool call the caller's RBAC does not allow.
var errForbidden = errors.New("forbidden")

// authorizer checks tool calls against the caller's RBAC.
type authorizer struct {
	kube kubernetes.Interface
	// none means auth "none": every call is allowed (local development).
	none bool
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
	return nil
}

func identityOf(req *mcp.CallToolRequest) *identity {
	if req == nil || req.Extra == nil || req.Extra.TokenInfo == nil {
		return nil
	}
	id, _ := req.Extra.TokenInfo.Extra[identityKey].(*identity)
	return id
}
