// userTransport: the HTTP transport that sends a mapped caller's requests with
// their current token and mints a new one when coderd answers 401.

package identity

import (
	"fmt"
	"net/http"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
)

// userTransport sends a request with the Coder user's current token and,
// when coderd answers 401 (the token was revoked or expired early),
// mints a new one and sends the request once more. It sends through the
// current owner client's transport (its timeout and metrics), so that a
// replaced owner client is not kept in use.
type userTransport struct {
	svc *Service
	e   *tokenEntry
}

func (t *userTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	token, err := t.svc.current(req.Context(), t.e, "")
	if err != nil {
		return nil, err
	}
	res, err := t.send(req, token)
	if err != nil || res.StatusCode != http.StatusUnauthorized {
		return res, err
	}
	if req.Body != nil && req.GetBody == nil {
		return res, nil
	}
	fresh, err := t.svc.current(req.Context(), t.e, token)
	if err != nil || fresh == token {
		return res, nil
	}
	_ = res.Body.Close()
	retry := req.Clone(req.Context())
	if req.GetBody != nil {
		if retry.Body, err = req.GetBody(); err != nil {
			return nil, fmt.Errorf("resend the request with a new token: %w", err)
		}
	}
	res, err = t.send(retry, fresh)
	if err == nil && res.StatusCode == http.StatusUnauthorized {
		// A fresh token refused too: the user is suspended (or gone).
		// Look the mapping up again rather than mint for every request.
		t.svc.forgetUser(t.e.key.coderd, t.e.userID)
	}
	return res, err
}

// forgetUser drops what is remembered of the Kubernetes users mapped onto
// a Coder user of a coderd.
func (s *Service) forgetUser(coderd string, id uuid.UUID) {
	for _, k := range s.users.Keys() {
		key := k.(userKey)
		if e, ok := s.cachedUser(key); ok && key.coderd == coderd && e.refused == nil && e.user.ID == id {
			s.users.Remove(key)
		}
	}
}

func (t *userTransport) send(req *http.Request, token string) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.Header.Set(codersdk.SessionTokenHeader, token)
	base := t.e.owner.Load().HTTPClient.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	return base.RoundTrip(r)
}
