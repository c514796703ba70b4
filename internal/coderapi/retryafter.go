package coderapi

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coder/coder/v2/codersdk"
)

// RetryAfterError is a 429 or 503 answer of coderd that said when to come
// back. coderd's rate limiter (httpmw.RateLimit, go-chi/httprate) answers
// 429 with Retry-After in seconds: the length of its window.
type RetryAfterError struct {
	// Err is coderd's answer read as a codersdk error.
	Err error
	// After is how long coderd asked the client to wait.
	After time.Duration
}

func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("%v (coderd asks to retry after %s)", e.Err, e.After)
}

func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter is how long coderd asked to wait; the watch cache's poller
// backs off at least that long.
func (e *RetryAfterError) RetryAfter() time.Duration { return e.After }

// ReadResponseError reads a failed response of a raw Request as codersdk
// does, keeping Retry-After of a 429 or 503 (a *RetryAfterError then).
func ReadResponseError(res *http.Response, now time.Time) error {
	err := codersdk.ReadBodyAsError(res)
	if res.StatusCode != http.StatusTooManyRequests && res.StatusCode != http.StatusServiceUnavailable {
		return err
	}
	if d, ok := parseRetryAfter(res.Header.Get("Retry-After"), now); ok {
		return &RetryAfterError{Err: err, After: d}
	}
	return err
}

// parseRetryAfter reads either form of RFC 9110's Retry-After: seconds or
// an HTTP date.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s < 0 {
			return 0, false
		}
		return time.Duration(min(s, int64(24*time.Hour/time.Second))) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
