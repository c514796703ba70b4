package mcpserver

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/coder/coder-k8s/internal/metrics/metricstest"
)

// tokenReviews is how many TokenReviews kube-apiserver has answered, from
// its own request metrics.
func (h *harness) tokenReviews(t *testing.T) float64 {
	t.Helper()
	return h.requests(t, "authentication.k8s.io", "tokenreviews")
}

// requests is how many requests for resource kube-apiserver has answered.
func (h *harness) requests(t *testing.T, group, resource string) float64 {
	t.Helper()
	// The metric is recorded as the response goes out; let it land.
	time.Sleep(300 * time.Millisecond)
	return metricstest.APIServerValue(t, h.cs, "apiserver_request_total", map[string]string{"group": group, "resource": resource})
}

// postWithToken sends an MCP request with token and returns the status.
func (h *harness) postWithToken(t *testing.T, token string) int {
	t.Helper()
	status, _, _ := h.post(t, token)
	return status
}

// TestRejectedTokensAreRemembered sends the same bad token again and
// again, one after the other and all at once: kube-apiserver answers one
// TokenReview for it until the failure cache's TTL has passed.
func TestRejectedTokensAreRemembered(t *testing.T) {
	h := newHarness(t, nil, nil)
	// A service account token of this cluster with its signature broken
	// (kube-apiserver's review says why), and a string that is no JWT.
	valid := h.serviceAccountToken(t, "agents", "forged")
	forged := valid[:len(valid)-4] + "AAAA"
	for _, bad := range []string{forged, "not-a-token"} {
		before := h.tokenReviews(t)
		for range 20 {
			if code := h.postWithToken(t, bad); code != http.StatusUnauthorized {
				t.Fatalf("status %d for a bad token, want 401", code)
			}
		}
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				if code := h.postWithToken(t, bad); code != http.StatusUnauthorized {
					t.Errorf("status %d for a bad token, want 401", code)
				}
			})
		}
		wg.Wait()
		if got := h.tokenReviews(t) - before; got != 1 {
			t.Errorf("40 requests with one bad token cost %v TokenReviews, want 1", got)
		}
	}

	// A valid token is not affected by the failures, and is reviewed once.
	before := h.tokenReviews(t)
	for range 5 {
		if code := h.postWithToken(t, valid); code != http.StatusOK {
			t.Fatalf("status %d for a valid token, want 200", code)
		}
	}
	if got := h.tokenReviews(t) - before; got != 1 {
		t.Errorf("5 requests with a valid token cost %v TokenReviews, want 1", got)
	}

	// A rejection says why, as the first time.
	r := newTokenReviewer(h.cs, nil, nil)
	for range 2 {
		_, err := r.verify(t.Context(), "one-more-bad-token", nil)
		if !errors.Is(err, auth.ErrInvalidToken) || !strings.Contains(err.Error(), "the bearer token is not valid for this cluster") {
			t.Fatalf("verify of a bad token: %v, want ErrInvalidToken", err)
		}
	}

	// Briefly: after the TTL the bad token is reviewed again.
	time.Sleep(reviewTTL)
	before = h.tokenReviews(t)
	if code := h.postWithToken(t, "not-a-token"); code != http.StatusUnauthorized {
		t.Fatalf("status %d, want 401", code)
	}
	if got := h.tokenReviews(t) - before; got != 1 {
		t.Errorf("after %s the bad token cost %v TokenReviews, want 1 (reviewed again)", reviewTTL, got)
	}
}
