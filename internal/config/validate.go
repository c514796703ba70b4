package config

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/validate/content"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Validate returns every problem in cfg, each with its field path. It checks
// what can be known before anything starts; reachability is the process's
// job at run time.
func Validate(cfg *Configuration) field.ErrorList {
	var errs field.ErrorList
	if !slices.Contains(AppModes, cfg.App) {
		errs = append(errs, field.NotSupported(field.NewPath("app"), cfg.App, AppModes))
	}
	errs = append(errs, validateLogging(&cfg.Logging, field.NewPath("logging"))...)
	errs = append(errs, validateKubernetes(&cfg.Kubernetes, field.NewPath("kubernetes"))...)
	errs = append(errs, validateController(&cfg.Controller, field.NewPath("controller"))...)
	errs = append(errs, validateAggregated(cfg, field.NewPath("aggregatedAPIServer"))...)
	errs = append(errs, validateMCP(&cfg.MCP, field.NewPath("mcp"))...)
	return errs
}

func validateLogging(l *Logging, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if levels := []string{"debug", "info", "warn", "error"}; !slices.Contains(levels, l.Level) {
		errs = append(errs, field.NotSupported(p.Child("level"), l.Level, levels))
	}
	if formats := []string{"json", "console"}; !slices.Contains(formats, l.Format) {
		errs = append(errs, field.NotSupported(p.Child("format"), l.Format, formats))
	}
	return errs
}

func validateKubernetes(k *Kubernetes, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if k.QPS <= 0 {
		errs = append(errs, field.Invalid(p.Child("qps"), k.QPS, "must be greater than 0"))
	}
	if k.Burst < 1 {
		errs = append(errs, field.Invalid(p.Child("burst"), k.Burst, "must be at least 1"))
	}
	return errs
}

func validateController(c *Controller, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, validateAddress(c.HealthProbeBindAddress, p.Child("healthProbeBindAddress"), true)...)
	errs = append(errs, validateAddress(c.MetricsBindAddress, p.Child("metricsBindAddress"), true)...)
	errs = append(errs, positive(c.CoderRequestTimeout, p.Child("coderRequestTimeout"))...)
	errs = append(errs, positive(c.OperatorAccessCheckInterval, p.Child("operatorAccessCheckInterval"))...)
	errs = append(errs, positive(c.ReplacedTokenRevocationDelay, p.Child("replacedTokenRevocationDelay"))...)

	le, lp := &c.LeaderElection, p.Child("leaderElection")
	for _, msg := range validation.IsDNS1123Subdomain(le.LeaseName) {
		errs = append(errs, field.Invalid(lp.Child("leaseName"), le.LeaseName, msg))
	}
	if le.Namespace != "" {
		for _, msg := range validation.IsDNS1123Label(le.Namespace) {
			errs = append(errs, field.Invalid(lp.Child("namespace"), le.Namespace, msg))
		}
	}
	errs = append(errs, positive(le.LeaseDuration, lp.Child("leaseDuration"))...)
	errs = append(errs, positive(le.RenewDeadline, lp.Child("renewDeadline"))...)
	errs = append(errs, positive(le.RetryPeriod, lp.Child("retryPeriod"))...)
	errs = append(errs, validateWorkspaceRBAC(&c.WorkspaceRBAC, p.Child("workspaceRBAC"))...)
	// client-go's leader elector refuses these combinations at run time;
	// refuse them here, where the field can be named.
	if le.RenewDeadline.Duration >= le.LeaseDuration.Duration {
		errs = append(errs, field.Invalid(lp.Child("renewDeadline"), le.RenewDeadline.String(),
			fmt.Sprintf("must be less than leaseDuration (%s)", le.LeaseDuration)))
	}
	if float64(le.RenewDeadline.Duration) <= 1.2*float64(le.RetryPeriod.Duration) {
		errs = append(errs, field.Invalid(lp.Child("renewDeadline"), le.RenewDeadline.String(),
			fmt.Sprintf("must be more than 1.2 × retryPeriod (%s)", le.RetryPeriod)))
	}
	return errs
}

func validateWorkspaceRBAC(w *WorkspaceRBAC, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	// ClusterRole names are path segments (RBAC's own name validation).
	roleName := func(name string, fp *field.Path) {
		for _, msg := range content.IsPathSegmentName(name) {
			errs = append(errs, field.Invalid(fp, name, msg))
		}
	}
	if w.ClusterRole != "" {
		roleName(w.ClusterRole, p.Child("clusterRole"))
	}
	if w.DeploymentsClusterRole != "" {
		roleName(w.DeploymentsClusterRole, p.Child("deploymentsClusterRole"))
	}
	for i, r := range w.AllowedClusterRoles {
		if r == "" {
			errs = append(errs, field.Required(p.Child("allowedClusterRoles").Index(i), "a ClusterRole name"))
			continue
		}
		roleName(r, p.Child("allowedClusterRoles").Index(i))
	}
	seen := map[string]bool{}
	for i, g := range w.ExtraNamespaces {
		gp := p.Child("extraNamespaces").Index(i)
		for _, msg := range validation.IsDNS1123Label(g.ControlPlaneNamespace) {
			errs = append(errs, field.Invalid(gp.Child("controlPlaneNamespace"), g.ControlPlaneNamespace, msg))
		}
		if seen[g.ControlPlaneNamespace] {
			errs = append(errs, field.Duplicate(gp.Child("controlPlaneNamespace"), g.ControlPlaneNamespace))
		}
		seen[g.ControlPlaneNamespace] = true
		if len(g.Namespaces) == 0 {
			errs = append(errs, field.Required(gp.Child("namespaces"), "the namespaces these control planes may reach"))
		}
		for j, ns := range g.Namespaces {
			for _, msg := range validation.IsDNS1123Label(ns) {
				errs = append(errs, field.Invalid(gp.Child("namespaces").Index(j), ns, msg))
			}
		}
	}
	return errs
}

func validateAggregated(cfg *Configuration, p *field.Path) field.ErrorList {
	a := &cfg.AggregatedAPIServer
	var errs field.ErrorList
	if net.ParseIP(a.BindAddress) == nil {
		errs = append(errs, field.Invalid(p.Child("bindAddress"), a.BindAddress, "must be an IP address such as 0.0.0.0"))
	}
	if a.SecurePort < 1 || a.SecurePort > 65535 {
		errs = append(errs, field.Invalid(p.Child("securePort"), a.SecurePort, "must be between 1 and 65535"))
	}
	errs = append(errs, positive(a.RequestTimeout, p.Child("requestTimeout"))...)
	errs = append(errs, positive(a.WatchPollInterval, p.Child("watchPollInterval"))...)

	w, wp := &a.TemplateBuildWait, p.Child("templateBuildWait")
	errs = append(errs, positive(w.Timeout, wp.Child("timeout"))...)
	errs = append(errs, positive(w.InitialPollInterval, wp.Child("initialPollInterval"))...)
	errs = append(errs, positive(w.MaxPollInterval, wp.Child("maxPollInterval"))...)
	if w.BackoffAfter.Duration < 0 {
		errs = append(errs, field.Invalid(wp.Child("backoffAfter"), w.BackoffAfter.String(), "must not be negative"))
	}
	if w.InitialPollInterval.Duration > w.MaxPollInterval.Duration {
		errs = append(errs, field.Invalid(wp.Child("initialPollInterval"), w.InitialPollInterval.String(),
			fmt.Sprintf("must not exceed maxPollInterval (%s)", w.MaxPollInterval)))
	}

	if t, tp := &a.AutoTLS, p.Child("autoTLS"); t.Enabled {
		for _, f := range []struct {
			name, v string
		}{{"secretName", t.SecretName}, {"serviceName", t.ServiceName}, {"apiServiceName", t.APIServiceName}} {
			if f.v == "" {
				errs = append(errs, field.Required(tp.Child(f.name), "needed when autoTLS is enabled"))
			}
		}
		if t.CertValidity.Duration < time.Hour {
			errs = append(errs, field.Invalid(tp.Child("certValidity"), t.CertValidity.String(), "must be at least 1h"))
		}
	}

	errs = append(errs, validateClusterControllers(a.Identity.ClusterControllers, p.Child("identity", "clusterControllers"))...)

	c, cp := &a.Coder, p.Child("coder")
	errs = append(errs, positive(c.RequestTimeout, cp.Child("requestTimeout"))...)
	if c.RequestTimeout.Duration > a.RequestTimeout.Duration {
		errs = append(errs, field.Invalid(cp.Child("requestTimeout"), c.RequestTimeout.String(),
			fmt.Sprintf("must not exceed aggregatedAPIServer.requestTimeout (%s)", a.RequestTimeout)))
	}

	s, sp := &c.StaticBackend, cp.Child("staticBackend")
	switch {
	case s.Enabled():
		if u, err := url.Parse(s.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, field.Invalid(sp.Child("url"), s.URL, "must be an absolute http or https URL"))
		}
		if s.Namespace == "" {
			errs = append(errs, field.Required(sp.Child("namespace"), "the namespace the static backend's objects appear in"))
		} else {
			for _, msg := range validation.IsDNS1123Label(s.Namespace) {
				errs = append(errs, field.Invalid(sp.Child("namespace"), s.Namespace, msg))
			}
		}
		switch {
		case s.SessionTokenFile == "" && s.SessionToken == "":
			errs = append(errs, field.Required(sp.Child("sessionTokenFile"), "or the --coder-session-token flag"))
		case s.SessionTokenFile != "" && s.SessionToken != "":
			errs = append(errs, field.Forbidden(sp.Child("sessionTokenFile"), "may not be combined with the --coder-session-token flag"))
		}
		errs = append(errs, validateIdentity(&s.Identity, sp.Child("identity"))...)
	case cfg.App == AppAggregatedAPIServer:
		errs = append(errs, field.Required(sp.Child("url"),
			"aggregated-apiserver mode has no CoderControlPlane discovery and needs a static backend (or the --coder-url flag)"))
	case s.Namespace != "" || s.SessionTokenFile != "" || s.SessionToken != "":
		errs = append(errs, field.Required(sp.Child("url"), "namespace and session token are set but the URL is not"))
	}
	return errs
}

// validateClusterControllers checks usernames that act with the
// operator's session: exact names, each once, never the anonymous user.
func validateClusterControllers(names []string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	seen := map[string]bool{}
	for i, name := range names {
		ip := p.Index(i)
		switch {
		case name == "":
			errs = append(errs, field.Required(ip, "a Kubernetes username"))
		case strings.TrimSpace(name) != name:
			errs = append(errs, field.Invalid(ip, name, "must not start or end with whitespace: usernames are matched exactly"))
		case name == "system:anonymous":
			errs = append(errs, field.Forbidden(ip, "unauthenticated requests never act with the operator's Coder session"))
		case seen[name]:
			errs = append(errs, field.Duplicate(ip, name))
		}
		seen[name] = true
	}
	return errs
}

func validateIdentity(id *Identity, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if id.Mode != "Mapped" && id.Mode != "Operator" {
		errs = append(errs, field.NotSupported(p.Child("mode"), id.Mode, []string{"Mapped", "Operator"}))
	}
	if id.MatchBy != "Email" && id.MatchBy != "Username" {
		errs = append(errs, field.NotSupported(p.Child("matchBy"), id.MatchBy, []string{"Email", "Username"}))
	}
	seen := map[string]bool{}
	for i, m := range id.Mappings {
		mp := p.Child("mappings").Index(i)
		switch {
		case m.KubernetesUser == "":
			errs = append(errs, field.Required(mp.Child("kubernetesUser"), ""))
		case seen[m.KubernetesUser]:
			errs = append(errs, field.Duplicate(mp.Child("kubernetesUser"), m.KubernetesUser))
		}
		seen[m.KubernetesUser] = true
		if m.CoderUser == "" {
			errs = append(errs, field.Required(mp.Child("coderUser"), ""))
		}
	}
	return errs
}

func validateMCP(m *MCP, p *field.Path) field.ErrorList {
	errs := validateAddress(m.BindAddress, p.Child("bindAddress"), false)
	switch m.Auth {
	case MCPAuthKubernetes:
	case MCPAuthNone:
		if !loopbackAddress(m.BindAddress) {
			errs = append(errs, field.Invalid(p.Child("auth"), m.Auth, fmt.Sprintf(
				"allowed only when mcp.bindAddress is a loopback address (127.0.0.0/8, ::1 or localhost), and it is %q: without authentication every caller acts with coder-k8s's own permissions",
				m.BindAddress)))
		}
	default:
		errs = append(errs, field.NotSupported(p.Child("auth"), m.Auth, []MCPAuth{MCPAuthKubernetes, MCPAuthNone}))
	}
	if m.MaxRequestBytes < 1024 {
		errs = append(errs, field.Invalid(p.Child("maxRequestBytes"), m.MaxRequestBytes, "must be at least 1024"))
	}
	errs = append(errs, positive(m.ReadHeaderTimeout, p.Child("readHeaderTimeout"))...)
	errs = append(errs, positive(m.ToolTimeout, p.Child("toolTimeout"))...)
	for i, name := range m.AllowTools {
		if slices.Contains(m.DenyTools, name) {
			errs = append(errs, field.Invalid(p.Child("allowTools").Index(i), name, "is also in denyTools"))
		}
	}
	for i, a := range m.Audiences {
		if strings.TrimSpace(a) == "" {
			errs = append(errs, field.Invalid(p.Child("audiences").Index(i), a, "must not be empty"))
		}
	}
	errs = append(errs, validateMCPOAuth(&m.OAuth, p.Child("oauth"))...)
	return errs
}

// validateMCPOAuth checks the protected resource metadata's URLs: the
// resource is what clients compare the metadata with, the authorization
// servers are issuer identifiers (RFC 8414: https, no query or fragment).
func validateMCPOAuth(o *MCPOAuth, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if o.Resource != "" {
		u, err := url.Parse(o.Resource)
		switch {
		case err != nil || !u.IsAbs() || u.Host == "" || u.User != nil:
			errs = append(errs, field.Invalid(p.Child("resource"), o.Resource, "must be an absolute URL such as https://mcp.example.com/mcp"))
		case u.Scheme != "https" && !(u.Scheme == "http" && loopbackHost(u.Hostname())):
			errs = append(errs, field.Invalid(p.Child("resource"), o.Resource, "must use https (http only on a loopback host)"))
		case u.Fragment != "" || u.RawQuery != "":
			errs = append(errs, field.Invalid(p.Child("resource"), o.Resource, "must not have a query or fragment"))
		}
	}
	for i, s := range o.AuthorizationServers {
		u, err := url.Parse(s)
		if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			errs = append(errs, field.Invalid(p.Child("authorizationServers").Index(i), s,
				"must be an issuer URL: https, with no query or fragment, such as https://issuer.example.com"))
		}
	}
	for i, s := range o.Scopes {
		if s == "" || strings.ContainsAny(s, " \"\\") {
			errs = append(errs, field.Invalid(p.Child("scopes").Index(i), s, "must be a scope token: not empty, no spaces or quotes"))
		}
	}
	return errs
}

// loopbackAddress reports whether the listen address addr accepts
// connections from this machine only. An empty host listens everywhere.
func loopbackAddress(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	return loopbackHost(host)
}

// loopbackHost reports whether host names this machine only.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func positive(d Duration, p *field.Path) field.ErrorList {
	if d.Duration <= 0 {
		return field.ErrorList{field.Invalid(p, d.String(), "must be greater than 0")}
	}
	return nil
}

// validateAddress checks a [host]:port listen address; disableable
// addresses also accept "0", controller-runtime's "off".
func validateAddress(addr string, p *field.Path, disableable bool) field.ErrorList {
	if disableable && addr == "0" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return field.ErrorList{field.Invalid(p, addr, "must be a listen address such as \":8080\"")}
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return field.ErrorList{field.Invalid(p, addr, "port must be a number between 0 and 65535")}
	}
	return nil
}
