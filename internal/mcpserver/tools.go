package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Kube is how tools reach Kubernetes: with auth "kubernetes" as the
// caller (clients built per caller, sending its token), with auth "none"
// as coder-k8s. Reads and writes of Coder objects go through
// kube-apiserver's aggregated API, so agents and kubectl see the same data.
type Kube struct {
	// Cached serves CoderControlPlanes, Deployments and Services. Only
	// coder-k8s's own (auth "none") may be a cache: the shared manager
	// cache in all mode, where controllers keep them fresh.
	Cached client.Reader
	// Direct reads what no controller caches (Pods, Events) and reads and
	// writes aggregation.coder.com objects; its scheme must know them.
	Direct client.Client
	// Clientset reads pod logs; coder-k8s's own also asks TokenReviews.
	Clientset kubernetes.Interface
}

// Output caps keep one call from flooding an agent's context.
const (
	defaultListLimit = 20
	maxListLimit     = 100
	// maxRowsLimit caps the workspace and template lists, whose rows are
	// compact (about 150 bytes), for callers that want everything at once.
	maxRowsLimit = 500
)

// toolMeta is what an agent reads about a tool before calling it.
type toolMeta struct {
	Title       string
	Description string
	// ReadOnly tools change nothing; the others are not registered in
	// read-only mode.
	ReadOnly bool
	// Destructive tools delete; they are registered only when the
	// configuration allows destructive tools.
	Destructive bool
	Idempotent  bool
	// OpenWorld tools reach beyond Kubernetes (coderd).
	OpenWorld bool
}

// tool is a tool definition ready to register.
type tool struct {
	name string
	meta toolMeta
	add  func(s *mcp.Server, t *mcp.Tool)
}

// call is one tool invocation: the request and the clients it reaches
// Kubernetes with.
type call struct {
	req  *mcp.CallToolRequest
	kube Kube
}

// kubeFor is what a call reaches Kubernetes with: the caller's own
// clients, or coder-k8s's with auth "none".
func (s *Server) kubeFor(req *mcp.CallToolRequest) (Kube, error) {
	if s.opts.AuthNone {
		return s.kube, nil
	}
	c := callerOf(req)
	if c == nil {
		return Kube{}, errNoCaller
	}
	return c.clients()
}

// handler is a typed tool implementation.
type handler[In, Out any] func(ctx context.Context, c *call, in In) (Out, error)

// define builds a tool whose input and output JSON schemas come from In and
// Out, so clients get typed arguments and structured content.
func define[In, Out any](s *Server, name string, meta toolMeta, h handler[In, Out]) tool {
	return tool{name: name, meta: meta, add: func(ms *mcp.Server, t *mcp.Tool) {
		// Derived here, not inside AddTool, so that the server keeps the
		// schema to show with argument errors.
		schema, err := jsonschema.For[In](nil)
		if err != nil {
			panic(fmt.Sprintf("tool %s: input schema: %v", name, err)) // recovered by registerTools
		}
		t.InputSchema = schema
		// The result is encoded here, once, for both the structured content
		// and its text copy. Given an output type, the SDK would encode it,
		// decode it again to check it against the schema derived from that
		// same type, and encode it once more: for a page of 500 rows, more
		// time than reading the rows from kube-apiserver.
		outSchema, err := jsonschema.For[Out](nil)
		if err != nil {
			panic(fmt.Sprintf("tool %s: output schema: %v", name, err)) // recovered by registerTools
		}
		t.OutputSchema = outSchema
		mcp.AddTool(ms, t, func(ctx context.Context, req *mcp.CallToolRequest, in In) (res *mcp.CallToolResult, _ any, err error) {
			ctx, cancel := context.WithTimeout(ctx, s.opts.ToolTimeout)
			defer cancel()
			// Deferred first, so it runs last and sees a recovered panic's
			// error; observeToolCalls logs and counts the call.
			defer func() { recordToolCall(ctx, err) }()
			defer func() {
				// A bug in one tool must not kill the session.
				if p := recover(); p != nil {
					s.log.Error(fmt.Errorf("panic: %v", p), "tool panicked", "tool", name, "stack", string(debug.Stack()))
					res, err = nil, fmt.Errorf("internal error in tool %s; the server log has details", name)
				}
			}()
			kube, err := s.kubeFor(req)
			if err != nil {
				return nil, nil, err
			}
			out, err := h(ctx, &call{req: req, kube: kube}, in)
			if err != nil {
				return nil, nil, explain(err, s.opts.AuthNone)
			}
			raw, err := json.Marshal(out)
			if err != nil {
				return nil, nil, fmt.Errorf("encode the result of tool %s: %w", name, err)
			}
			return &mcp.CallToolResult{StructuredContent: json.RawMessage(raw), Content: []mcp.Content{&mcp.TextContent{Text: string(raw)}}}, nil, nil
		})
	}}
}

// mcpTool is the protocol description of t.
func (t tool) mcpTool() *mcp.Tool {
	destructive, openWorld := t.meta.Destructive, t.meta.OpenWorld
	return &mcp.Tool{
		Name:        t.name,
		Title:       t.meta.Title,
		Description: t.meta.Description,
		Annotations: &mcp.ToolAnnotations{
			Title:           t.meta.Title,
			ReadOnlyHint:    t.meta.ReadOnly,
			DestructiveHint: &destructive,
			IdempotentHint:  t.meta.Idempotent,
			OpenWorldHint:   &openWorld,
		},
	}
}

// explain turns an error into a message an agent can act on; authNone
// says the tools act with coder-k8s's own permissions.
func explain(err error, authNone bool) error {
	var se apierrors.APIStatus
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("the call took longer than the tool timeout: %w", err)
	case errors.As(err, &se):
		// err.Error() keeps the context the tool added ("get coderworkspace
		// ns/name: ...") in front of kube-apiserver's message.
		switch {
		case apierrors.IsNotFound(err):
			return fmt.Errorf("%w (check the namespace and the name; the list tools show what exists)", err)
		case apierrors.IsForbidden(err) && authNone:
			return fmt.Errorf("%w (with mcp.auth none the tools act with coder-k8s's own permissions, which include none of what only the tools need; use mcp.auth kubernetes)", err)
		case apierrors.IsForbidden(err):
			// kube-apiserver's message names the user, verb and resource.
			return fmt.Errorf("%w (the tools act with your own Kubernetes RBAC, as kubectl would; ask for a Role granting it)", err)
		case apierrors.IsUnauthorized(err):
			return fmt.Errorf("%w (kube-apiserver did not accept your bearer token: with mcp.audiences set, the token must also be valid for kube-apiserver's own audience)", err)
		case apierrors.IsServiceUnavailable(err):
			return fmt.Errorf("%w (retry later; the tool health reports what is unreachable)", err)
		}
	}
	return err
}

func callerName(req *mcp.CallToolRequest) string {
	if id := identityOf(req); id != nil {
		return id.User
	}
	return ""
}

// registerTools adds the tools the configuration allows to ms and returns
// them by name.
func (s *Server) registerTools(ms *mcp.Server, all []tool) (_ map[string]*mcp.Tool, err error) {
	defer func() {
		// The SDK panics on a tool it cannot describe: a programming
		// error, reported at start rather than crashing.
		if p := recover(); p != nil {
			err = fmt.Errorf("register MCP tools: %v", p)
		}
	}()
	known := map[string]bool{}
	for _, t := range all {
		known[t.name] = true
	}
	for _, n := range append(slices.Clone(s.opts.AllowTools), s.opts.DenyTools...) {
		if !known[n] {
			return nil, fmt.Errorf("mcp.allowTools/denyTools: unknown tool %q (tools: %s)", n, strings.Join(sortedKeys(known), ", "))
		}
	}
	registered := map[string]*mcp.Tool{}
	for _, t := range all {
		switch {
		case s.opts.ReadOnly && !t.meta.ReadOnly,
			t.meta.Destructive && !s.opts.AllowDestructiveTools,
			len(s.opts.AllowTools) > 0 && !slices.Contains(s.opts.AllowTools, t.name),
			slices.Contains(s.opts.DenyTools, t.name):
			continue
		}
		mt := t.mcpTool()
		t.add(ms, mt)
		registered[t.name] = mt
	}
	return registered, nil
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// argumentHelp turns the protocol errors agents hit most into tool errors
// they can read and act on: an unknown tool names the tools there are, and
// ill-typed arguments come back with the tool's input schema.
func argumentHelp(tools map[string]*mcp.Tool) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			res, err := next(ctx, method, req)
			if method != "tools/call" {
				return res, err
			}
			call, ok := req.(*mcp.CallToolRequest)
			if !ok || call.Params == nil {
				return res, err
			}
			if err != nil {
				if _, exists := tools[call.Params.Name]; !exists {
					return errorResult(fmt.Sprintf("unknown tool %q; the tools are: %s", call.Params.Name, strings.Join(sortedToolNames(tools), ", "))), nil
				}
				return res, err
			}
			r, ok := res.(*mcp.CallToolResult)
			if !ok || !r.IsError || len(r.Content) == 0 {
				return res, err
			}
			if text, ok := r.Content[0].(*mcp.TextContent); ok && strings.HasPrefix(text.Text, `validating "arguments"`) || ok && strings.Contains(text.Text, "cannot unmarshal") {
				if t := tools[call.Params.Name]; t != nil {
					schema, _ := json.Marshal(t.InputSchema)
					text.Text += "\nThe arguments must match this JSON schema: " + string(schema)
				}
			}
			return r, nil
		}
	}
}

func sortedToolNames(m map[string]*mcp.Tool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func errorResult(msg string) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: msg}}}
}

// page cuts a sorted list to limit items after the position a continue
// token names, and returns the token for the rest ("" at the end).
func page[T any](items []T, limit int, cont string) ([]T, string, error) {
	return cut(items, min(limit, maxListLimit), cont, "")
}

// pageAt is page for a list read at resourceVersion rv: the token carries
// rv, so the next page is read no older than this one (from the aggregated
// API's watch cache) instead of from coderd again.
func pageAt[T any](items []T, limit int, cont, rv string) ([]T, string, error) {
	return cut(items, min(limit, maxRowsLimit), cont, rv)
}

func cut[T any](items []T, limit int, cont, rv string) ([]T, string, error) {
	if limit <= 0 {
		limit = defaultListLimit
	}
	tok, err := parseContinue(cont)
	if err != nil {
		return nil, "", err
	}
	if tok.offset >= len(items) {
		return []T{}, "", nil
	}
	end := min(tok.offset+limit, len(items))
	next := ""
	if end < len(items) {
		raw := "offset:" + strconv.Itoa(end)
		if rv != "" {
			raw += ";rv:" + rv
		}
		next = base64.RawURLEncoding.EncodeToString([]byte(raw))
	}
	return items[tok.offset:end], next, nil
}

type continueToken struct {
	offset int
	rv     string
}

func parseContinue(cont string) (continueToken, error) {
	var tok continueToken
	if cont == "" {
		return tok, nil
	}
	bad := fmt.Errorf("continue %q is not a token this tool returned; call it again without continue", cont)
	raw, err := base64.RawURLEncoding.DecodeString(cont)
	if err != nil {
		return tok, bad
	}
	offset, rv, _ := strings.Cut(string(raw), ";")
	n, err := strconv.Atoi(strings.TrimPrefix(offset, "offset:"))
	if err != nil || n < 0 || !strings.HasPrefix(offset, "offset:") {
		return tok, bad
	}
	tok.offset = n
	if rv != "" {
		if !strings.HasPrefix(rv, "rv:") {
			return tok, bad
		}
		tok.rv = strings.TrimPrefix(rv, "rv:")
	}
	return tok, nil
}

// listQuery reads a first page at resourceVersion "0": the aggregated
// API answers from its watch cache when that is at most two poll intervals
// old (and asks coderd otherwise), like an informer's first list. Later
// pages are read no older than the first.
func listQuery(cont string) url.Values {
	rv := "0"
	if tok, err := parseContinue(cont); err == nil && tok.rv != "" {
		rv = tok.rv
	}
	return url.Values{"resourceVersion": {rv}}
}
