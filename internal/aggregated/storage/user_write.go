package storage

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/rest"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/identity"
)

// Writes of users (coder v2.30.0 coderd/users.go, members.go). A create
// is POST /api/v2/users with the login type, the status, the password
// and the organizations, then the site roles (PUT /users/{u}/roles,
// which replaces the set) and each organization's roles. An update
// changes the profile name, suspends or activates, replaces the roles,
// adds and removes organization memberships and sets the password;
// email and login type cannot change in coderd. A delete is coderd's
// soft delete, which it refuses (417) while the user owns workspaces.
// Every call is made as the caller (Mapped mode), so coderd decides:
// only an owner may grant owner, template-admin, user-admin or auditor.

func (s *UserStorage) validateCreate(u *aggv1.CoderUser) (userName, field.ErrorList) {
	if u.Name == "" && u.GenerateName != "" {
		return userName{}, field.ErrorList{field.Forbidden(field.NewPath("metadata", "generateName"), "names are Coder usernames; give metadata.name")}
	}
	n, err := parseUserName(u.Name)
	if err != nil {
		return n, field.ErrorList{field.Invalid(namePath, u.Name, err.Error())}
	}
	errs := validateUserSpec(&u.Spec)
	if u.Spec.Email == "" {
		errs = append(errs, field.Required(specPath.Child("email"), "a new Coder user needs an email address"))
	}
	if (u.Spec.LoginType == "" || u.Spec.LoginType == string(codersdk.LoginTypePassword)) && u.Spec.PasswordSecretRef == nil {
		errs = append(errs, field.Required(passwordPath, "a user of login type password needs one: name a Secret key holding it, or choose loginType none (a machine account), github or oidc"))
	}
	if u.Spec.Organizations != nil && len(u.Spec.Organizations) == 0 {
		errs = append(errs, field.Required(orgsPath, "coderd places every new user in at least one organization; leave it out for the default organization"))
	}
	return n, errs
}

func (s *UserStorage) createdView(u *aggv1.CoderUser, t target, n userName) *aggv1.CoderUser {
	dry := u.DeepCopy()
	dry.Namespace = t.Namespace
	dry.Labels = map[string]string{}
	for k, v := range u.Labels {
		dry.Labels[k] = v
	}
	if t.ControlPlane != "" {
		dry.Labels[aggv1.LabelControlPlane] = t.ControlPlane
	}
	dry.CreationTimestamp = metav1.Now()
	if dry.Spec.LoginType == "" {
		dry.Spec.LoginType = string(codersdk.LoginTypePassword)
	}
	sortedSpec(&dry.Spec)
	dry.Status = aggv1.CoderUserStatus{LoginType: dry.Spec.LoginType, Status: string(codersdk.UserStatusDormant), CreatedAt: &dry.CreationTimestamp}
	if dry.Spec.Suspended {
		dry.Status.Status = string(codersdk.UserStatusSuspended)
	}
	return dry
}

// orgIDs resolves organization names to IDs (as the operator: names are
// not secret, and a caller may create users in organizations they cannot
// list).
func (s *UserStorage) orgIDs(ctx context.Context, t target, orgs []aggv1.CoderUserOrganization, name string) (map[string]uuid.UUID, codersdk.Organization, error) {
	all, err := t.operatorClient().Organizations(ctx)
	if err != nil {
		return nil, codersdk.Organization{}, s.coderErr(t, err, name)
	}
	byName := map[string]uuid.UUID{}
	var def codersdk.Organization
	for _, o := range all {
		byName[o.Name] = o.ID
		if o.IsDefault {
			def = o
		}
	}
	var errs field.ErrorList
	for i, o := range orgs {
		if _, ok := byName[o.Name]; !ok {
			errs = append(errs, field.NotFound(orgsPath.Index(i).Child("name"), o.Name))
		}
	}
	if len(errs) > 0 {
		return nil, def, s.invalid(name, errs)
	}
	return byName, def, nil
}

// password reads the password spec names, as the caller may: the value
// and the Secret's resourceVersion.
func (s *UserStorage) password(ctx context.Context, t target, ref *aggv1.SecretKeySelector, name string) (string, string, error) {
	return s.tpls.readSecretKey(ctx, &s.genericStore, t.Namespace, *ref, passwordPath, name)
}

// mayAssign refuses roles coderd would not let the caller assign, before
// anything changes in Coder (a create that half happened would leave a
// user without their roles): coderd's list of roles says, for its
// caller, which are assignable (rbac.CanAssignRole, what its role
// updates check). site is a set of site roles to grant, orgs the roles
// per organization ID. An unknown role is a 422.
func (s *UserStorage) mayAssign(ctx context.Context, t target, site []string, sitePath *field.Path, orgs map[uuid.UUID][]string, orgPaths map[uuid.UUID]*field.Path, name string) error {
	if t.caller == nil {
		return nil // the operator is an owner
	}
	c := t.caller.Client
	check := func(have []codersdk.AssignableRoles, want []string, p *field.Path) error {
		var errs field.ErrorList
		for i, r := range want {
			j := slices.IndexFunc(have, func(a codersdk.AssignableRoles) bool { return a.Name == r })
			switch {
			case j < 0:
				errs = append(errs, field.NotFound(p.Index(i), r))
			case !have[j].Assignable:
				return apierrors.NewForbidden(s.gr, name, &identity.Refused{Reason: fmt.Sprintf("coderd of %s refused Coder user %q: %s: role %q is not assignable by them (coderd's list of roles says so: only an owner may grant owner, template-admin, user-admin or auditor)",
					t.describe(), t.caller.Username, p.Index(i), r)})
			}
		}
		if len(errs) > 0 {
			return s.invalid(name, errs)
		}
		return nil
	}
	if len(site) > 0 {
		have, err := c.ListSiteRoles(ctx)
		if err != nil {
			return s.coderErr(t, err, name)
		}
		if err := check(have, site, sitePath); err != nil {
			return err
		}
	}
	for id, want := range orgs {
		if len(want) == 0 {
			continue
		}
		have, err := c.ListOrganizationRoles(ctx, id)
		if err != nil {
			return s.coderErr(t, err, name)
		}
		if err := check(have, want, orgPaths[id]); err != nil {
			return err
		}
	}
	return nil
}

// planCreate checks the user against coderd (the name is free, the
// organizations exist, the caller may read the password's Secret and
// assign the roles) and returns the create.
func (s *UserStorage) planCreate(ctx context.Context, t target, n userName, u, dry *aggv1.CoderUser, dryRun bool) (createCall, error) {
	byName, def, err := s.orgIDs(ctx, t, u.Spec.Organizations, u.Name)
	if err != nil {
		return nil, err
	}
	orgs := dry.Spec.Organizations
	if orgs == nil {
		if def.ID == uuid.Nil {
			return nil, s.invalid(u.Name, field.ErrorList{field.Required(orgsPath, "coderd has no default organization: name the user's organizations")})
		}
		orgs = []aggv1.CoderUserOrganization{{Name: def.Name}}
		byName[def.Name] = def.ID
		dry.Spec.Organizations = orgs
	}
	if existing, err := t.operatorClient().User(ctx, n.Username); err == nil && strings.EqualFold(existing.Username, n.Username) {
		return nil, apierrors.NewAlreadyExists(s.gr, u.Name)
	}
	orgRoles := map[uuid.UUID][]string{}
	orgPaths := map[uuid.UUID]*field.Path{}
	var ids []uuid.UUID
	for i, o := range u.Spec.Organizations {
		orgRoles[byName[o.Name]], orgPaths[byName[o.Name]] = o.Roles, orgsPath.Index(i).Child("roles")
	}
	for _, o := range orgs {
		ids = append(ids, byName[o.Name])
	}
	if err := s.mayAssign(ctx, t, u.Spec.Roles, rolesPath, orgRoles, orgPaths, u.Name); err != nil {
		return nil, err
	}
	var pw, rv string
	if ref := u.Spec.PasswordSecretRef; ref != nil {
		if pw, rv, err = s.password(ctx, t, ref, u.Name); err != nil {
			return nil, err
		}
	}
	if dryRun {
		if err := s.mayCreate(ctx, t, identity.Check{Resource: codersdk.ResourceUser, Action: codersdk.ActionCreate}, u.Name); err != nil {
			return nil, err
		}
		dry.Status.PasswordSecretResourceVersion = rv
		return nil, nil
	}
	return func(ctx context.Context) (object, func(*records.Record), error) {
		defer s.memberWritten()
		req := codersdk.CreateUserRequestWithOrgs{
			Email: u.Spec.Email, Username: n.Username, Name: u.Spec.Name, Password: pw,
			UserLoginType: codersdk.LoginType(dry.Spec.LoginType), OrganizationIDs: ids,
		}
		if u.Spec.Suspended {
			st := codersdk.UserStatusSuspended
			req.UserStatus = &st
		}
		created, err := t.Client.CreateUserWithOrgs(ctx, req)
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil, s.requestErr(ctx, t, err, u.Name, "coderd to create the user")
			}
			return nil, nil, s.createErr(t, err, u.Name)
		}
		after := func(err error, what string) error {
			return fmt.Errorf("user %s was created in Coder, but %s failed (apply the object again to complete it): %w", n.Username, what, err)
		}
		if len(u.Spec.Roles) > 0 {
			if _, err := t.Client.UpdateUserRoles(ctx, created.Username, codersdk.UpdateRoles{Roles: u.Spec.Roles}); err != nil {
				return nil, nil, s.coderErr(t, after(err, "setting its site roles"), u.Name)
			}
		}
		for _, o := range u.Spec.Organizations {
			if len(o.Roles) == 0 {
				continue
			}
			if _, err := t.Client.UpdateOrganizationMemberRoles(ctx, byName[o.Name], created.Username, codersdk.UpdateRoles{Roles: o.Roles}); err != nil {
				return nil, nil, s.coderErr(t, after(err, "setting its roles in organization "+o.Name), u.Name)
			}
		}
		applied := func(rec *records.Record) { setPasswordRecord(rec, u.Spec.PasswordSecretRef, rv) }
		shown := &records.Record{}
		applied(shown)
		out, err := s.readCoder(ctx, t, n, u.Name, shown)
		if err != nil {
			return nil, nil, err
		}
		return out, applied, nil
	}, nil
}

// setPasswordRecord records the Secret key the password was set from
// (nil: none).
func setPasswordRecord(rec *records.Record, ref *aggv1.SecretKeySelector, rv string) {
	if ref == nil {
		rec.Spec.Password = nil
		return
	}
	rec.Spec.Password = &coderv1alpha1.UserPasswordRecord{SecretName: ref.Name, SecretKey: ref.Key, SecretResourceVersion: rv}
}

// Create creates the user in Coder.
func (s *UserStorage) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, opts *metav1.CreateOptions) (runtime.Object, error) {
	return createObject(ctx, s, obj, createValidation, opts)
}

// Update changes the user in Coder (or only its Kubernetes metadata).
// With forceAllowCreate (server-side apply) a missing user is created.
func (s *UserStorage) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc, updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, opts *metav1.UpdateOptions) (runtime.Object, bool, error) {
	return updateObject(ctx, s, name, objInfo, createValidation, updateValidation, forceAllowCreate, opts)
}

func (s *UserStorage) validateUpdate(next, cur *aggv1.CoderUser, name string) field.ErrorList {
	errs := validateSameObject("user", name, next.Name, "", "")
	if next.Spec.Email != cur.Spec.Email {
		errs = append(errs, field.Forbidden(specPath.Child("email"), fmt.Sprintf("a Coder user's email cannot change (coderd has no API for it; it is %s)", cur.Spec.Email)))
	}
	if next.Spec.LoginType != "" && next.Spec.LoginType != cur.Spec.LoginType {
		errs = append(errs, field.Forbidden(specPath.Child("loginType"), fmt.Sprintf("a Coder user's login type cannot change through coder-k8s (it is %s)", cur.Spec.LoginType)))
	}
	spec := next.Spec
	if spec.LoginType == "" {
		spec.LoginType = cur.Spec.LoginType
	}
	return append(errs, validateUserSpec(&spec)...)
}

func (s *UserStorage) reserved(t target, cur *aggv1.CoderUser, what string) error {
	if slices.Contains(t.ReservedUsers, cur.Status.ID) || slices.Contains(t.ReservedUsers, userNameOf(cur)) {
		return apierrors.NewForbidden(s.gr, cur.Name, fmt.Errorf("the Coder user %s is coder-k8s' own access to %s; coder-k8s does not %s it", userNameOf(cur), t.describe(), what))
	}
	return nil
}

func userNameOf(u *aggv1.CoderUser) string {
	_, after, found := strings.Cut(u.Name, ".")
	if found {
		return after
	}
	return u.Name
}

// planUpdate makes the changes in Coder, as the caller.
func (s *UserStorage) planUpdate(n userName, name string, cur, next *aggv1.CoderUser) specUpdate {
	c := diffUser(&cur.Spec, &next.Spec)
	u := specUpdate{changed: c.any()}
	var pw, rv string
	setPassword := false
	u.check = func(ctx context.Context, w *write) (bool, error) {
		if err := s.reserved(w.t, cur, "change"); err != nil && (c.any() || next.Spec.PasswordSecretRef != nil) {
			return false, err
		}
		if ref := next.Spec.PasswordSecretRef; ref != nil {
			var err error
			switch {
			case c.passwordRef:
				if pw, rv, err = s.password(ctx, w.t, ref, name); err != nil {
					return false, err
				}
				setPassword = true
			default:
				// The same Secret: set again when it changed, if the
				// writer may read it (otherwise the write changes what
				// else it changes).
				if perr := s.tpls.mayGetSecret(ctx, &s.genericStore, w.t.Namespace, ref.Name, passwordPath, name); perr == nil {
					if pw, rv, err = s.password(ctx, w.t, ref, name); err != nil {
						return false, err
					}
					setPassword = rv != cur.Status.PasswordSecretResourceVersion
				}
			}
		}
		if c.roles || len(c.orgRoles) > 0 {
			var site []string
			if c.roles {
				site = added(cur.Spec.Roles, next.Spec.Roles)
			}
			byName, _, err := s.orgIDs(ctx, w.t, next.Spec.Organizations, name)
			if err != nil {
				return false, err
			}
			orgRoles, orgPaths := map[uuid.UUID][]string{}, map[uuid.UUID]*field.Path{}
			for _, o := range c.orgRoles {
				i := slices.IndexFunc(next.Spec.Organizations, func(x aggv1.CoderUserOrganization) bool { return x.Name == o.Name })
				var had []string
				if j := slices.IndexFunc(cur.Spec.Organizations, func(x aggv1.CoderUserOrganization) bool { return x.Name == o.Name }); j >= 0 {
					had = cur.Spec.Organizations[j].Roles
				}
				orgRoles[byName[o.Name]], orgPaths[byName[o.Name]] = added(had, o.Roles), orgsPath.Index(i).Child("roles")
			}
			if err := s.mayAssign(ctx, w.t, site, rolesPath, orgRoles, orgPaths, name); err != nil {
				return false, err
			}
		} else if len(c.addOrgs) > 0 {
			if _, _, err := s.orgIDs(ctx, w.t, next.Spec.Organizations, name); err != nil {
				return false, err
			}
		}
		return setPassword, nil
	}
	u.dryView = func(_ context.Context, _ *write, out object) error {
		o := out.(*aggv1.CoderUser)
		switch {
		case o.Spec.Suspended:
			o.Status.Status = string(codersdk.UserStatusSuspended)
		case cur.Spec.Suspended:
			o.Status.Status = string(codersdk.UserStatusActive)
		}
		if next.Spec.PasswordSecretRef == nil {
			o.Status.PasswordSecretResourceVersion = ""
		} else if setPassword {
			o.Status.PasswordSecretResourceVersion = rv
		}
		return nil
	}
	u.apply = func(ctx context.Context, w *write) (object, func(*records.Record), error) {
		t := w.t
		fail := func(err error) (object, func(*records.Record), error) { return nil, nil, s.coderErr(t, err, name) }
		if c.name {
			if _, err := t.Client.UpdateUserProfile(ctx, n.Username, codersdk.UpdateUserProfileRequest{Username: n.Username, Name: next.Spec.Name}); err != nil {
				return fail(err)
			}
		}
		if c.roles {
			if _, err := t.Client.UpdateUserRoles(ctx, n.Username, codersdk.UpdateRoles{Roles: next.Spec.Roles}); err != nil {
				return fail(err)
			}
		}
		if len(c.addOrgs) > 0 || len(c.dropOrgs) > 0 || len(c.orgRoles) > 0 {
			defer s.memberWritten()
			byName, _, err := s.orgIDs(ctx, t, append(slices.Clone(next.Spec.Organizations), cur.Spec.Organizations...), name)
			if err != nil {
				return nil, nil, err
			}
			for _, o := range c.addOrgs {
				if _, err := t.Client.PostOrganizationMember(ctx, byName[o], n.Username); err != nil {
					return fail(fmt.Errorf("add to organization %s: %w", o, err))
				}
			}
			for _, o := range c.orgRoles {
				roles := o.Roles
				if roles == nil {
					roles = []string{}
				}
				if _, err := t.Client.UpdateOrganizationMemberRoles(ctx, byName[o.Name], n.Username, codersdk.UpdateRoles{Roles: roles}); err != nil {
					return fail(fmt.Errorf("roles in organization %s: %w", o.Name, err))
				}
			}
			for _, o := range c.dropOrgs {
				if err := t.Client.DeleteOrganizationMember(ctx, byName[o], n.Username); err != nil {
					return fail(fmt.Errorf("remove from organization %s: %w", o, err))
				}
			}
		}
		if setPassword {
			if err := t.Client.UpdateUserPassword(ctx, n.Username, codersdk.UpdateUserPasswordRequest{Password: pw}); err != nil {
				return fail(passwordErr(err))
			}
		}
		if c.status {
			st := codersdk.UserStatusActive
			if next.Spec.Suspended {
				st = codersdk.UserStatusSuspended
			}
			if _, err := t.Client.UpdateUserStatus(ctx, n.Username, st); err != nil {
				return fail(err)
			}
		}
		mutate := func(rec *records.Record) {
			switch {
			case next.Spec.PasswordSecretRef == nil:
				setPasswordRecord(rec, nil, "")
			case setPassword:
				setPasswordRecord(rec, next.Spec.PasswordSecretRef, rv)
			}
		}
		shown := &records.Record{}
		if w.prev != nil {
			shown = w.prev.DeepCopy()
		}
		mutate(shown)
		out, err := s.readCoder(ctx, t, n, name, shown)
		return out, mutate, err
	}
	return u
}

// passwordErr keeps coderd's refusal of a password and drops the value
// (coderd never echoes it; its validation detail says what is wrong).
func passwordErr(err error) error {
	return fmt.Errorf("set the password: %w", err)
}

// added are the roles of want that have does not hold: what a change
// grants (removing a role needs what granting it needs, but coderd's
// list of assignable roles answers only for granting).
func added(have, want []string) []string {
	var out []string
	for _, r := range want {
		if !slices.Contains(have, r) {
			out = append(out, r)
		}
	}
	return out
}

// Delete deletes the user in Coder. coderd refuses while the user owns
// workspaces: 409 naming them.
func (s *UserStorage) Delete(ctx context.Context, name string, deleteValidation rest.ValidateObjectFunc, opts *metav1.DeleteOptions) (runtime.Object, bool, error) {
	return deleteObject(ctx, s, name, deleteValidation, opts)
}

func (s *UserStorage) releaseDelete(ctx context.Context, w *write, n userName, name string, cur, next *aggv1.CoderUser, dryRun bool) (runtime.Object, error) {
	return releaseAtOnce(ctx, w, cur, next, dryRun, func(ctx context.Context) error { return s.deleteUser(ctx, w.t, n, cur, name) })
}

func (s *UserStorage) deleteInCoder(ctx context.Context, w *write, n userName, name string, cur *aggv1.CoderUser) (runtime.Object, bool, error) {
	return deleteAtOnce(ctx, w, cur, func(ctx context.Context) error { return s.deleteUser(ctx, w.t, n, cur, name) })
}

// deleteUser deletes cur in Coder and drops it from the watch cache.
// coderd v2.30 answers 417 for a user who owns workspaces ("You cannot
// delete a user that has workspaces..."): a 409 naming them.
func (s *UserStorage) deleteUser(ctx context.Context, t target, n userName, cur *aggv1.CoderUser, name string) error {
	if err := s.reserved(t, cur, "delete"); err != nil {
		return err
	}
	err := t.Client.DeleteUser(ctx, userID(cur))
	switch {
	case err == nil:
	case coderapi.StatusCode(err) == http.StatusExpectationFailed:
		why := coderapi.Message(err)
		if ws, lerr := t.operatorClient().Workspaces(ctx, codersdk.WorkspaceFilter{Owner: n.Username}); lerr == nil && len(ws.Workspaces) > 0 {
			names := make([]string, 0, len(ws.Workspaces))
			for _, w := range ws.Workspaces {
				names = append(names, w.OrganizationName+"."+w.OwnerName+"."+w.Name)
			}
			slices.Sort(names)
			why = fmt.Sprintf("user %s owns workspaces %s; delete them first (coderd: %s)", n.Username, strings.Join(names, ", "), why)
		}
		return apierrors.NewConflict(s.gr, name, fmt.Errorf("coderd does not delete it: %s", why))
	case coderapi.IsNotFound(err):
		s.cache.Delete(t.Key(), name)
		return s.notFound(name, "coderd has no such user")
	default:
		return s.coderErr(t, err, name)
	}
	s.cache.Delete(t.Key(), name)
	return nil
}
