package mcpserver

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
)

// mcpPath is where the MCP endpoint is served.
const mcpPath = "/mcp"

// wellKnownPath is where RFC 9728 protected resource metadata is served;
// MCP clients first try it with the endpoint's path appended.
const wellKnownPath = "/.well-known/oauth-protected-resource"

// OAuth is the protected resource metadata of /mcp (RFC 9728), served
// with authentication on.
type OAuth struct {
	// Resource is the URL of /mcp as clients reach it. Empty means the
	// URL each request reached, scheme from the connection: set it behind
	// a TLS-terminating proxy.
	Resource string
	// AuthorizationServers are the issuer URLs of the identity providers
	// whose tokens kube-apiserver accepts; empty names none, and clients
	// need a token handed to them.
	AuthorizationServers []string
	// Scopes are the OAuth scopes clients should ask for.
	Scopes []string
}

// protectedResource describes /mcp as an OAuth 2.0 protected resource
// (RFC 9728), so MCP clients can find the authorization server to sign in
// with instead of being handed a token.
type protectedResource struct {
	oauth OAuth
}

// resource is the resource identifier of /mcp: the configured one, else
// the URL this request reached. X-Forwarded-Proto is not trusted: nothing
// tells this server whether a proxy set it or the client did; behind a
// TLS-terminating proxy, configure mcp.oauth.resource.
func (p protectedResource) resource(r *http.Request) string {
	if p.oauth.Resource != "" {
		return p.oauth.Resource
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host + mcpPath
}

// metadataURL is where the metadata of resource is, per RFC 9728 §3.1:
// the well-known path inserted between host and path.
func metadataURL(resource string) string {
	u, err := url.Parse(resource)
	if err != nil {
		return wellKnownPath
	}
	return u.Scheme + "://" + u.Host + wellKnownPath + strings.TrimSuffix(u.EscapedPath(), "/")
}

// metadata serves the protected resource metadata. It needs no token:
// clients read it to learn how to get one. authorization_servers is left
// out when none is configured (it is optional in RFC 9728 §2); clients
// then cannot sign in and need a token given to them.
func (p protectedResource) metadata() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
			Resource:               p.resource(r),
			AuthorizationServers:   p.oauth.AuthorizationServers,
			ScopesSupported:        p.oauth.Scopes,
			BearerMethodsSupported: []string{"header"},
			ResourceName:           "coder-k8s MCP",
		}).ServeHTTP(w, r)
	})
}

// requireToken lets through requests whose bearer token verify accepts;
// the others get 401 with a WWW-Authenticate challenge naming the
// metadata. The SDK's middleware checks the token and hands the caller to
// the tools; its challenge is replaced because it has a fixed metadata URL
// and no error code.
func (p protectedResource) requireToken(verify auth.TokenVerifier, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Accepted requests are served with w itself, unwrapped, so that
		// streaming and flushing work as without this middleware.
		accepted := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { next.ServeHTTP(w, r) })
		cw := &challengeWriter{ResponseWriter: w, challenge: challenge(metadataURL(p.resource(r)), r)}
		auth.RequireBearerToken(verify, nil)(accepted).ServeHTTP(cw, r)
	})
}

// challengeWriter adds the challenge to a 401.
type challengeWriter struct {
	http.ResponseWriter
	challenge string
}

func (c *challengeWriter) WriteHeader(code int) {
	if code == http.StatusUnauthorized {
		c.Header().Set("WWW-Authenticate", c.challenge)
	}
	c.ResponseWriter.WriteHeader(code)
}
