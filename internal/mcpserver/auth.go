package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	tokencache "k8s.io/apiserver/pkg/authentication/token/cache"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/kubernetes"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
)

// reviewTTL is how long kube-apiserver's answer about a token is reused,
// an acceptance (with the clients built for the caller it names) or a
// rejection: agents call tools in bursts, a revoked token stops working
// within this time, and a caller repeating a bad token (a misconfigured
// agent, or someone probing) costs one TokenReview per token in it.
const reviewTTL = 10 * time.Second

// tokenReviewTimeout bounds one TokenReview.
const tokenReviewTimeout = 10 * time.Second

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

// tokenReviewer checks bearer tokens with kube-apiserver's TokenReview
// through k8s.io/apiserver's token cache, which keys its entries by an
// HMAC of the token, shares one review among concurrent checks of a token
// (detached from the first caller, whose cancellation must not fail the
// others) and forgets answers after reviewTTL. The token itself is kept
// only inside the clients built for its caller, which must send it.
type tokenReviewer struct {
	cached authenticator.Token
}

func newTokenReviewer(kube kubernetes.Interface, audiences []string, clientsFor func(string) (Kube, error)) *tokenReviewer {
	reviews := &tokenReviews{reviews: kube.AuthenticationV1().TokenReviews(), audiences: audiences, clientsFor: clientsFor}
	// Errors are not cached: a failed TokenReview is not the caller's
	// fault, and the next request asks again. Rejections are, as verdicts.
	return &tokenReviewer{cached: tokencache.New(reviews, false, reviewTTL, reviewTTL)}
}

// verify is an auth.TokenVerifier.
func (r *tokenReviewer) verify(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	resp, ok, err := r.cached.AuthenticateToken(ctx, token)
	if err != nil {
		return nil, err
	}
	var v *verdict
	if ok {
		v, ok = resp.User.(*verdict)
	}
	if !ok {
		// Not reached: tokenReviews answers every review with a verdict.
		return nil, fmt.Errorf("the bearer token is not valid for this cluster: %w", auth.ErrInvalidToken)
	}
	if v.rejected != "" {
		return nil, fmt.Errorf("%s: %w", v.rejected, auth.ErrInvalidToken)
	}
	return &auth.TokenInfo{UserID: v.caller.id.User, Expiration: v.expires, Extra: map[string]any{callerKey: v.caller}}, nil
}

// verdict is kube-apiserver's answer about a token as the cache keeps
// it: the caller it authenticated, or why it did not. A rejection is a
// verdict too, handed to the cache as a successful lookup, because the
// cache drops what a failed lookup says and remembers a failure's reason
// only as an error, and errors it would remember all alike, kube-apiserver
// not answering included.
type verdict struct {
	user.Info
	caller *caller
	// rejected says why the token is not accepted, or is "".
	rejected string
	// expires is when the cache forgets the verdict, a little late: the
	// cache counts from when it stores it, just after this is set.
	expires time.Time
}

// tokenReviews is the authenticator the cache wraps: one TokenReview for
// each token, sent with coder-k8s's own credentials. It is not
// k8s.io/apiserver's webhook token authenticator, which refuses a token
// whose audiences miss without saying which it has, and checks audiences
// before authentication: the 401 here says both, as docs/troubleshooting.md
// lists them.
type tokenReviews struct {
	reviews authenticationv1client.TokenReviewInterface
	// audiences, when set, are sent with every review and the token must
	// be valid for one of them.
	audiences []string
	// clientsFor builds the clients that act with token.
	clientsFor func(token string) (Kube, error)
}

// AuthenticateToken asks kube-apiserver about token.
func (t *tokenReviews) AuthenticateToken(ctx context.Context, token string) (*authenticator.Response, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, tokenReviewTimeout)
	defer cancel()
	review, err := t.reviews.Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: t.audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		// Not the caller's fault: a 500 says so, unlike a 401.
		return nil, false, fmt.Errorf("check the token with kube-apiserver: %w", err)
	}
	v := &verdict{Info: &user.DefaultInfo{}, rejected: t.rejection(review), expires: time.Now().Add(reviewTTL + time.Second)}
	if v.rejected == "" {
		u := review.Status.User
		v.Info = &user.DefaultInfo{Name: u.Username, UID: u.UID, Groups: u.Groups}
		v.caller = &caller{
			id:    &identity{User: u.Username, UID: u.UID, Groups: u.Groups},
			build: func() (Kube, error) { return t.clientsFor(token) },
		}
	}
	return &authenticator.Response{User: v}, true, nil
}

// rejection says why review does not authenticate its token for this
// server, or "" when it does.
func (t *tokenReviews) rejection(review *authenticationv1.TokenReview) string {
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
	if len(t.audiences) > 0 && !slices.ContainsFunc(review.Status.Audiences, func(a string) bool { return slices.Contains(t.audiences, a) }) {
		return fmt.Sprintf("the bearer token is not meant for this server: its audiences %q include none of mcp.audiences %q",
			review.Status.Audiences, t.audiences)
	}
	return ""
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
