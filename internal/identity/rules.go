// Package identity makes each caller of the aggregated API act in Coder as
// their own Coder user: it maps a Kubernetes user onto a Coder user of one
// coderd (Rules), never onto one coder-k8s keeps for itself, mints and
// caches short-lived tokens for that user with the operator's current owner
// session (tokens), and asks coderd what the user may read and change
// (authcheck), so that Coder, not coder-k8s, decides. The cluster's own
// controllers (garbage collector, namespace controller) are not mapped:
// they act with the operator's session, for the storage to restrict.
package identity

import (
	"fmt"
	"strings"
)

// Mode says whose Coder identity a coderd's callers act with.
type Mode string

const (
	// ModeMapped: every caller acts as the Coder user their Kubernetes
	// user maps to; unmapped callers are refused.
	ModeMapped Mode = "Mapped"
	// ModeOperator: every caller acts as the operator's own Coder user
	// (an owner). Whoever may use the Kubernetes resources may do what
	// an owner does in that coderd.
	ModeOperator Mode = "Operator"
)

// MatchField is the Coder user field a Kubernetes username is compared
// with.
type MatchField string

const (
	MatchEmail    MatchField = "Email"
	MatchUsername MatchField = "Username"
)

// Mapping names the Coder user of one Kubernetes user explicitly.
type Mapping struct {
	// KubernetesUser is the username kube-apiserver authenticated, exactly
	// (for example system:serviceaccount:argocd:argocd-application-controller).
	KubernetesUser string
	// CoderUser is a Coder username, or an email address when it holds
	// an @.
	CoderUser string
}

// Rules say how one coderd's callers are mapped.
type Rules struct {
	Mode Mode
	// UsernamePrefix is stripped from a Kubernetes username before it is
	// matched (for example "oidc:", the --oidc-username-prefix).
	UsernamePrefix string
	// MatchField is which Coder user field the rest must equal,
	// case-insensitively.
	MatchField MatchField
	// Mappings are matched before the rule above, and are the only way
	// to map a system: user (ServiceAccounts, nodes).
	Mappings []Mapping
}

// Mapped reports whether callers act as themselves.
func (r Rules) Mapped() bool { return r.Mode != ModeOperator }

// Validate checks rules, naming fields under path (for example
// "spec.identity").
func (r Rules) Validate(path string) error {
	switch r.Mode {
	case ModeMapped, ModeOperator:
	default:
		return fmt.Errorf("%s.mode: must be %s or %s, not %q", path, ModeMapped, ModeOperator, r.Mode)
	}
	switch r.MatchField {
	case MatchEmail, MatchUsername:
	default:
		return fmt.Errorf("%s.matchBy: must be %s or %s, not %q", path, MatchEmail, MatchUsername, r.MatchField)
	}
	seen := map[string]bool{}
	for i, m := range r.Mappings {
		p := fmt.Sprintf("%s.mappings[%d]", path, i)
		switch {
		case strings.TrimSpace(m.KubernetesUser) == "":
			return fmt.Errorf("%s.kubernetesUser: required", p)
		case strings.TrimSpace(m.CoderUser) == "":
			return fmt.Errorf("%s.coderUser: required", p)
		case seen[m.KubernetesUser]:
			return fmt.Errorf("%s.kubernetesUser: %q is mapped twice", p, m.KubernetesUser)
		}
		seen[m.KubernetesUser] = true
	}
	return nil
}

// candidate is what a Kubernetes username is looked up as in Coder.
type candidate struct {
	// value is a Coder username or email.
	value string
	field MatchField
	// explicit says a mapping named it.
	explicit bool
}

// lookupFor returns what Kubernetes user name is looked up as, or why it
// cannot be mapped (a *Refused).
func (r Rules) lookupFor(name string) (candidate, error) {
	for _, m := range r.Mappings {
		if m.KubernetesUser == name {
			field := MatchUsername
			if strings.Contains(m.CoderUser, "@") {
				field = MatchEmail
			}
			return candidate{value: m.CoderUser, field: field, explicit: true}, nil
		}
	}
	if name == "" {
		return candidate{}, &Refused{Reason: "the request has no authenticated user"}
	}
	if strings.HasPrefix(name, "system:") {
		return candidate{}, &Refused{Reason: fmt.Sprintf("Kubernetes user %q is a system user, which maps to a Coder user only through an explicit mapping (spec.identity.mappings)", name)}
	}
	v := strings.TrimPrefix(name, r.UsernamePrefix)
	if v == "" {
		return candidate{}, &Refused{Reason: fmt.Sprintf("Kubernetes user %q is empty once the prefix %q is stripped", name, r.UsernamePrefix)}
	}
	return candidate{value: v, field: r.MatchField}, nil
}
