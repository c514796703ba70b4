package watchcache

import (
	"errors"
	"time"
)

// Outage is a backend whose last List failed: since when it has failed
// without a success in between, and the last failure.
type Outage struct {
	Since time.Time
	Last  error
	// Retry is when the backend's backoff lets it be listed again.
	Retry time.Time
}

// Outage reports whether key's last List failed (the poller's or one a
// request reported with ListFailed), and since when. Requests across
// namespaces answer such a backend from the cache rather than wait for it.
func (c *Cache) Outage(key string) (Outage, bool) {
	c.listMu.Lock()
	defer c.listMu.Unlock()
	b := c.backoffs[key]
	if b == nil || b.failures == 0 {
		return Outage{}, false
	}
	return Outage{Since: b.since, Last: c.lastErrs[key], Retry: b.until}, true
}

// ListFailed records a List of key that a request made and that failed, as
// a failed poll does: the poller backs off, and Outage reports it.
func (c *Cache) ListFailed(key string, err error) {
	c.backOff(key, err, 0)
}

// ListSucceeded ends key's outage after a List a request made succeeded
// (an incomplete List counts: coderd answered).
func (c *Cache) ListSucceeded(key string, err error) {
	if err != nil && !errors.Is(err, ErrIncomplete) {
		return
	}
	c.listMu.Lock()
	defer c.listMu.Unlock()
	delete(c.backoffs, key)
	delete(c.lastErrs, key)
}
