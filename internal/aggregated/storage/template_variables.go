package storage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/templatesource"
)

// A template's Terraform variables. spec.variables lists values; what it
// lists is what the version spec.files builds gets, and every other
// variable the files declare gets its default. coderd would otherwise
// give a version the active version's value of every variable its request
// leaves out (includeLastVariableValues), so each version is created with
// every declared variable named, which needs the declarations (read from
// the files, templatesource.Variables): Coder's API redacts a sensitive
// variable's default.
//
// A value may come from a Secret of the object's namespace. coder-k8s
// reads it with its own access only for a caller whom kube-apiserver
// allows to get that Secret (a SubjectAccessReview for the request's
// user), sends it to coderd in the version's request and keeps nothing
// of it but the Secret's name, key and resourceVersion (in the record,
// and shown in status.variables). A Secret changed since then is read
// again by the next write of the template by a caller who may read it.

// The SubjectAccessReviews are created with the system:auth-delegator
// binding every aggregated API server has (delegated authorization).
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get

var variablesPath = specPath.Child("variables")

// validateVariables checks spec.variables' shape: names given once, each
// with a value or a Secret key.
func validateVariables(vars []aggv1.TemplateVariable) field.ErrorList {
	var errs field.ErrorList
	seen := map[string]bool{}
	for i, v := range vars {
		p := variablesPath.Index(i)
		switch {
		case v.Name == "":
			errs = append(errs, field.Required(p.Child("name"), "the Terraform variable's name"))
			continue
		case seen[v.Name]:
			errs = append(errs, field.Duplicate(p.Child("name"), v.Name))
		}
		seen[v.Name] = true
		if v.ValueFrom == nil {
			continue
		}
		if v.Value != "" {
			errs = append(errs, field.Forbidden(p.Child("valueFrom"), "give value or valueFrom, not both"))
		}
		ref := v.ValueFrom.SecretKeyRef
		if ref == nil {
			errs = append(errs, field.Required(p.Child("valueFrom", "secretKeyRef"), "the Secret key the value is read from"))
			continue
		}
		if ref.Name == "" {
			errs = append(errs, field.Required(p.Child("valueFrom", "secretKeyRef", "name"), "the Secret's name"))
		}
		if ref.Key == "" {
			errs = append(errs, field.Required(p.Child("valueFrom", "secretKeyRef", "key"), "the key of the Secret's data"))
		}
	}
	return errs
}

// sameVariables reports whether a and b list the same values, in any
// order.
func sameVariables(a, b []aggv1.TemplateVariable) bool {
	if len(a) != len(b) {
		return false
	}
	sa, sb := sortedVariables(a), sortedVariables(b)
	for i := range sa {
		if sa[i].Name != sb[i].Name || sa[i].Value != sb[i].Value || secretRefOf(sa[i]) != secretRefOf(sb[i]) {
			return false
		}
	}
	return true
}

func sortedVariables(vars []aggv1.TemplateVariable) []aggv1.TemplateVariable {
	out := slices.Clone(vars)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// secretRefOf is the Secret key v reads, zero for a literal value.
func secretRefOf(v aggv1.TemplateVariable) aggv1.SecretKeySelector {
	if v.ValueFrom == nil || v.ValueFrom.SecretKeyRef == nil {
		return aggv1.SecretKeySelector{}
	}
	return *v.ValueFrom.SecretKeyRef
}

// appliedVariables are a version's variables as a write gives them to
// coderd (values, Secrets' included) and records them (no Secret value).
type appliedVariables struct {
	values []codersdk.VariableValue
	record []coderv1alpha1.TemplateVariableRecord
}

// hash identifies the applied variables without their Secrets' values
// (the Secrets' revisions stand for them), so that a build of the same
// files and variables is recognised.
func (a appliedVariables) hash() string {
	return variablesHash(a.record)
}

func variablesHash(rec []coderv1alpha1.TemplateVariableRecord) string {
	if len(rec) == 0 {
		return ""
	}
	// In any order: the same variables listed otherwise are the same.
	sorted := slices.Clone(rec)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	raw, _ := json.Marshal(sorted) // plain strings: cannot fail
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

// SecretReader is what the variables need of Kubernetes: the Secrets they
// read and the SubjectAccessReviews that say whether the caller may.
type SecretReader interface {
	client.Reader
	Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error
}

// resolveVariables gives every variable that files declare its value for
// a new version of the template named name in t's namespace: spec's
// value (read from its Secret, as the request's caller may), or the
// declaration's default ("" for a required variable, which coderd then
// reports missing). A variable spec lists that the files do not declare,
// or a literal value of a sensitive one, is refused. When the files do
// not parse, spec's values are given as they are and coderd's import
// reports the error.
func (s *TemplateStorage) resolveVariables(ctx context.Context, t target, spec *aggv1.CoderTemplateSpec, name string) (appliedVariables, error) {
	return s.resolveVariablesOf(ctx, &s.genericStore, t, spec.Files, spec.Variables, name)
}

// resolveVariablesOf is resolveVariables for files and vars of any kind's
// object (a template or a template version), whose store r names it in
// the errors.
func (s *TemplateStorage) resolveVariablesOf(ctx context.Context, r *genericStore, t target, files map[string]string, vars []aggv1.TemplateVariable, name string) (appliedVariables, error) {
	declared, parseErr := templatesource.Variables(files)
	byName := map[string]templatesource.Variable{}
	for _, d := range declared {
		byName[d.Name] = d
	}
	var out appliedVariables
	var errs field.ErrorList
	listed := map[string]bool{}
	for i, v := range vars {
		p := variablesPath.Index(i)
		listed[v.Name] = true
		d, ok := byName[v.Name]
		if parseErr == nil && !ok {
			errs = append(errs, field.NotFound(p.Child("name"), v.Name+" (the template's files declare no such variable)"))
			continue
		}
		rec := coderv1alpha1.TemplateVariableRecord{Name: v.Name}
		value := v.Value
		if ref := secretRefOf(v); ref.Name != "" {
			val, rv, err := s.readSecretKey(ctx, r, t.Namespace, ref, p.Child("valueFrom", "secretKeyRef"), name)
			if err != nil {
				return appliedVariables{}, err
			}
			value, rec.SecretName, rec.SecretKey, rec.SecretResourceVersion = val, ref.Name, ref.Key, rv
		} else {
			if d.Sensitive {
				errs = append(errs, field.Forbidden(p.Child("value"), fmt.Sprintf("variable %s is sensitive: give it with valueFrom.secretKeyRef, so that its value is kept in a Secret, not in the object", v.Name)))
				continue
			}
			rec.Value = v.Value
		}
		out.values = append(out.values, codersdk.VariableValue{Name: v.Name, Value: value})
		out.record = append(out.record, rec)
	}
	if len(errs) > 0 {
		return appliedVariables{}, r.invalid(name, errs)
	}
	for _, d := range declared {
		if !listed[d.Name] {
			out.values = append(out.values, codersdk.VariableValue{Name: d.Name, Value: d.Default})
		}
	}
	// The record keeps the spec's order, which reads show: GitOps tools
	// that compare lists in order see no drift.
	return out, nil
}

// readSecretKey reads key ref of a Secret in namespace for the request's
// caller: only when kube-apiserver says they may get that Secret, so that
// a CoderTemplate never reveals to Coder a Secret its writer could not
// read. It returns the value and the Secret's resourceVersion.
func (s *TemplateStorage) readSecretKey(ctx context.Context, r *genericStore, namespace string, ref aggv1.SecretKeySelector, p *field.Path, name string) (string, string, error) {
	if s.opts.Kube == nil {
		return "", "", apierrors.NewInternalError(fmt.Errorf("%s: this server reads no Secrets (no Kubernetes client)", p))
	}
	if err := s.mayGetSecret(ctx, r, namespace, ref.Name, p, name); err != nil {
		return "", "", err
	}
	var sec corev1.Secret
	if err := s.opts.Kube.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ref.Name}, &sec); err != nil {
		if apierrors.IsNotFound(err) {
			return "", "", r.invalid(name, field.ErrorList{field.NotFound(p.Child("name"), ref.Name+" (no such Secret in namespace "+namespace+")")})
		}
		return "", "", apierrors.NewInternalError(fmt.Errorf("read Secret %s/%s for %s: %w", namespace, ref.Name, p, err))
	}
	val, ok := sec.Data[ref.Key]
	if !ok {
		return "", "", r.invalid(name, field.ErrorList{field.NotFound(p.Child("key"), ref.Key+" (Secret "+ref.Name+" has no such key)")})
	}
	s.secretRevs.forget(namespace, ref.Name)
	return string(val), sec.ResourceVersion, nil
}

// mayGetSecret asks kube-apiserver whether the request's user may get
// Secret secret of namespace, and refuses (403) when they may not.
func (s *TemplateStorage) mayGetSecret(ctx context.Context, r *genericStore, namespace, secret string, p *field.Path, name string) error {
	allowed, err := callerMay(ctx, s.opts.Kube, namespace, "secrets", "get", secret)
	if err != nil {
		return apierrors.NewInternalError(fmt.Errorf("%s: %w", p, err))
	}
	if !allowed {
		return apierrors.NewForbidden(r.gr, name, fmt.Errorf("%s: coder-k8s would read Secret %q for you, and you may not get it in namespace %s", p, secret, namespace))
	}
	return nil
}

// secretsMoved reports whether a Secret that the version shown as cur
// took a value from has changed since (a new resourceVersion, or gone),
// as coder-k8s itself sees it.
func (s *TemplateStorage) secretsMoved(ctx context.Context, t target, cur *aggv1.CoderTemplate) (bool, error) {
	if s.opts.Kube == nil {
		return false, nil
	}
	for _, v := range cur.Status.Variables {
		if v.SecretKeyRef == nil {
			continue
		}
		var meta corev1.Secret
		err := s.opts.Kube.Get(ctx, client.ObjectKey{Namespace: t.Namespace, Name: v.SecretKeyRef.Name}, &meta)
		switch {
		case apierrors.IsNotFound(err):
			return true, nil
		case err != nil:
			return false, apierrors.NewInternalError(fmt.Errorf("read Secret %s/%s: %w", t.Namespace, v.SecretKeyRef.Name, err))
		case meta.ResourceVersion != v.SecretResourceVersion:
			return true, nil
		}
	}
	return false, nil
}

// versionVariables remembers each ended version's variables as coderd
// reports them (they never change once its import ended).
type versionVariables struct {
	coderdFacts[uuid.UUID, []codersdk.TemplateVersionVariable]
}

func newVersionVariables() versionVariables {
	return versionVariables{coderdFacts[uuid.UUID, []codersdk.TemplateVersionVariable]{max: 10000}}
}

func (c *versionVariables) get(ctx context.Context, t target, v *codersdk.TemplateVersion) ([]codersdk.TemplateVersionVariable, error) {
	if v.Job.CompletedAt == nil && buildInProgress(v.Job.Status) {
		// coderd has none to show before the import ends (403 "Template
		// version job has not finished").
		return nil, nil
	}
	return c.coderdFacts.get(ctx, t, v.ID, func(ctx context.Context) ([]codersdk.TemplateVersionVariable, bool, error) {
		vars, err := t.Client.TemplateVersionVariables(ctx, v.ID)
		return vars, err == nil && !buildInProgress(v.Job.Status), err
	})
}

// showVariables shows on obj the variables of v, the version its
// spec.files shows: spec.variables as they were applied to v through
// Kubernetes (rec's), or, for a version made in Coder, the values that
// differ from their defaults (a sensitive one's value is not known);
// status.variables as coderd reports them, with the Secret each value
// came from.
func (s *TemplateStorage) showVariables(ctx context.Context, t target, obj *aggv1.CoderTemplate, v *codersdk.TemplateVersion, rec *records.Record) error {
	vars, err := s.vars.get(ctx, t, v)
	if err != nil {
		return fmt.Errorf("variables of template version %s: %w", v.ID, err)
	}
	applied := appliedTo(rec, v.ID)
	bySecret := map[string]coderv1alpha1.TemplateVariableRecord{}
	obj.Spec.Variables = nil
	if applied != nil {
		for _, a := range applied.Variables {
			sv := aggv1.TemplateVariable{Name: a.Name, Value: a.Value}
			if a.SecretName != "" {
				sv.Value = ""
				sv.ValueFrom = &aggv1.TemplateVariableSource{SecretKeyRef: &aggv1.SecretKeySelector{Name: a.SecretName, Key: a.SecretKey}}
				bySecret[a.Name] = a
			}
			obj.Spec.Variables = append(obj.Spec.Variables, sv)
		}
	} else {
		for _, cv := range vars {
			if !cv.Sensitive && cv.Value != cv.DefaultValue {
				obj.Spec.Variables = append(obj.Spec.Variables, aggv1.TemplateVariable{Name: cv.Name, Value: cv.Value})
			}
		}
	}
	obj.Status.Variables = nil
	for _, cv := range vars {
		st := aggv1.TemplateVariableStatus{Name: cv.Name, Type: cv.Type, Required: cv.Required, Sensitive: cv.Sensitive}
		if a, ok := bySecret[cv.Name]; ok {
			st.SecretKeyRef = &aggv1.SecretKeySelector{Name: a.SecretName, Key: a.SecretKey}
			st.SecretResourceVersion = a.SecretResourceVersion
		}
		obj.Status.Variables = append(obj.Status.Variables, st)
	}
	sort.Slice(obj.Status.Variables, func(i, j int) bool { return obj.Status.Variables[i].Name < obj.Status.Variables[j].Name })
	if c, ok := s.secretsCondition(ctx, t, obj, v.CreatedAt); ok {
		obj.Status.Conditions = append(obj.Status.Conditions, c)
	}
	return nil
}

// secretsCondition is obj's SecretsCurrent condition: whether each Secret
// its status.variables name still has the revision the value was read
// at. false when no value came from a Secret. The revisions are read
// through secretRevisions, so that a poll of many templates costs at most
// one read of each Secret per secretRevisionTTL. The condition is dated
// by the version's creation (at), when its values were read: when a
// Secret changed is not known, and a served object must not change
// unless what it shows does.
func (s *TemplateStorage) secretsCondition(ctx context.Context, t target, obj *aggv1.CoderTemplate, at time.Time) (metav1.Condition, bool) {
	c := metav1.Condition{Type: aggv1.ConditionSecretsCurrent, Status: metav1.ConditionTrue, Reason: aggv1.ReasonSecretsUnchanged,
		Message: "the Secrets the variables were read from are unchanged", LastTransitionTime: metav1.NewTime(at.Truncate(time.Second))}
	read := false
	for _, v := range obj.Status.Variables {
		if v.SecretKeyRef == nil {
			continue
		}
		read = true
		rv, err := s.secretRevs.get(ctx, s.opts.Kube, t.Namespace, v.SecretKeyRef.Name)
		switch {
		case err != nil:
			c.Status, c.Reason = metav1.ConditionUnknown, aggv1.ReasonSecretUnknown
			c.Message = fmt.Sprintf("Secret %s, which variable %s was read from, could not be read: %v", v.SecretKeyRef.Name, v.Name, err)
			return c, true
		case rv != v.SecretResourceVersion:
			c.Status, c.Reason = metav1.ConditionFalse, aggv1.ReasonSecretChanged
			now := rv
			if now == "" {
				now = "deleted"
			}
			c.Message = fmt.Sprintf("Secret %s changed (resourceVersion %s, now %s) since variable %s was read from it; the next apply by a caller who may read it builds a version with its current value",
				v.SecretKeyRef.Name, v.SecretResourceVersion, now, v.Name)
			return c, true
		}
	}
	return c, read
}

// secretRevisionTTL is how long a Secret's resourceVersion read for the
// SecretsCurrent condition is used.
const secretRevisionTTL = 30 * time.Second

// secretRevisions remembers Secrets' resourceVersions ("" for a Secret
// that does not exist) for secretRevisionTTL. Secrets are never cached
// by the operator's informers (package kubecache), so they are read one
// by one, and only those that variables name.
type secretRevisions struct {
	mu   sync.Mutex
	revs map[string]secretRevision
}

type secretRevision struct {
	rv   string
	read time.Time
}

func (c *secretRevisions) get(ctx context.Context, kube SecretReader, namespace, name string) (string, error) {
	if kube == nil {
		return "", fmt.Errorf("this server reads no Secrets")
	}
	key := namespace + "/" + name
	c.mu.Lock()
	r, ok := c.revs[key]
	c.mu.Unlock()
	if ok && time.Since(r.read) < secretRevisionTTL {
		return r.rv, nil
	}
	var sec corev1.Secret
	err := kube.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &sec)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return "", err
	default:
		r.rv = sec.ResourceVersion
	}
	r.read = time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.revs == nil {
		c.revs = map[string]secretRevision{}
	}
	// Forget what is old, so that Secrets no longer named do not pile up.
	for k, old := range c.revs {
		if time.Since(old.read) >= secretRevisionTTL {
			delete(c.revs, k)
		}
	}
	c.revs[key] = r
	return r.rv, nil
}

// forget forgets namespace/name's revision, which a write just read.
func (c *secretRevisions) forget(namespace, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.revs, namespace+"/"+name)
}

// appliedTo is rec's entry of the variables applied to version id, nil
// when there is none.
func appliedTo(rec *records.Record, id uuid.UUID) *coderv1alpha1.TemplateVersionVariables {
	if rec == nil {
		return nil
	}
	for i := range rec.Spec.Variables {
		if rec.Spec.Variables[i].VersionID == id.String() {
			return &rec.Spec.Variables[i]
		}
	}
	return nil
}

// withApplied records vars as applied to version id in rec, keeping only
// the entry of keep (the active version) besides.
func withApplied(rec *records.Record, id string, vars []coderv1alpha1.TemplateVariableRecord, keep uuid.UUID) {
	out := []coderv1alpha1.TemplateVersionVariables{{VersionID: id, Variables: vars}}
	for _, e := range rec.Spec.Variables {
		if e.VersionID == keep.String() && e.VersionID != id {
			out = append(out, e)
		}
	}
	rec.Spec.Variables = out
}

// mayReadSecretsOf reports whether the request's caller may get every
// Secret obj's variables read.
func (s *TemplateStorage) mayReadSecretsOf(ctx context.Context, t target, obj *aggv1.CoderTemplate) bool {
	for i, v := range obj.Spec.Variables {
		if ref := secretRefOf(v); ref.Name != "" {
			if err := s.mayGetSecret(ctx, &s.genericStore, t.Namespace, ref.Name, variablesPath.Index(i), obj.Name); err != nil {
				s.log.V(1).Info("a Secret of the template's variables changed; this caller may not read it, so the write builds no new version",
					"template", obj.Name, "secret", ref.Name, "reason", err.Error())
				return false
			}
		}
	}
	return true
}
