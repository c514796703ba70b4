package apiserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
)

// tokenCacheTTL is how long the delegated authentication reuses
// kube-apiserver's answer about a bearer token, an acceptance or a
// rejection: a revoked token stops working within it, and a caller
// repeating a bad token costs one TokenReview per token in it.
const tokenCacheTTL = 10 * time.Second

// tokenReviewsPath is where the delegated authentication creates
// TokenReviews.
const tokenReviewsPath = "/apis/authentication.k8s.io/v1/tokenreviews"

// rememberRejections makes kube-apiserver's rejections of bearer tokens
// cacheable by k8s.io/apiserver's token cache. That cache keeps
// rejections only when the TokenReview gives no reason: one with a reason
// (status.error, as for a token that looks like a JWT but is not valid)
// arrives as an error, which it never keeps, so every request repeating
// such a token would cost a TokenReview. This drops the reason, after
// logging it at debug level, from the answers of the authentication
// client (see DelegatingAuthenticationOptions.CustomRoundTripperFn).
// Failed calls are left alone: kube-apiserver not answering is not a
// rejection.
func rememberRejections(log logr.Logger) func(http.RoundTripper) http.RoundTripper {
	return func(next http.RoundTripper) http.RoundTripper {
		return &rejectionsWithoutReason{next: next, log: log}
	}
}

type rejectionsWithoutReason struct {
	next http.RoundTripper
	log  logr.Logger
}

func (t *rejectionsWithoutReason) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost || !strings.HasSuffix(req.URL.Path, tokenReviewsPath) {
		return t.next.RoundTrip(req)
	}
	// JSON, whatever the client prefers, to read the answer here.
	req = req.Clone(req.Context())
	req.Header.Set("Accept", "application/json")
	resp, err := t.next.RoundTrip(req)
	if err != nil || (resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK) {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("read the TokenReview answer: %w", err)
	}
	var review authenticationv1.TokenReview
	if json.Unmarshal(body, &review) == nil && !review.Status.Authenticated && review.Status.Error != "" {
		t.log.V(1).Info("kube-apiserver rejected a bearer token", "reason", review.Status.Error)
		review.Status.Error = ""
		if b, err := json.Marshal(&review); err == nil {
			body = b
		}
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Del("Content-Length")
	return resp, nil
}
