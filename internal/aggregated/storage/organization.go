package storage

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/rest"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/identity"
)

// coderorganizations: the organizations of a coderd, named by their
// Coder name. Reading them is open source (GET /api/v2/organizations and
// /api/v2/organizations/{organization} are in coderd/coderd.go); creating
// (POST /api/v2/organizations), changing (PATCH) and deleting one are
// Enterprise routes behind multiple_organizations
// (enterprise/coderd/coderd.go). The open-source router has their paths
// for GET only and answers the other methods 405 with no body; an
// Enterprise build without the feature answers 403 "Multiple
// Organizations is a Premium feature". Such writes are refused with the
// 422 of the licensed template settings before coderd is asked. Reads
// are the operator's, shown to a mapped caller as coderd shows
// organizations: to their members (and owners).

// OrganizationStorage serves coderorganizations.
type OrganizationStorage struct {
	genericStore
	// coderd deletes an organization at once.
	deletedAtOnce[*aggv1.CoderOrganization]
	features featureCache
}

// NewOrganizations returns the coderorganizations storage. Run must run
// for watches to see changes.
func NewOrganizations(o Options) (*OrganizationStorage, error) {
	s := &OrganizationStorage{
		genericStore: genericStore{
			gr:       aggv1.Resource("coderorganizations"),
			kind:     "CoderOrganization",
			backends: o.Backends,
			ident:    o.Identity,
			access:   organizationAccess,
			log:      o.Log.WithName("coderorganizations"),
			fields: map[string]string{
				"name":         "metadata.name",
				"display_name": "spec.displayName",
				"description":  "spec.description",
				"icon":         "spec.icon",
			},
		},
		features: newFeatureCache(),
	}
	if err := startCache(&s.genericStore, o, s.listOrganizations, aggv1.OrganizationFields); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *OrganizationStorage) New() runtime.Object     { return &aggv1.CoderOrganization{} }
func (s *OrganizationStorage) NewList() runtime.Object { return &aggv1.CoderOrganizationList{} }
func (s *OrganizationStorage) GetSingularName() string { return "coderorganization" }
func (s *OrganizationStorage) ShortNames() []string    { return []string{"corg"} }

var organizationAccess = access{
	checks: func(o watchcache.Object) (objectChecks, bool) {
		org, err := uuid.Parse(o.(*aggv1.CoderOrganization).Status.ID)
		if err != nil {
			return objectChecks{}, false
		}
		// coderd's organization object is in itself
		// (database.Organization.RBACObject): its members read it.
		read := identity.Check{Resource: codersdk.ResourceOrganization, Action: codersdk.ActionRead, OrganizationID: org}
		update := read
		update.Action = codersdk.ActionUpdate
		return objectChecks{read: read, update: update}, true
	},
	redact: func(o watchcache.Object) watchcache.Object { return o },
}

const organizationsFeature = codersdk.FeatureMultipleOrganizations

// listOrganizations reads every organization of one coderd and each
// one's members count (one request per organization).
func (s *OrganizationStorage) listOrganizations(ctx context.Context, t target) ([]watchcache.Object, error) {
	started := time.Now()
	orgs, err := t.Client.Organizations(ctx)
	if err != nil {
		return nil, fmt.Errorf("list organizations: %w", err)
	}
	counts := make([]int, len(orgs))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(coderapi.MaxParallel)
	for i := range orgs {
		g.Go(func() error {
			var err error
			counts[i], err = membersCount(gctx, t, orgs[i].ID)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	out := make([]watchcache.Object, 0, len(orgs))
	for i := range orgs {
		if obj := toOrganization(t, &orgs[i], counts[i]); obj != nil {
			out = append(out, obj)
		}
	}
	if err := s.mergeListed(ctx, t, out, started, true, nil); err != nil {
		return nil, err
	}
	return out, nil
}

// membersCount is how many members organization id has: coderd's
// paginated members list (GET
// /api/v2/organizations/{organization}/paginated-members, open source)
// counts them, without system users, as its UI shows.
func membersCount(ctx context.Context, t target, id uuid.UUID) (int, error) {
	res, err := t.Client.Request(ctx, http.MethodGet, fmt.Sprintf("/api/v2/organizations/%s/paginated-members?limit=1", id), nil)
	if err != nil {
		return 0, fmt.Errorf("count members of organization %s: %w", id, err)
	}
	defer func() { _ = res.Body.Close() }()
	if res.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("count members of organization %s: %w", id, codersdk.ReadBodyAsError(res))
	}
	var page codersdk.PaginatedMembersResponse
	if err := json.NewDecoder(res.Body).Decode(&page); err != nil {
		return 0, fmt.Errorf("count members of organization %s: %w", id, err)
	}
	return page.Count, nil
}

// toOrganization is the Kubernetes view of org; nil for one whose name
// cannot be an object name.
func toOrganization(t target, org *codersdk.Organization, members int) *aggv1.CoderOrganization {
	n := orgObjectName{ControlPlane: t.ControlPlane, Org: org.Name}
	if _, err := parseOrgName(n.String(false)); err != nil {
		return nil
	}
	return &aggv1.CoderOrganization{
		TypeMeta:   metav1.TypeMeta{APIVersion: aggv1.SchemeGroupVersion.String(), Kind: "CoderOrganization"},
		ObjectMeta: coderObjectMeta(t, n.String(t.prefixed), org.ID.String(), org.CreatedAt, objectLabels(t, org.Name, nil)),
		Spec: aggv1.CoderOrganizationSpec{
			DisplayName: new(org.DisplayName),
			Description: new(org.Description),
			Icon:        new(org.Icon),
		},
		Status: aggv1.CoderOrganizationStatus{
			ID:           org.ID.String(),
			Default:      org.IsDefault,
			MembersCount: int32(members),
		},
	}
}

func (s *OrganizationStorage) lookup(ctx context.Context, name string) (target, orgObjectName, error) {
	return lookupName(ctx, &s.genericStore, name, parseOrgName)
}

// readCoder reads one organization from coderd: Coder's view, without
// its Kubernetes metadata.
func (s *OrganizationStorage) readCoder(ctx context.Context, t target, n orgObjectName, name string) (*aggv1.CoderOrganization, error) {
	org, err := t.Client.OrganizationByName(ctx, n.Org)
	if err != nil {
		if coderapi.IsNotFound(err) {
			s.cache.Delete(t.Key(), name)
			return nil, s.notFound(name, fmt.Sprintf("coderd has no organization %s", n.Org))
		}
		return nil, s.coderErr(t, err, name)
	}
	count, err := membersCount(ctx, t, org.ID)
	if err != nil {
		return nil, s.coderErr(t, err, name)
	}
	obj := toOrganization(t, &org, count)
	if obj == nil {
		return nil, s.notFound(name, "the organization is not served")
	}
	return obj, nil
}

func (s *OrganizationStorage) read(ctx context.Context, t target, n orgObjectName, name string) (*aggv1.CoderOrganization, error) {
	obj, err := s.readCoder(ctx, t, n, name)
	if err != nil {
		return nil, err
	}
	out, err := s.publishRead(ctx, t, obj)
	if err != nil {
		return nil, err
	}
	return out.(*aggv1.CoderOrganization), nil
}

// Get reads the organization from coderd.
func (s *OrganizationStorage) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	return getObject(ctx, s, name)
}

// List reads the organizations of the namespace (or every namespace).
func (s *OrganizationStorage) List(ctx context.Context, opts *metainternalversion.ListOptions) (runtime.Object, error) {
	return listObjects(ctx, s, opts)
}

// Writes, as the caller; each first refused (422) on a coderd without
// multiple_organizations.

func (s *OrganizationStorage) validateCreate(o *aggv1.CoderOrganization) (orgObjectName, field.ErrorList) {
	if o.Name == "" && o.GenerateName != "" {
		return orgObjectName{}, field.ErrorList{field.Forbidden(field.NewPath("metadata", "generateName"), "names map to Coder objects; give metadata.name")}
	}
	n, err := parseOrgName(o.Name)
	if err != nil {
		return n, field.ErrorList{field.Invalid(namePath, o.Name, err.Error())}
	}
	if n.Org == "new" || n.Org == "create" {
		return n, field.ErrorList{field.Invalid(namePath, o.Name, fmt.Sprintf("%q is a name Coder reserves", n.Org))}
	}
	return n, nil
}

func (s *OrganizationStorage) createdView(o *aggv1.CoderOrganization, t target, n orgObjectName) *aggv1.CoderOrganization {
	dry := o.DeepCopy()
	dry.Namespace = t.Namespace
	dry.Labels = objectLabels(t, n.Org, nil)
	dry.CreationTimestamp = metav1.Now()
	dry.Status = aggv1.CoderOrganizationStatus{}
	// coderd's defaults: the display name is the name.
	if dry.Spec.DisplayName == nil || *dry.Spec.DisplayName == "" {
		dry.Spec.DisplayName = new(n.Org)
	}
	if dry.Spec.Description == nil {
		dry.Spec.Description = new("")
	}
	if dry.Spec.Icon == nil {
		dry.Spec.Icon = new("")
	}
	return dry
}

func (s *OrganizationStorage) planCreate(ctx context.Context, t target, n orgObjectName, o, dry *aggv1.CoderOrganization, dryRun bool) (createCall, error) {
	if err := s.requireFeature(ctx, &s.features, t, organizationsFeature, o.Name, namePath); err != nil {
		return nil, err
	}
	switch _, err := t.Client.OrganizationByName(ctx, n.Org); {
	case err == nil:
		return nil, apierrors.NewAlreadyExists(s.gr, o.Name)
	case !coderapi.IsNotFound(err):
		return nil, s.coderErr(t, err, o.Name)
	}
	if dryRun {
		return nil, s.mayCreate(ctx, t, identity.Check{Resource: codersdk.ResourceOrganization, Action: codersdk.ActionCreate}, o.Name)
	}
	return func(ctx context.Context) (object, func(*records.Record), error) {
		req := codersdk.CreateOrganizationRequest{Name: n.Org}
		if o.Spec.DisplayName != nil {
			req.DisplayName = *o.Spec.DisplayName
		}
		if o.Spec.Description != nil {
			req.Description = *o.Spec.Description
		}
		if o.Spec.Icon != nil {
			req.Icon = *o.Spec.Icon
		}
		created, err := t.Client.CreateOrganization(ctx, req)
		if err != nil {
			if e := s.unlicensedErr(t, err, organizationsFeature, o.Name, namePath); e != nil {
				return nil, nil, e
			}
			return nil, nil, s.createErr(t, err, o.Name)
		}
		// coderd makes its creator the first member.
		count, err := membersCount(ctx, t, created.ID)
		if err != nil {
			count = 1
		}
		return toOrganization(t, &created, count), nil, nil
	}, nil
}

// Create makes the organization in Coder.
func (s *OrganizationStorage) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, opts *metav1.CreateOptions) (runtime.Object, error) {
	return createObject(ctx, s, obj, createValidation, opts)
}

// Update changes the organization's display name, description and icon
// (its name is the object's name, which Kubernetes never changes).
func (s *OrganizationStorage) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc, updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, opts *metav1.UpdateOptions) (runtime.Object, bool, error) {
	return updateObject(ctx, s, name, objInfo, createValidation, updateValidation, forceAllowCreate, opts)
}

func (s *OrganizationStorage) validateUpdate(next, cur *aggv1.CoderOrganization, name string) field.ErrorList {
	return validateSameObject("organization", name, next.Name, "", "")
}

// organizationChange is the PATCH an update of cur to next needs.
func organizationChange(cur, next *aggv1.CoderOrganizationSpec) (codersdk.UpdateOrganizationRequest, bool) {
	var req codersdk.UpdateOrganizationRequest
	changed := false
	differs := func(n, c *string) bool { return n != nil && (c == nil || *n != *c) }
	if differs(next.DisplayName, cur.DisplayName) {
		req.DisplayName, changed = *next.DisplayName, true
	}
	if differs(next.Description, cur.Description) {
		req.Description, changed = new(*next.Description), true
	}
	if differs(next.Icon, cur.Icon) {
		req.Icon, changed = new(*next.Icon), true
	}
	return req, changed
}

func (s *OrganizationStorage) planUpdate(n orgObjectName, name string, cur, next *aggv1.CoderOrganization) specUpdate {
	req, changed := organizationChange(&cur.Spec, &next.Spec)
	u := specUpdate{changed: changed}
	if changed && req.DisplayName == "" && next.Spec.DisplayName != nil {
		// coderd's PATCH omits an empty display name: it cannot clear it.
		u.invalid = field.ErrorList{field.Invalid(specPath.Child("displayName"), "", "Coder keeps a display name; give one")}
	}
	u.check = func(ctx context.Context, w *write) (bool, error) {
		if !changed {
			return false, nil
		}
		return false, s.requireFeature(ctx, &s.features, w.t, organizationsFeature, name, specPath)
	}
	u.apply = func(ctx context.Context, w *write) (object, func(*records.Record), error) {
		if _, err := w.t.Client.UpdateOrganization(ctx, cur.Status.ID, req); err != nil {
			if e := s.unlicensedErr(w.t, err, organizationsFeature, name, specPath); e != nil {
				return nil, nil, e
			}
			return nil, nil, s.coderErr(w.t, err, name)
		}
		out, err := s.readCoder(ctx, w.t, n, name)
		return out, nil, err
	}
	return u
}

func (s *OrganizationStorage) releaseDelete(ctx context.Context, w *write, _ orgObjectName, name string, cur, next *aggv1.CoderOrganization, dryRun bool) (runtime.Object, error) {
	if err := s.requireFeature(ctx, &s.features, w.t, organizationsFeature, name, namePath); err != nil {
		return nil, err
	}
	return releaseAtOnce(ctx, w, cur, next, dryRun, func(ctx context.Context) error { return s.deleteOrganization(ctx, w.t, cur, name) })
}

// Delete deletes the organization in Coder (coderd refuses the default
// organization and one that still has templates, workspaces, groups or
// members other than its last admin: its 400 with Coder's message).
func (s *OrganizationStorage) Delete(ctx context.Context, name string, deleteValidation rest.ValidateObjectFunc, opts *metav1.DeleteOptions) (runtime.Object, bool, error) {
	validate := func(ctx context.Context, obj runtime.Object) error {
		if o := obj.(*aggv1.CoderOrganization); o.Status.Default {
			return apierrors.NewConflict(s.gr, name, fmt.Errorf("coderd does not delete its default organization"))
		}
		if deleteValidation != nil {
			return deleteValidation(ctx, obj)
		}
		return nil
	}
	return deleteObject(ctx, s, name, validate, opts)
}

func (s *OrganizationStorage) deleteInCoder(ctx context.Context, w *write, _ orgObjectName, name string, cur *aggv1.CoderOrganization) (runtime.Object, bool, error) {
	if err := s.requireFeature(ctx, &s.features, w.t, organizationsFeature, name, namePath); err != nil {
		return nil, false, err
	}
	return deleteAtOnce(ctx, w, cur, func(ctx context.Context) error { return s.deleteOrganization(ctx, w.t, cur, name) })
}

func (s *OrganizationStorage) deleteOrganization(ctx context.Context, t target, cur *aggv1.CoderOrganization, name string) error {
	err := t.Client.DeleteOrganization(ctx, cur.Status.ID)
	switch {
	case err == nil:
	case coderapi.IsFeatureUnavailable(err):
		return s.unlicensedErr(t, err, organizationsFeature, name, namePath)
	case coderapi.IsNotFound(err):
	default:
		return s.coderErr(t, err, name)
	}
	s.cache.Delete(t.Key(), name)
	return nil
}
