package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

// The Coder user tools read coderusers through kube-apiserver as the
// caller, like every other tool: the aggregated API shows each caller the
// users coderd lets their Coder user read (members: themselves; auditors,
// template and user admins, owners: everyone), whole, as coderd does.
// whoami reads the coderuser "me" ([controlPlane.]me, coderd's /users/me),
// which the aggregated API answers with the caller's own Coder user.

const usersResource = "coderusers"

// WhoAmIInput says which coderd to ask.
type WhoAmIInput struct {
	Namespace string `json:"namespace,omitempty" jsonschema:"Kubernetes namespace of the control plane; empty means every control plane you may list"`
}

// WhoAmI is who the caller is in Kubernetes and in each coderd.
type WhoAmI struct {
	KubernetesUser string          `json:"kubernetesUser,omitempty" jsonschema:"the Kubernetes user your bearer token authenticates as (empty with mcp.auth none: the tools then act as coder-k8s)"`
	Coder          []CoderIdentity `json:"coder" jsonschema:"your Coder user in each control plane, or why you have none there"`
}

// CoderIdentity is the Coder user a caller acts as in one coderd.
type CoderIdentity struct {
	Namespace     string    `json:"namespace"`
	ControlPlane  string    `json:"controlPlane,omitempty"`
	Object        string    `json:"object,omitempty" jsonschema:"the coderuser object of the user (get it with kubectl get cu)"`
	Username      string    `json:"username,omitempty"`
	Name          string    `json:"name,omitempty"`
	Email         string    `json:"email,omitempty"`
	Status        string    `json:"status,omitempty" jsonschema:"active, dormant or suspended"`
	LoginType     string    `json:"loginType,omitempty"`
	Roles         []string  `json:"roles,omitempty" jsonschema:"site roles (every user is also a member, not listed)"`
	Organizations []OrgRole `json:"organizations,omitempty" jsonschema:"organizations and the organization roles held in each (organization-member not listed)"`
	LastSeen      string    `json:"lastSeen,omitempty"`
	Error         string    `json:"error,omitempty" jsonschema:"why you have no Coder user in this control plane (the other fields are then empty)"`
}

// OrgRole is an organization membership with its roles.
type OrgRole struct {
	Name  string   `json:"name"`
	Roles []string `json:"roles,omitempty"`
}

// UserListInput filters users.
type UserListInput struct {
	Namespace string `json:"namespace,omitempty" jsonschema:"Kubernetes namespace; empty means every namespace"`
	Search    string `json:"search,omitempty" jsonschema:"only users whose username, name or email contains this text (case-insensitive)"`
	Status    string `json:"status,omitempty" jsonschema:"only users with this status: active, dormant or suspended"`
	Role      string `json:"role,omitempty" jsonschema:"only users with this site role (owner, template-admin, user-admin, auditor)"`
	Limit     int    `json:"limit,omitempty" jsonschema:"rows to return (default 20, at most 500)"`
	Continue  string `json:"continue,omitempty" jsonschema:"the continue token of the previous call with the same filters, for the next rows"`
}

// UserRow is one user in a list.
type UserRow struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name" jsonschema:"the coderuser object: the Coder username, prefixed by the control plane when the namespace has several"`
	FullName  string   `json:"fullName,omitempty"`
	Email     string   `json:"email,omitempty" jsonschema:"shown for the users coderd lets you read"`
	Roles     []string `json:"roles,omitempty" jsonschema:"site roles (member not listed)"`
	Status    string   `json:"status" jsonschema:"active, dormant or suspended"`
	LastSeen  string   `json:"lastSeen,omitempty"`
}

// UserList is a page of users.
type UserList struct {
	Items    []UserRow `json:"items"`
	Continue string    `json:"continue,omitempty" jsonschema:"pass to the next call for more rows; empty at the end"`
}

var userStatuses = []string{"active", "dormant", "suspended"}

func (s *Server) userTools() []tool {
	return []tool{
		define(s, "whoami", toolMeta{
			Title:       "Who am I in Coder",
			Description: "Shows the Kubernetes user your token authenticates as and the Coder user it maps to in each control plane (username, name, email, status, site roles, organizations and their roles): who coderd sees when you use the other tools. An error when you map to no Coder user anywhere.",
			ReadOnly:    true, Idempotent: true, OpenWorld: true,
		}, whoami),
		define(s, "list_users", toolMeta{
			Title:       "List Coder users",
			Description: "Lists the Coder users (CoderUser objects) coderd lets your Coder user read (members see only themselves), optionally filtered by text, status or site role, a page at a time: name, email, site roles, status and when last seen.",
			ReadOnly:    true, Idempotent: true, OpenWorld: true,
		}, listUsers),
	}
}

func whoami(ctx context.Context, c *call, in WhoAmIInput) (WhoAmI, error) {
	out := WhoAmI{KubernetesUser: callerName(c.req), Coder: []CoderIdentity{}}
	names, err := meNames(ctx, c, in.Namespace)
	if err != nil {
		return WhoAmI{}, err
	}
	var refusals []string
	for _, n := range names {
		id := CoderIdentity{Namespace: n.namespace, ControlPlane: n.controlPlane}
		var u aggv1.CoderUser
		err := c.kube.Direct.Get(ctx, types.NamespacedName{Namespace: n.namespace, Name: n.name}, &u)
		if err != nil {
			if !apierrors.IsForbidden(err) && !apierrors.IsNotFound(err) && in.Namespace != "" {
				return WhoAmI{}, fmt.Errorf("get coderuser %s/%s: %w", n.namespace, n.name, err)
			}
			id.Error = errMessage(err)
			refusals = append(refusals, fmt.Sprintf("%s: %s", n.where(), id.Error))
		} else {
			fillIdentity(&id, &u)
		}
		out.Coder = append(out.Coder, id)
	}
	if len(refusals) == len(names) {
		who := "you map"
		if out.KubernetesUser != "" {
			who = fmt.Sprintf("Kubernetes user %q maps", out.KubernetesUser)
		}
		if len(names) == 0 {
			return WhoAmI{}, fmt.Errorf("%s to no Coder user: you may list no CoderControlPlane (give the namespace of one)", who)
		}
		return WhoAmI{}, fmt.Errorf("%s to no Coder user: %s", who, strings.Join(refusals, "; "))
	}
	return out, nil
}

// meName is the coderuser that names the caller in one control plane.
type meName struct {
	namespace, controlPlane, name string
}

func (n meName) where() string {
	if n.controlPlane == "" {
		return "namespace " + n.namespace
	}
	return fmt.Sprintf("control plane %s/%s", n.namespace, n.controlPlane)
}

// meNames are the names whoami reads: "me" in a namespace with one
// control plane, "<control plane>.me" for each of several. Without a
// namespace, the control planes the caller may list; with one the caller
// may not list, just "me" there.
func meNames(ctx context.Context, c *call, namespace string) ([]meName, error) {
	var list coderv1alpha1.CoderControlPlaneList
	err := c.kube.Cached.List(ctx, &list, client.InNamespace(namespace))
	if err != nil && namespace != "" && (apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err)) {
		return []meName{{namespace: namespace, name: "me"}}, nil
	}
	if err != nil {
		if apierrors.IsForbidden(err) {
			return nil, fmt.Errorf("list codercontrolplanes (to find your Coder users; give a namespace to ask one control plane): %w", err)
		}
		return nil, fmt.Errorf("list codercontrolplanes: %w", err)
	}
	if len(list.Items) == 0 && namespace != "" {
		if c.namespaceMissing(ctx, namespace) {
			return nil, errNoNamespace(namespace)
		}
		return nil, fmt.Errorf("namespace %q has no CoderControlPlane", namespace)
	}
	perNamespace := map[string]int{}
	for _, cp := range list.Items {
		perNamespace[cp.Namespace]++
	}
	var out []meName
	for _, cp := range list.Items {
		n := meName{namespace: cp.Namespace, name: "me"}
		if perNamespace[cp.Namespace] > 1 {
			n.controlPlane, n.name = cp.Name, cp.Name+".me"
		}
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].namespace+"/"+out[i].name < out[j].namespace+"/"+out[j].name
	})
	return out, nil
}

// errMessage is kube-apiserver's message of err, without the client's
// wrapping.
func errMessage(err error) string {
	var se apierrors.APIStatus
	if errors.As(err, &se) && se.Status().Message != "" {
		return se.Status().Message
	}
	return err.Error()
}

func fillIdentity(id *CoderIdentity, u *aggv1.CoderUser) {
	id.Object, id.Username, id.Name, id.Email = u.Name, username(u.Name), u.Spec.Name, u.Spec.Email
	id.Status, id.LoginType, id.Roles = u.Status.Status, u.Spec.LoginType, u.Spec.Roles
	for _, o := range u.Spec.Organizations {
		id.Organizations = append(id.Organizations, OrgRole(o))
	}
	id.LastSeen = seen(u.Status.LastSeenAt)
}

// username is the Coder username of coderuser name ([controlPlane.]username).
func username(name string) string {
	return name[strings.LastIndexByte(name, '.')+1:]
}

// seen formats a last-seen time; coderd's zero time (never seen) is "".
func seen(t *metav1.Time) string {
	if t == nil || t.IsZero() || t.Year() <= 1 {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

func listUsers(ctx context.Context, c *call, in UserListInput) (UserList, error) {
	if in.Status != "" && !slices.Contains(userStatuses, in.Status) {
		return UserList{}, fmt.Errorf("status must be one of %s, not %q", strings.Join(userStatuses, ", "), in.Status)
	}
	q := listQuery(in.Continue)
	if in.Status != "" {
		q.Set("fieldSelector", fields.OneTermEqualSelector("status.status", in.Status).String())
	}
	var list partialList[userRowSource]
	if err := c.listPartial(ctx, usersResource, in.Namespace, q, &list); err != nil {
		return UserList{}, fmt.Errorf("list coderusers: %w", err)
	}
	items := list.Items[:0]
	search := strings.ToLower(in.Search)
	for _, u := range list.Items {
		if u.matches(search, in.Role) {
			items = append(items, u)
		}
	}
	if err := sortListed(ctx, c, in.Namespace, items, errNoNamespace); err != nil {
		return UserList{}, err
	}
	page, next, err := pageAt(items, in.Limit, in.Continue, list.Metadata.ResourceVersion)
	if err != nil {
		return UserList{}, err
	}
	out := UserList{Items: make([]UserRow, len(page)), Continue: next}
	for i := range page {
		out.Items[i] = page[i].row()
	}
	return out, nil
}

// userRowSource is what a UserRow shows of a CoderUser (same JSON names),
// so listing skips the rest of each object.
type userRowSource struct {
	rowMeta `json:"metadata"`
	Spec    struct {
		Email string   `json:"email"`
		Name  string   `json:"name"`
		Roles []string `json:"roles"`
	} `json:"spec"`
	Status struct {
		Status     string       `json:"status"`
		LastSeenAt *metav1.Time `json:"lastSeenAt"`
	} `json:"status"`
}

// matches says whether u has role (when set) and its username, name or
// email contains search (lower case; when set).
func (u *userRowSource) matches(search, role string) bool {
	if role != "" && !slices.Contains(u.Spec.Roles, role) {
		return false
	}
	if search == "" {
		return true
	}
	for _, v := range []string{username(u.Name), u.Spec.Name, u.Spec.Email} {
		if strings.Contains(strings.ToLower(v), search) {
			return true
		}
	}
	return false
}

func (u *userRowSource) row() UserRow {
	return UserRow{Namespace: u.Namespace, Name: u.Name, FullName: u.Spec.Name, Email: u.Spec.Email,
		Roles: u.Spec.Roles, Status: u.Status.Status, LastSeen: seen(u.Status.LastSeenAt)}
}
