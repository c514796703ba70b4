package storage

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/identity"
)

// coderusers: every (non-system) user of a coderd, one object per user,
// named by username. A user's organizations and organization roles come
// from the organizations' member lists. Reads are the operator's, shown
// to a mapped caller as coderd shows users (userAccess: members see
// themselves; auditors, template admins, user admins and owners see
// everyone). The password is never read back: the object shows the
// Secret key it was last set from, which its record keeps.

// UserStorage serves coderusers.
type UserStorage struct {
	genericStore
	// coderd deletes a user at once (soft delete).
	deletedAtOnce[*aggv1.CoderUser]
	// tpls reads Secrets for the caller (its SubjectAccessReview and
	// Secret reader are shared with spec.variables).
	tpls *TemplateStorage
	// memo keeps what the last list of each coderd made of each user's
	// JSON and memberships (user_list.go).
	memo listMemo[*userMemo]
	// members keeps each organization member's roles by the hash of the
	// member's JSON in the last list.
	members listMemo[memberEntry]
	// orgMembers holds, per coderd (target.coderdKey), the last read of
	// its organizations' members (orgMembers); memberWrites counts the
	// writes of memberships through this replica.
	orgMembers   sync.Map
	memberWrites atomic.Uint64
}

// NewUsers returns the coderusers storage; it reads passwords' Secrets
// through tpls. Run must run for watches to see changes.
func NewUsers(o Options, tpls *TemplateStorage) (*UserStorage, error) {
	s := &UserStorage{
		genericStore: genericStore{
			gr:       aggv1.Resource("coderusers"),
			kind:     "CoderUser",
			backends: o.Backends,
			ident:    o.Identity,
			access:   userAccess,
			log:      o.Log.WithName("coderusers"),
			fields: map[string]string{
				"username":         "metadata.name",
				"email":            "spec.email",
				"name":             "spec.name",
				"login_type":       "spec.loginType",
				"password":         "spec.passwordSecretRef",
				"roles":            "spec.roles",
				"organization_ids": "spec.organizations",
			},
		},
		tpls: tpls,
	}
	s.sourcesListed = func(ts []target) { s.memo.retain(ts); s.members.retain(ts); s.retainMembers(ts) }
	if err := startCache(&s.genericStore, o, s.listUsers, aggv1.UserFields); err != nil {
		return nil, err
	}
	return s, nil
}

var _ restStorage = (*UserStorage)(nil)

func (s *UserStorage) New() runtime.Object     { return &aggv1.CoderUser{} }
func (s *UserStorage) NewList() runtime.Object { return &aggv1.CoderUserList{} }
func (s *UserStorage) GetSingularName() string { return "coderuser" }
func (s *UserStorage) ShortNames() []string    { return []string{"cu"} }

// userName identifies a user: [controlPlane.]username.
type userName struct {
	ControlPlane string
	Username     string
}

func (n userName) controlPlane() string { return n.ControlPlane }

func (n userName) String(prefixed bool) string { return joinName(prefixed, n.ControlPlane, n.Username) }

func parseUserName(s string) (userName, error) {
	cp, parts, err := splitName(s, 1, "a user name is the Coder username, or <control plane>.<username> when the namespace has several control planes")
	var n userName
	if parts != nil {
		n = userName{ControlPlane: cp, Username: parts[0]}
	}
	if err != nil {
		return n, err
	}
	return n, checkCoderName("user", n.Username, coderName, maxCoderName, "letters, digits and single hyphens")
}

// userAccess: coderd lets a member read only their own user
// (rbac.ResourceUserObject: the user is its own owner); roles with site
// read on users read every one. Nothing is redacted: what coderd shows a
// caller of a user it shows whole.
var userAccess = access{
	checks: func(o watchcache.Object) (objectChecks, bool) {
		u := o.(*aggv1.CoderUser)
		id, err := uuid.Parse(u.Status.ID)
		if err != nil {
			return objectChecks{}, false
		}
		read := identity.Check{Resource: codersdk.ResourceUser, Action: codersdk.ActionRead, ResourceID: id, OwnerID: id}
		update := read
		update.Action = codersdk.ActionUpdate
		readAll := identity.Check{Resource: codersdk.ResourceUser, Action: codersdk.ActionRead}
		return objectChecks{read: read, update: update, readAll: &readAll, updateAll: &readAll}, true
	},
	redact: func(o watchcache.Object) watchcache.Object { return o },
}

// memberships maps a user's ID to their organization memberships.
type memberships map[uuid.UUID][]aggv1.CoderUserOrganization

// hiddenRoles are the roles every user, or every organization member,
// has implicitly: coderd never stores them, and they are not listed.
var hiddenRoles = []string{codersdk.RoleMember, codersdk.RoleOrganizationMember}

// roleNames are the names of roles, without the implicit ones, sorted:
// a set reads back in one order.
func roleNames(rs []codersdk.SlimRole) []string {
	var out []string
	for _, r := range rs {
		if !slices.Contains(hiddenRoles, r.Name) {
			out = append(out, r.Name)
		}
	}
	slices.Sort(out)
	return out
}

// membersOf reads the members of every organization of orgs: who belongs
// to which, with which roles. ofUser limits it to one user (uuid.Nil:
// everyone).
func membersOf(ctx context.Context, c *codersdk.Client, orgs []codersdk.Organization, ofUser uuid.UUID) (memberships, error) {
	var mu sync.Mutex
	out := memberships{}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(coderapi.MaxParallel)
	for _, org := range orgs {
		g.Go(func() error {
			var opts []codersdk.OrganizationMembersQueryOption
			if ofUser != uuid.Nil {
				opts = append(opts, codersdk.OrganizationMembersQueryOptionUserID(ofUser))
			}
			ms, err := c.OrganizationMembers(gctx, org.ID, opts...)
			if coderapi.IsNotFound(err) {
				return nil // deleted meanwhile
			}
			if err != nil {
				return fmt.Errorf("list members of organization %s: %w", org.Name, err)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, m := range ms {
				out[m.UserID] = append(out[m.UserID], aggv1.CoderUserOrganization{Name: org.Name, Roles: roleNames(m.Roles)})
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for id := range out {
		slices.SortFunc(out[id], func(a, b aggv1.CoderUserOrganization) int { return compareStrings(a.Name, b.Name) })
	}
	return out, nil
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// convert is the view of user u with its organizations, showing the
// password's Secret as rec records it (nil: read the user's record). nil
// for a user whose name cannot be an object name.
func (s *UserStorage) convert(ctx context.Context, t target, u *codersdk.User, orgs []aggv1.CoderUserOrganization, rec *records.Record) (*aggv1.CoderUser, error) {
	if err := checkCoderName("user", u.Username, coderName, maxCoderName, ""); err != nil {
		s.log.V(1).Info("user not served: its name cannot be an object name", "user", u.Username)
		return nil, nil
	}
	if rec == nil {
		var err error
		if rec, err = s.records.get(ctx, s.recordKey(t, u.ID.String())); err != nil {
			return nil, apierrors.NewInternalError(err)
		}
	}
	obj := toUser(t, u, orgs)
	showPassword(obj, rec)
	return obj, nil
}

// toUser builds the Kubernetes view of user u. Deterministic: the same
// user reads the same.
func toUser(t target, u *codersdk.User, orgs []aggv1.CoderUserOrganization) *aggv1.CoderUser {
	labels := map[string]string{}
	if t.ControlPlane != "" {
		labels[aggv1.LabelControlPlane] = t.ControlPlane
	}
	n := userName{ControlPlane: t.ControlPlane, Username: u.Username}
	obj := &aggv1.CoderUser{
		TypeMeta:   metav1.TypeMeta{APIVersion: aggv1.SchemeGroupVersion.String(), Kind: "CoderUser"},
		ObjectMeta: coderObjectMeta(t, n.String(t.prefixed), u.ID.String(), u.CreatedAt, labels),
		Spec: aggv1.CoderUserSpec{
			Email:         u.Email,
			Name:          u.Name,
			LoginType:     string(u.LoginType),
			Suspended:     u.Status == codersdk.UserStatusSuspended,
			Roles:         roleNames(u.Roles),
			Organizations: orgs,
		},
		Status: aggv1.CoderUserStatus{
			ID:         u.ID.String(),
			Status:     string(u.Status),
			LoginType:  string(u.LoginType),
			CreatedAt:  timePtr(&u.CreatedAt),
			UpdatedAt:  timePtr(&u.UpdatedAt),
			LastSeenAt: timePtr(&u.LastSeenAt),
		},
	}
	for _, id := range u.OrganizationIDs {
		obj.Status.OrganizationIDs = append(obj.Status.OrganizationIDs, id.String())
	}
	slices.Sort(obj.Status.OrganizationIDs)
	return obj
}

// showPassword shows the Secret key the password was last set from, as
// rec records it; only for a user whose login type takes a password.
func showPassword(obj *aggv1.CoderUser, rec *records.Record) {
	if rec == nil || rec.Spec.Password == nil || obj.Spec.LoginType != string(codersdk.LoginTypePassword) {
		return
	}
	p := rec.Spec.Password
	obj.Spec.PasswordSecretRef = &aggv1.SecretKeySelector{Name: p.SecretName, Key: p.SecretKey}
	obj.Status.PasswordSecretResourceVersion = p.SecretResourceVersion
}

// lookup parses name and finds its backend, acting as the caller.
func (s *UserStorage) lookup(ctx context.Context, name string) (target, userName, error) {
	return lookupName(ctx, &s.genericStore, name, parseUserName)
}

// readCoder reads one user from coderd (as the operator, t's client
// before it acts) with its organizations: Coder's view, without its
// Kubernetes metadata.
func (s *UserStorage) readCoder(ctx context.Context, t target, n userName, name string, rec *records.Record) (*aggv1.CoderUser, error) {
	c := t.operatorClient()
	u, err := c.User(ctx, n.Username)
	if err != nil {
		if coderapi.IsNotFound(err) || coderapi.StatusCode(err) == 400 {
			s.cache.Delete(t.Key(), name)
			return nil, s.notFound(name, fmt.Sprintf("coderd has no user %s", n.Username))
		}
		return nil, s.coderErr(t, err, name)
	}
	if u.Username != n.Username {
		// coderd finds users by name case-insensitively.
		return nil, s.notFound(name, fmt.Sprintf("coderd's user is %s", u.Username))
	}
	orgs, err := c.Organizations(ctx)
	if err != nil {
		return nil, s.coderErr(t, err, name)
	}
	var mine []codersdk.Organization
	for _, o := range orgs {
		if slices.Contains(u.OrganizationIDs, o.ID) {
			mine = append(mine, o)
		}
	}
	ms, err := membersOf(ctx, c, mine, u.ID)
	if err != nil {
		return nil, s.coderErr(t, err, name)
	}
	obj, err := s.convert(ctx, t, &u, ms[u.ID], rec)
	if err != nil {
		return nil, err
	}
	if obj == nil {
		return nil, s.notFound(name, "the user is not served")
	}
	return obj, nil
}

// read fetches one user from coderd, merges its record and records it in
// the cache.
func (s *UserStorage) read(ctx context.Context, t target, n userName, name string) (*aggv1.CoderUser, error) {
	obj, err := s.readCoder(ctx, t, n, name, nil)
	if err != nil {
		return nil, err
	}
	out, err := s.publishRead(ctx, t, obj)
	if err != nil {
		return nil, err
	}
	return out.(*aggv1.CoderUser), nil
}

// Get reads the user from coderd. The name me ([controlPlane.]me, as in
// coderd's /users/me) is the caller's own Coder user.
func (s *UserStorage) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	if n, err := parseUserName(name); err == nil && n.Username == codersdk.Me {
		return s.getMe(ctx, n, name)
	}
	return getObject(ctx, s, name)
}

// getMe reads the Coder user the caller acts as in the coderd n names:
// their mapped user, or in Operator mode coder-k8s's own. A caller who
// maps to no Coder user there gets the 403 that says why (reads of other
// names answer such a caller with a plain 404: here the question is about
// the caller, not about what exists).
func (s *UserStorage) getMe(ctx context.Context, n userName, name string) (runtime.Object, error) {
	t, err := s.resolve(ctx, namespaceOf(ctx), n.ControlPlane, name)
	if err != nil {
		return nil, err
	}
	t, err = s.caller(ctx, t, name)
	var refused *callerRefused
	if errors.As(err, &refused) {
		return nil, refused.StatusError
	}
	if err != nil {
		return nil, err
	}
	var username string
	switch {
	case t.caller != nil:
		username = t.caller.Username
	case t.controller != nil:
		return nil, apierrors.NewForbidden(s.gr, name, &identity.Refused{Reason: fmt.Sprintf("Kubernetes user %q is one of the cluster's controllers (aggregatedAPIServer.identity.clusterControllers), which have no Coder user of their own in %s",
			t.controller.KubernetesUser, t.describe())})
	default:
		// Operator mode: every caller acts as the operator's user.
		u, err := t.operatorClient().User(ctx, codersdk.Me)
		if err != nil {
			return nil, s.coderErr(t, err, name)
		}
		username = u.Username
	}
	return getObject(ctx, s, userName{ControlPlane: n.ControlPlane, Username: username}.String(t.prefixed))
}

// List reads the users of the namespace (or every namespace).
func (s *UserStorage) List(ctx context.Context, opts *metainternalversion.ListOptions) (runtime.Object, error) {
	return listObjects(ctx, s, opts)
}

// userID is the Coder ID of a served user.
func userID(u *aggv1.CoderUser) uuid.UUID {
	id, _ := uuid.Parse(u.Status.ID)
	return id
}
