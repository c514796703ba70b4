package mcpserver

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sync/singleflight"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// tokenCacheTTL is how long a TokenReview answer, and the clients built
// for the caller it names, are reused: agents call tools in bursts, and a
// revoked token stops working within this time.
const tokenCacheTTL = 10 * time.Second

// maxCachedCallers bounds the authenticated callers remembered at once;
// each holds its own Kubernetes clients. One evicted early costs a
// TokenReview and new clients, nothing else.
const maxCachedCallers = 1000

// Rejected tokens are remembered briefly too, so that a caller repeating a
// bad token (a misconfigured agent, or someone probing) cannot make every
// request cost a TokenReview. The bound keeps the memory of a flood of
// distinct bad tokens small; each of those costs one TokenReview anyway.
const (
	failureCacheTTL  = 10 * time.Second
	maxCachedFailure = 10000
)

// callerKey holds the *caller in auth.TokenInfo.Extra.
const callerKey = "kubernetes.caller"

// identity is who an agent is in Kubernetes, from a TokenReview.
type identity struct {
	User   string
	UID    string
	Groups []string
}

// caller is an authenticated agent: who it is, and the Kubernetes clients
// that act as it (its own bearer token), built on its first tool call.
type caller struct {
	id *identity

	once  sync.Once
	build func() (Kube, error)
	kube  Kube
	err   error
}

// clients returns the clients that send the caller's token.
func (c *caller) clients() (Kube, error) {
	c.once.Do(func() {
		c.kube, c.err = c.build()
		c.build = nil // drops the closure holding the token
	})
	return c.kube, c.err
}

// tokenReviewer checks bearer tokens with kube-apiserver's TokenReview.
// Its caches are keyed by a SHA-256 of the token; the token itself is kept
// only inside the clients built for its caller, which must send it.
type tokenReviewer struct {
	kube kubernetes.Interface
	// audiences, when set, are sent with every review and the token must
	// be valid for one of them.
	audiences []string
	// clientsFor builds the clients that act with token.
	clientsFor func(token string) (Kube, error)
	now        func() time.Time
	// inflight makes concurrent checks of one token share one TokenReview.
	inflight singleflight.Group

	mu       sync.Mutex
	cache    map[[sha256.Size]byte]cachedReview
	failures map[[sha256.Size]byte]failedReview
}

type cachedReview struct {
	caller  *caller
	expires time.Time
}

// failedReview is a token kube-apiserver did not authenticate, and why.
type failedReview struct {
	msg     string
	expires time.Time
}

func newTokenReviewer(kube kubernetes.Interface, audiences []string, clientsFor func(string) (Kube, error)) *tokenReviewer {
	return &tokenReviewer{kube: kube, audiences: audiences, clientsFor: clientsFor, now: time.Now,
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
	if c.caller == nil {
		return nil, fmt.Errorf("%s: %w", msg, auth.ErrInvalidToken)
	}
	return &auth.TokenInfo{UserID: c.caller.id.User, Expiration: c.expires, Extra: map[string]any{callerKey: c.caller}}, nil
}

// tokenReviewTimeout bounds one TokenReview.
const tokenReviewTimeout = 10 * time.Second

// reviewed is a TokenReview's outcome: ok.caller set, or why the token was
// rejected.
type reviewed struct {
	ok       cachedReview
	rejected string
}

// cached returns the remembered outcome for the token hashed to key:
// c.caller set when it was authenticated, msg when it was rejected.
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
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: r.audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		// Not the caller's fault, and not remembered: a 500 says so,
		// unlike a 401.
		return reviewed{}, fmt.Errorf("check the token with kube-apiserver: %w", err)
	}
	now := r.now()
	if msg := r.rejection(review); msg != "" {
		r.mu.Lock()
		defer r.mu.Unlock()
		remember(r.failures, key, failedReview{msg: msg, expires: now.Add(failureCacheTTL)}, maxCachedFailure, now,
			func(f failedReview) time.Time { return f.expires })
		return reviewed{rejected: msg}, nil
	}
	u := review.Status.User
	c := cachedReview{expires: now.Add(tokenCacheTTL), caller: &caller{
		id:    &identity{User: u.Username, UID: u.UID, Groups: u.Groups},
		build: func() (Kube, error) { return r.clientsFor(token) },
	}}
	r.mu.Lock()
	defer r.mu.Unlock()
	remember(r.cache, key, c, maxCachedCallers, now, func(c cachedReview) time.Time { return c.expires })
	return reviewed{ok: c}, nil
}

// rejection says why review does not authenticate its token for this
// server, or "" when it does.
func (r *tokenReviewer) rejection(review *authenticationv1.TokenReview) string {
	if !review.Status.Authenticated {
		msg := "the bearer token is not valid for this cluster"
		if review.Status.Error != "" {
			msg += ": " + review.Status.Error
		}
		return msg
	}
	// An authenticator that ignores audiences answers with none of those
	// asked for; the token is then not known to be meant for this server
	// (the TokenReview API's own advice).
	if len(r.audiences) > 0 && !slices.ContainsFunc(review.Status.Audiences, func(a string) bool { return slices.Contains(r.audiences, a) }) {
		return fmt.Sprintf("the bearer token is not meant for this server: its audiences %q include none of mcp.audiences %q",
			review.Status.Audiences, r.audiences)
	}
	return ""
}

// remember stores v under key in m, keeping m at most bound entries:
// expired ones go first, then others at random (map order).
func remember[V any](m map[[sha256.Size]byte]V, key [sha256.Size]byte, v V, bound int, now time.Time, expires func(V) time.Time) {
	if len(m) >= bound {
		pruneExpired(m, now, expires)
	}
	for k := range m {
		if len(m) < bound {
			break
		}
		delete(m, k)
	}
	m[key] = v
}

// pruneExpired deletes the entries of m that expired before now.
func pruneExpired[V any](m map[[sha256.Size]byte]V, now time.Time, expires func(V) time.Time) {
	for k, v := range m {
		if now.After(expires(v)) {
			delete(m, k)
		}
	}
}

// errNoCaller is a tool call that reached a handler without an
// authenticated caller: a bug, since the HTTP layer requires one.
var errNoCaller = errors.New("no authenticated caller")

func callerOf(req *mcp.CallToolRequest) *caller {
	if req == nil || req.Extra == nil || req.Extra.TokenInfo == nil {
		return nil
	}
	c, _ := req.Extra.TokenInfo.Extra[callerKey].(*caller)
	return c
}

func identityOf(req *mcp.CallToolRequest) *identity {
	if c := callerOf(req); c != nil {
		return c.id
	}
	return nil
}

// challenge is the WWW-Authenticate value of a 401 from /mcp (RFC 9728
// §5.1, RFC 6750 §3): where the protected resource metadata is, and
// invalid_token when a token was sent but not accepted. A request without
// one gets no error code, as RFC 6750 §3.1 asks.
func challenge(metadataURL string, r *http.Request) string {
	v := fmt.Sprintf("Bearer resource_metadata=%q", metadataURL)
	if f := strings.Fields(r.Header.Get("Authorization")); len(f) == 2 && strings.EqualFold(f[0], "bearer") {
		v += `, error="invalid_token"`
	}
	return v
}
