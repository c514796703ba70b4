package apiserver

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/coder/coder-k8s/internal/aggregated/admission"
	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/kubecache"
	"github.com/coder/coder-k8s/internal/metrics/metricstest"
	"github.com/coder/coder-k8s/internal/scheme"
	"github.com/coder/coder-k8s/internal/testenv"
)

// noBackends serves no namespace: authentication comes before any
// backend is asked.
type noBackends struct{}

func (noBackends) Backends(context.Context, string) ([]backend.Backend, error) { return nil, nil }
func (noBackends) Ready() error                                                { return nil }

// TestRejectedTokensAreRemembered calls the aggregated API server
// directly (as anyone who can reach its port can) with the same bad
// bearer token again and again: kube-apiserver answers one TokenReview
// for it, counted by kube-apiserver's own request metrics.
func TestRejectedTokensAreRemembered(t *testing.T) {
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	// The records' informer, as the aggregated-apiserver mode sets it up.
	co := kubecache.Options()
	co.Scheme = scheme.New()
	rc, err := cache.New(k.Config, co)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := client.New(k.Config, client.Options{Scheme: co.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	cacheDone := make(chan struct{})
	go func() { _ = rc.Start(ctx); close(cacheDone) }()
	t.Cleanup(func() { cancel(); <-cacheDone })
	srv, err := New(Options{BindAddress: "127.0.0.1", SecurePort: port, CertDir: t.TempDir(),
		RequestTimeout: 30 * time.Minute, WatchPollInterval: 5 * time.Second,
		Kubeconfig: k.KubeconfigPath, Backends: noBackends{}, Records: records.New(rc, kc),
		Admission: &admission.Options{REST: k.Config, Cache: rc}, Log: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	base := fmt.Sprintf("https://127.0.0.1:%d", port)
	// The server's certificate is self-signed; this test is about who the
	// server lets in, not about who it is.
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // see above
	get := func(path, token string) int {
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	deadline := time.Now().Add(time.Minute)
	for get("/readyz", "") != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("the aggregated API server did not become ready")
		}
		time.Sleep(200 * time.Millisecond)
	}
	tokenReviews := func() float64 {
		t.Helper()
		time.Sleep(300 * time.Millisecond) // recorded as the response goes out
		return metricstest.APIServerValue(t, k.Clientset, "apiserver_request_total", map[string]string{"group": "authentication.k8s.io", "resource": "tokenreviews"})
	}

	// A service account token of this cluster with its signature broken
	// (kube-apiserver's review says why: status.error), and a string that
	// is no JWT (no reason given).
	if _, err := k.Clientset.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "forged"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := k.Clientset.CoreV1().ServiceAccounts("default").CreateToken(ctx, "forged", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	valid := tr.Status.Token
	forged := valid[:len(valid)-4] + "AAAA"
	const path = "/apis/aggregation.coder.com/v1alpha1/namespaces/default/coderworkspaces"
	for name, bad := range map[string]string{"a forged service account token": forged, "a string that is no JWT": "not-a-token"} {
		t.Run(name, func(t *testing.T) {
			before := tokenReviews()
			for range 20 {
				if code := get(path, bad); code != http.StatusUnauthorized {
					t.Fatalf("status %d for a bad token, want 401", code)
				}
			}
			var wg sync.WaitGroup
			for range 20 {
				wg.Go(func() {
					if code := get(path, bad); code != http.StatusUnauthorized {
						t.Errorf("status %d for a bad token, want 401", code)
					}
				})
			}
			wg.Wait()
			if got := tokenReviews() - before; got != 1 {
				t.Errorf("40 requests with one bad token cost %v TokenReviews, want 1", got)
			}
		})
	}

	t.Run("a valid token is reviewed once and let in", func(t *testing.T) {
		before := tokenReviews()
		for range 5 {
			// Authenticated, not authorized: 403, not 401.
			if code := get(path, valid); code != http.StatusForbidden {
				t.Fatalf("status %d for a valid token without RBAC, want 403", code)
			}
		}
		if got := tokenReviews() - before; got != 1 {
			t.Errorf("5 requests with a valid token cost %v TokenReviews, want 1", got)
		}
	})
}
