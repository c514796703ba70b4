// Package mcpclient is the MCP client the tests drive coder-k8s's MCP server
// with: the go-sdk client over streamable HTTP with a bearer token, tool
// calls whose structured content is decoded, and the text of a result. The
// mcpserver unit tests and test/e2e share it; it is apart from testenv so
// that it links nothing but the go-sdk.
package mcpclient

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Timeout bounds each HTTP request of a session and each MustCall.
const Timeout = 2 * time.Minute

// Options say how to connect; the zero value connects without a token.
type Options struct {
	// Token is sent as the bearer token; "" sends none.
	Token string
	// Transport carries the requests (nil for http.DefaultTransport); a
	// test sets one to add or read headers of its own.
	Transport http.RoundTripper
}

// Connect opens a session with the MCP endpoint at url (…/mcp).
func Connect(ctx context.Context, url string, o Options) (*mcp.ClientSession, error) {
	rt := o.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	if o.Token != "" {
		rt = bearer{token: o.Token, next: rt}
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "coder-k8s-test", Version: "v0"}, nil)
	// The server sends nothing outside a request's response, and the HTTP
	// client's timeout would cut a standalone GET stream; so none is opened.
	s, err := c.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:             url,
		HTTPClient:           &http.Client{Timeout: Timeout, Transport: rt},
		DisableStandaloneSSE: true,
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", url, err)
	}
	return s, nil
}

// MustConnect is Connect that fails the test on an error and closes the
// session when the test ends.
func MustConnect(t testing.TB, url string, o Options) *mcp.ClientSession {
	t.Helper()
	s, err := Connect(context.Background(), url, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// Call calls tool name with args (nil for none) and, when out is not nil
// and the result is not an isError one, decodes its structured content
// into out, zeroed first so that a field the result leaves out does not
// keep what an earlier call put there. The error is a protocol or decoding
// error; a tool's own failure is the result's IsError.
func Call(ctx context.Context, s *mcp.ClientSession, name string, args map[string]any, out any) (*mcp.CallToolResult, error) {
	params := &mcp.CallToolParams{Name: name}
	if args != nil {
		// A nil map would be sent as "arguments": null.
		params.Arguments = args
	}
	res, err := s.CallTool(ctx, params)
	if err != nil {
		return nil, fmt.Errorf("call %s %v: a protocol error instead of a result: %w", name, args, err)
	}
	if out != nil && !res.IsError {
		reflect.ValueOf(out).Elem().SetZero()
		raw, err := json.Marshal(res.StructuredContent)
		if err != nil {
			return res, fmt.Errorf("%s: encode structured content: %w", name, err)
		}
		if err := json.Unmarshal(raw, out); err != nil {
			return res, fmt.Errorf("%s: structured content %s: %w", name, raw, err)
		}
	}
	return res, nil
}

// MustCall is Call within Timeout that fails the test on a protocol or
// decoding error: every failure must come back as an isError result,
// which it returns.
func MustCall(t testing.TB, s *mcp.ClientSession, name string, args map[string]any, out any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	res, err := Call(ctx, s, name, args, out)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// Text is the text content of a result.
func Text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// ListTools lists every tool, following pages, sorted by name.
func ListTools(ctx context.Context, s *mcp.ClientSession) ([]*mcp.Tool, error) {
	var tools []*mcp.Tool
	for tool, err := range s.Tools(ctx, nil) {
		if err != nil {
			return nil, fmt.Errorf("tools/list: %w", err)
		}
		tools = append(tools, tool)
	}
	sort.Slice(tools, func(i, j int) bool { return tools[i].Name < tools[j].Name })
	return tools, nil
}
