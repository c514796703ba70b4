package coderapi

import (
	"errors"
	"net/http"
	"strings"

	"github.com/coder/coder/v2/codersdk"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

// entitlementHints are fragments of the messages an Enterprise coderd
// answers with when the license lacks a feature. v2.30.0 writes
// "<Feature> is a Premium feature. Contact sales!" (RequireFeatureMW, for
// example "External Provisioner Daemons is a Premium feature. Contact
// sales!" and "Workspace Proxy is a Premium feature. Contact sales!") and,
// on older routes, "... is an Enterprise feature. Contact sales!".
var entitlementHints = []string{
	"premium feature",
	"enterprise feature",
	"contact sales",
	"not entitled",
}

// FeatureUnavailable reports whether err means coderd does not offer the
// feature the request belongs to, and why (coderv1alpha1.ReasonNotSupported or
// coderv1alpha1.ReasonNotEntitled). Coder's own message is available from Message(err).
//
// What coderd v2.30.0 answers (checked against the real servers' code and
// the open-source build):
//   - open-source build: 404 {"message":"Route not found."} for every
//     Enterprise route (provisioner keys, workspace proxies, entitlements);
//   - open-source build, for a method the open-source build does not
//     route on a path it has (POST /api/v2/organizations, PATCH and
//     DELETE /api/v2/organizations/{organization}: the open-source router
//     has only their GET): chi's 405 with an empty body, read as "not
//     supported";
//   - Enterprise build without the entitlement: 403 with a "... is a
//     Premium feature. Contact sales!" message.
//
// A 404 counts only with Coder's "Route not found." message: a 404 for an
// item ("Resource not found or you do not have access to this resource")
// means the item does not exist, not that the feature is missing.
func FeatureUnavailable(err error) (reason string, ok bool) {
	if err == nil {
		return "", false
	}
	switch StatusCode(err) {
	case http.StatusMethodNotAllowed:
		// coderd answers 405 only from its router (no handler writes
		// one): the build has the path but not this method. Coder's
		// body is empty; a message would be a proxy's, not coderd's.
		if emptyBody(err) {
			return coderv1alpha1.ReasonNotSupported, true
		}
	case http.StatusNotFound:
		if isRouteNotFound(err) {
			return coderv1alpha1.ReasonNotSupported, true
		}
	case http.StatusForbidden:
		msg := strings.ToLower(Message(err))
		for _, hint := range entitlementHints {
			if strings.Contains(msg, hint) {
				return coderv1alpha1.ReasonNotEntitled, true
			}
		}
	}
	return "", false
}

// IsFeatureUnavailable reports whether err, returned by a request to an
// Enterprise endpoint, means that coderd does not offer the feature
// (open-source build or not entitled).
func IsFeatureUnavailable(err error) bool {
	_, ok := FeatureUnavailable(err)
	return ok
}

// isRouteNotFound reports coderd's answer for a path it has no route for.
func isRouteNotFound(err error) bool {
	msg := strings.ToLower(strings.TrimSpace(Message(err)))
	return strings.HasPrefix(msg, "route not found")
}

// emptyBody reports a coderd answer without a body, as codersdk reads
// one: with no Content-Type it is a non-JSON answer whose detail is "no
// response body"; as JSON, an "empty response body".
func emptyBody(err error) bool {
	var sdkErr *codersdk.Error
	if !errors.As(err, &sdkErr) {
		return false
	}
	if sdkErr.Message == "empty response body" {
		return true
	}
	return strings.HasPrefix(sdkErr.Message, "unexpected non-JSON response") && sdkErr.Detail == "no response body"
}
