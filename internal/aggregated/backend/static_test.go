package backend

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/controllertest"
)

// startStatic runs p until the test ends and waits until it is ready.
func startStatic(t *testing.T, p *StaticProvider) {
	t.Helper()
	if err := p.Ready(); err == nil {
		t.Errorf("Ready before Start = nil, want an error")
	}
	if _, err := p.Backends(t.Context(), ""); err == nil {
		t.Errorf("Backends before Start answered without error")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	})
	eventually(t, "static provider ready", func() (bool, string) {
		if err := p.Ready(); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	if err := p.Start(ctx); err == nil {
		t.Errorf("a second Start = nil, want an error")
	}
}

// writeTokenFile replaces the file the way the kubelet updates a mounted
// Secret: a new file renamed over the old one.
func writeTokenFile(t *testing.T, path, token string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestStaticProviderTokenFileRotation(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t, "static-rotation")
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeTokenFile(t, tokenFile, "not-a-valid-token")

	p, err := NewStaticProvider(StaticOptions{URL: coderd.URL.String(), SessionTokenFile: tokenFile, Namespace: ns,
		CoderTimeout: 10 * time.Second}, kube.Clientset, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	startStatic(t, p)

	bs := waitBackends(t, p, ns, ns+"/")
	first := bs[0]
	if first.ControlPlane != "" || first.URL.String() != coderd.URL.String() {
		t.Errorf("backend = %+v", first)
	}
	if _, err := first.Client.User(ctx, codersdk.Me); !coderapi.IsUnauthorized(err) {
		t.Fatalf("with the invalid token: User(me) = %v, want 401", err)
	}
	if again, err := p.Backends(ctx, ""); err != nil || len(again) != 1 || again[0].Client != first.Client {
		t.Errorf("Backends(\"\") = %v, %v; want the same backend and client", keys(again), err)
	}
	if other, err := p.Backends(ctx, "some-other-namespace"); err != nil || len(other) != 0 {
		t.Errorf("Backends(other namespace) = %v, %v; want none", keys(other), err)
	}

	writeTokenFile(t, tokenFile, coderd.SessionToken)
	var rotated Backend
	eventually(t, "new token picked up", func() (bool, string) {
		bs, err := p.Backends(ctx, ns)
		if err != nil {
			return false, err.Error()
		}
		if len(bs) != 1 {
			return false, fmt.Sprintf("Backends = %v, want one", keys(bs))
		}
		rotated = bs[0]
		return rotated.Client != first.Client, "still the first client"
	})
	checkWorks(t, rotated)

	// A file that disappears or goes empty (mid-update) keeps the token.
	if err := os.Remove(tokenFile); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * tokenFileCheckInterval)
	if err := os.WriteFile(tokenFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * tokenFileCheckInterval)
	bs, err = p.Backends(ctx, ns)
	if err != nil || len(bs) != 1 || bs[0].Client != rotated.Client {
		t.Fatalf("after the token file went away: Backends = %v, %v; want the same client", keys(bs), err)
	}
	checkWorks(t, bs[0])
}

func TestStaticProviderNamespaceLifecycle(t *testing.T) {
	c := kubeClient(t)
	ns := "static-later-" + controllertest.RandomHex(3)
	p, err := NewStaticProvider(StaticOptions{URL: coderd.URL.String(), SessionToken: coderd.SessionToken, Namespace: ns,
		CoderTimeout: 10 * time.Second}, kube.Clientset, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	startStatic(t, p)

	// Ready with the namespace missing: no backends, no error.
	if bs, err := p.Backends(t.Context(), ns); err != nil || len(bs) != 0 {
		t.Fatalf("namespace missing: Backends = %v, %v; want none", keys(bs), err)
	}
	if err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	b := waitBackends(t, p, ns, ns+"/")[0]
	checkWorks(t, b)
	if len(b.ReservedUsers) != 0 {
		t.Errorf("the static backend reserves %q; its token's user is the administrator's choice", b.ReservedUsers)
	}
	waitBackends(t, p, "", ns+"/")

	deleteNamespace(t, c, ns)
	waitBackends(t, p, ns)
	waitBackends(t, p, "")
}

func TestStaticProviderConfigErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := StaticOptions{URL: "https://coder.example.com", SessionToken: "tok-SECRET-123", Namespace: "coder"}
	cases := map[string]struct {
		mutate func(*StaticOptions)
		want   string
	}{
		"no namespace":      {func(c *StaticOptions) { c.Namespace = "" }, "namespace is required"},
		"invalid namespace": {func(c *StaticOptions) { c.Namespace = "Not_A_Namespace" }, `namespace "Not_A_Namespace"`},
		"no url":            {func(c *StaticOptions) { c.URL = "" }, "url is required"},
		"no scheme":         {func(c *StaticOptions) { c.URL = "coder.example.com" }, "scheme must be http or https"},
		"ftp":               {func(c *StaticOptions) { c.URL = "ftp://coder.example.com" }, "scheme must be http or https"},
		"no host":           {func(c *StaticOptions) { c.URL = "https:///path" }, "has no host"},
		"unparsable url":    {func(c *StaticOptions) { c.URL = "https://coder example.com:x" }, "parse coderd URL"},
		"no token":          {func(c *StaticOptions) { c.SessionToken = "" }, "a session token is required"},
		"blank token":       {func(c *StaticOptions) { c.SessionToken = "  " }, "a session token is required"},
		"missing file": {func(c *StaticOptions) {
			c.SessionToken, c.SessionTokenFile = "", filepath.Join(dir, "missing")
		}, "no such file"},
		"empty file": {func(c *StaticOptions) { c.SessionToken, c.SessionTokenFile = "", empty }, "is empty"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := good
			tc.mutate(&cfg)
			_, err := NewStaticProvider(cfg, kube.Clientset, logr.Discard())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewStaticProvider = %v, want an error containing %q", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "SECRET") {
				t.Errorf("the error shows the token: %v", err)
			}
		})
	}
	if _, err := NewStaticProvider(good, nil, logr.Discard()); err == nil {
		t.Errorf("NewStaticProvider without a Kubernetes client = nil error")
	}
	// The flag's token wins over the file.
	cfg := good
	cfg.SessionTokenFile = filepath.Join(dir, "missing")
	p, err := NewStaticProvider(cfg, kube.Clientset, logr.Discard())
	if err != nil {
		t.Fatalf("token from the flag and a missing file: %v", err)
	}
	if p.client.SessionToken() != "tok-SECRET-123" {
		t.Errorf("client token = %q, want the flag's", p.client.SessionToken())
	}
}
