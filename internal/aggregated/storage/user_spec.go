package storage

// A user's spec as coder-k8s checks it: what a spec may hold, the order
// its sets are shown in, and what an update changes in Coder (the writes
// that act on it are in user_write.go).

import (
	"fmt"
	"slices"

	"github.com/coder/coder/v2/codersdk"
	"k8s.io/apimachinery/pkg/util/validation/field"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

var (
	passwordPath = specPath.Child("passwordSecretRef")
	rolesPath    = specPath.Child("roles")
	orgsPath     = specPath.Child("organizations")
)

// loginTypes are the login types coderd's create accepts.
var loginTypes = []string{string(codersdk.LoginTypePassword), string(codersdk.LoginTypeNone), string(codersdk.LoginTypeGithub), string(codersdk.LoginTypeOIDC)}

// validateUserSpec checks what a user's spec may hold, create or update.
func validateUserSpec(spec *aggv1.CoderUserSpec) field.ErrorList {
	var errs field.ErrorList
	if spec.LoginType != "" && !slices.Contains(loginTypes, spec.LoginType) {
		errs = append(errs, field.NotSupported(specPath.Child("loginType"), spec.LoginType, loginTypes))
	}
	errs = append(errs, validateRoles(spec.Roles, rolesPath, codersdk.RoleMember)...)
	seen := map[string]bool{}
	for i, o := range spec.Organizations {
		p := orgsPath.Index(i)
		if err := checkCoderName("organization", o.Name, coderName, maxCoderName, "letters, digits and single hyphens"); err != nil {
			errs = append(errs, field.Invalid(p.Child("name"), o.Name, err.Error()))
		}
		if seen[o.Name] {
			errs = append(errs, field.Duplicate(p.Child("name"), o.Name))
		}
		seen[o.Name] = true
		errs = append(errs, validateRoles(o.Roles, p.Child("roles"), codersdk.RoleOrganizationMember)...)
	}
	orgNames := make([]string, len(spec.Organizations))
	for i, o := range spec.Organizations {
		orgNames[i] = o.Name
	}
	if err := checkInNameOrder(orgsPath, orgNames); err != nil {
		errs = append(errs, err)
	}
	if ref := spec.PasswordSecretRef; ref != nil {
		if ref.Name == "" {
			errs = append(errs, field.Required(passwordPath.Child("name"), "the Secret holding the password"))
		}
		if ref.Key == "" {
			errs = append(errs, field.Required(passwordPath.Child("key"), "the Secret's key holding the password"))
		}
		if lt := spec.LoginType; lt != "" && lt != string(codersdk.LoginTypePassword) {
			errs = append(errs, field.Forbidden(passwordPath, fmt.Sprintf("only users of login type password have a password (this one's is %s)", lt)))
		}
	}
	return errs
}

// validateRoles refuses duplicates and the implicit role, which coderd
// never stores (so a read could not show it).
func validateRoles(roles []string, p *field.Path, implicit string) field.ErrorList {
	var errs field.ErrorList
	seen := map[string]bool{}
	for i, r := range roles {
		switch {
		case r == "":
			errs = append(errs, field.Required(p.Index(i), "a role name"))
		case r == implicit:
			errs = append(errs, field.Invalid(p.Index(i), r, "every user has it implicitly; leave it out"))
		case seen[r]:
			errs = append(errs, field.Duplicate(p.Index(i), r))
		}
		seen[r] = true
	}
	if err := checkInNameOrder(p, roles); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// sortedSpec is spec with its sets in the order reads show them.
func sortedSpec(spec *aggv1.CoderUserSpec) {
	if spec.Roles != nil {
		spec.Roles = slices.Sorted(slices.Values(spec.Roles))
	}
	if spec.Organizations != nil {
		orgs := slices.Clone(spec.Organizations)
		for i := range orgs {
			if orgs[i].Roles != nil {
				orgs[i].Roles = slices.Sorted(slices.Values(orgs[i].Roles))
			}
			if len(orgs[i].Roles) == 0 {
				orgs[i].Roles = nil
			}
		}
		slices.SortFunc(orgs, func(a, b aggv1.CoderUserOrganization) int { return compareStrings(a.Name, b.Name) })
		spec.Organizations = orgs
	}
}

// userChange is what an update changes in Coder.
type userChange struct {
	name, status, roles bool
	addOrgs, dropOrgs   []string
	orgRoles            []aggv1.CoderUserOrganization
	// password: the ref changed (read and set), or dropped (only the
	// record changes).
	passwordRef, passwordDropped bool
}

func (c userChange) any() bool {
	return c.name || c.status || c.roles || len(c.addOrgs) > 0 || len(c.dropOrgs) > 0 || len(c.orgRoles) > 0 || c.passwordRef || c.passwordDropped
}

// diffUser compares next with cur: unset roles or organizations keep
// Coder's, set ones are the whole set.
func diffUser(cur, next *aggv1.CoderUserSpec) userChange {
	var c userChange
	c.name = next.Name != cur.Name
	c.status = next.Suspended != cur.Suspended
	if next.Roles != nil {
		c.roles = !slices.Equal(slices.Sorted(slices.Values(next.Roles)), cur.Roles)
	}
	if next.Organizations != nil {
		have := map[string][]string{}
		for _, o := range cur.Organizations {
			have[o.Name] = o.Roles
		}
		want := map[string]bool{}
		for _, o := range next.Organizations {
			want[o.Name] = true
			roles := slices.Sorted(slices.Values(o.Roles))
			cr, ok := have[o.Name]
			if !ok {
				c.addOrgs = append(c.addOrgs, o.Name)
			}
			if len(roles) > 0 || ok {
				if !slices.Equal(roles, cr) && (len(roles) > 0 || len(cr) > 0) {
					c.orgRoles = append(c.orgRoles, aggv1.CoderUserOrganization{Name: o.Name, Roles: roles})
				}
			}
		}
		for _, o := range cur.Organizations {
			if !want[o.Name] {
				c.dropOrgs = append(c.dropOrgs, o.Name)
			}
		}
	}
	switch {
	case next.PasswordSecretRef == nil:
		c.passwordDropped = cur.PasswordSecretRef != nil
	case cur.PasswordSecretRef == nil || *cur.PasswordSecretRef != *next.PasswordSecretRef:
		c.passwordRef = true
	}
	return c
}

// reserved refuses a change of the Coder users coder-k8s made for itself.
