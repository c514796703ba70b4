package coderapi

import "strings"

// routeWords are the fixed path segments of Coder's API routes (every
// literal segment of a /api/v2 path in codersdk v2.30.0, plus the user
// alias "me"). Operation keeps these and replaces every other segment
// (IDs, names) with a placeholder, so that operations are few.
var routeWords = toSet(`acl aibridge api appearance applications apps archive audit authcheck
authmethods autostart autoupdates available available-fields buildinfo builds cancel
change-password config connectionlog containers convert-login credentials custom daemons
daus default deployment devcontainers device dispatch-methods dormant dry-run
dynamic-parameters entitlements examples experiments extend external-agent external-auth
favorite files first gitsshkey groups healthz host idpsync inbox init-script input insights
interceptions invalidate keys licenses listening-ports login logout logs mapping
mark-all-as-read matched-provisioners me members method notifications oauth2-provider
organization organizations otp parameters password port-share prebuilds preferences
presets previous profile provisionerdaemons provisionerjobs provisionerkeys quiet-hours
read-status reconnecting-pty-signed-token recreate regions replicas request
resolve-autostart resources rich-parameters roles secrets send serve settings ssh state
stats status subscription system tasks templates templateversions test testgenerate
timings tokenconfig tokens ttl updatecheck usage users v2 validate-password variables
versions watch watch-metadata webpush workspace workspace-quota workspace-sharing
workspaceagents workspacebuilds workspaceproxies workspaces`)

// placeholder stands for a path segment that is not a route word.
const placeholder = "{id}"

// maxRouteSegments bounds how many segments an operation shows; Coder's
// routes have at most eight.
const maxRouteSegments = 10

var methods = toSet("GET HEAD POST PUT PATCH DELETE OPTIONS")

// Operation names a request to coderd for metrics and logs: the method
// and the path with IDs and names replaced, for example
// "GET /api/v2/users/{id}/workspace/{id}". A name that happens to be a
// route word stays as it is; the result is still one of a bounded set.
func Operation(method, path string) string {
	m := strings.ToUpper(method)
	if !methods[m] {
		m = "OTHER"
	}
	path = strings.Trim(path, "/")
	if path == "" {
		return m + " /"
	}
	var b strings.Builder
	b.WriteString(m)
	b.WriteByte(' ')
	for i, seg := range strings.Split(path, "/") {
		if i == maxRouteSegments {
			b.WriteString("/...")
			break
		}
		b.WriteByte('/')
		if routeWords[seg] {
			b.WriteString(seg)
		} else {
			b.WriteString(placeholder)
		}
	}
	return b.String()
}

func toSet(words string) map[string]bool {
	set := map[string]bool{}
	for _, w := range strings.Fields(words) {
		set[w] = true
	}
	return set
}
