package storage

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/warning"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// Writing a template's settings (template_settings.go has what they are
// and how they read): their values checked as coderd checks them, the
// refusal of licensed changes coderd cannot honour, and the create and
// PATCH requests that carry them.

// checkCreateSettings returns the settings coderd gives a new template, after
// refusing (422) those of tpl that differ from them and need a license
// feature coderd lacks. coderd's features are asked when tpl sets a
// licensed setting, and on a dry run, whose answer shows the defaults.
func (s *TemplateStorage) checkCreateSettings(ctx context.Context, t target, tpl *aggv1.CoderTemplate, dryRun bool) (aggv1.CoderTemplateSpec, error) {
	if !dryRun && !licensedSet(&tpl.Spec) {
		return createDefaults(coderdFeatures{}), nil
	}
	f, err := s.features.get(ctx, t)
	if err != nil {
		return aggv1.CoderTemplateSpec{}, s.coderErr(t, err, tpl.Name)
	}
	defaults := createDefaults(f)
	if errs := unlicensed(&tpl.Spec, &defaults, f); len(errs) > 0 {
		return aggv1.CoderTemplateSpec{}, s.invalid(tpl.Name, errs)
	}
	return defaults, nil
}

// deprecateCreated sets spec.deprecationMessage on the template just
// created (a create request cannot carry it). The template exists and its
// record must still be saved, so a failure is a warning: the object shows
// it not deprecated, and applying again sets it.
func (s *TemplateStorage) deprecateCreated(ctx context.Context, t target, created *codersdk.Template, spec *aggv1.CoderTemplateSpec) {
	if spec.DeprecationMessage == nil || *spec.DeprecationMessage == created.DeprecationMessage {
		return
	}
	req := coderapi.TemplateMeta(created)
	req.DeprecationMessage = spec.DeprecationMessage
	if _, _, err := coderapi.UpdateTemplateMeta(ctx, t.Client, created.ID, req); err != nil {
		s.log.Error(err, "setting the deprecation message of a new template", "template", created.Name)
		warning.AddWarning(ctx, "", fmt.Sprintf("the template was created, but setting spec.deprecationMessage failed (apply it again): %s", coderapi.Message(err)))
	}
}

// createDefaults are the settings coderd v2.30.0 gives a new template
// that sets none (postTemplateByOrganization, and what the database and
// the open-source stores then show), for a coderd with features f:
// without control_shared_ports every template shows public, and only
// with template_rbac is the access list shown.
func createDefaults(f coderdFeatures) aggv1.CoderTemplateSpec {
	level := aggv1.PortShareLevelPublic
	if f.enabled[codersdk.FeatureControlSharedPorts] {
		level = aggv1.PortShareLevelOwner
	}
	var access *aggv1.TemplateAccess
	if f.enabled[codersdk.FeatureTemplateRBAC] {
		access = defaultAccess.DeepCopy()
	}
	return aggv1.CoderTemplateSpec{
		DefaultTTL:                   canonicalDuration(0),
		ActivityBump:                 canonicalDuration(time.Hour.Milliseconds()),
		AllowUserCancelWorkspaceJobs: new(false),
		CORSBehavior:                 aggv1.CORSBehaviorSimple,
		UseClassicParameterFlow:      new(false),
		AutostopRequirement:          &aggv1.AutostopRequirement{Weeks: 1},
		AutostartRequirement:         &aggv1.AutostartRequirement{DaysOfWeek: slices.Clone(codersdk.AllDaysOfWeek)},
		AllowUserAutostart:           new(true),
		AllowUserAutostop:            new(true),
		FailureTTL:                   canonicalDuration(0),
		TimeTilDormant:               canonicalDuration(0),
		TimeTilDormantAutoDelete:     canonicalDuration(0),
		RequireActiveVersion:         new(false),
		DeprecationMessage:           new(""),
		MaxPortShareLevel:            level,
		Access:                       access,
	}
}

// licensedSet reports whether spec sets any setting that needs a
// license feature.
func licensedSet(spec *aggv1.CoderTemplateSpec) bool {
	empty := aggv1.CoderTemplateSpec{}
	for _, s := range templateSettings {
		if s.feature != "" && s.differs(spec, &empty) {
			return true
		}
	}
	return false
}

// licensedChanges are the settings next changes from cur that need a
// license feature.
func licensedChanges(next, cur *aggv1.CoderTemplateSpec) []setting {
	var out []setting
	for _, s := range templateSettings {
		if s.feature != "" && s.differs(next, cur) && (s.free == nil || !s.free(next)) {
			out = append(out, s)
		}
	}
	return out
}

// unlicensed is the refusal of next's changes from cur that coderd, with
// features f, cannot honour.
func unlicensed(next, cur *aggv1.CoderTemplateSpec, f coderdFeatures) field.ErrorList {
	var errs field.ErrorList
	for _, s := range licensedChanges(next, cur) {
		if !f.enabled[s.feature] {
			errs = append(errs, f.refusal(specPath.Child(s.name), s.feature))
		}
	}
	return errs
}

// refuseUnlicensed refuses (422) an update of cur to next that changes a
// licensed setting coderd cannot honour. coderd's features are asked only
// when a licensed setting changes.
func (s *TemplateStorage) refuseUnlicensed(ctx context.Context, t target, name string, next, cur *aggv1.CoderTemplateSpec) error {
	if len(licensedChanges(next, cur)) == 0 {
		return nil
	}
	f, err := s.features.get(ctx, t)
	if err != nil {
		return s.coderErr(t, err, name)
	}
	if errs := unlicensed(next, cur, f); len(errs) > 0 {
		return s.invalid(name, errs)
	}
	return nil
}

// validateSettings checks the settings' values, as coderd would, before
// coderd is asked: of a new template (cur nil) all, of an update those
// that change from cur (a value Coder has is accepted back as it is).
func validateSettings(spec, cur *aggv1.CoderTemplateSpec) field.ErrorList {
	changes := func(name string) bool { return cur == nil || settingNamed[name].differs(spec, cur) }
	var errs field.ErrorList
	for _, d := range durationSettings {
		p := *d.of(spec)
		if p == nil || !changes(d.name) {
			continue
		}
		fp := specPath.Child(d.name)
		ms, err := durationMillis(*p)
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(fp, string(*p), err.Error()))
		case d.atLeastMinute && ms > 0 && ms < time.Minute.Milliseconds():
			errs = append(errs, field.Invalid(fp, string(*p), "must be 0 or at least 1m"))
		}
	}
	if c := spec.CORSBehavior; c != "" && changes("corsBehavior") && c != aggv1.CORSBehaviorSimple && c != aggv1.CORSBehaviorPassthru {
		errs = append(errs, field.NotSupported(specPath.Child("corsBehavior"), c, []aggv1.CORSBehavior{aggv1.CORSBehaviorSimple, aggv1.CORSBehaviorPassthru}))
	}
	levels := []aggv1.PortShareLevel{aggv1.PortShareLevelOwner, aggv1.PortShareLevelAuthenticated, aggv1.PortShareLevelOrganization, aggv1.PortShareLevelPublic}
	if l := spec.MaxPortShareLevel; l != "" && changes("maxPortShareLevel") && !slices.Contains(levels, l) {
		errs = append(errs, field.NotSupported(specPath.Child("maxPortShareLevel"), l, levels))
	}
	if r := spec.AutostopRequirement; r != nil && changes("autostopRequirement") {
		fp := specPath.Child("autostopRequirement")
		errs = append(errs, validateWeekdays(r.DaysOfWeek, fp.Child("daysOfWeek"))...)
		if r.Weeks < 1 || r.Weeks > 16 {
			errs = append(errs, field.Invalid(fp.Child("weeks"), r.Weeks, "must be 1 (every week) to 16"))
		}
	}
	if r := spec.AutostartRequirement; r != nil && changes("autostartRequirement") {
		errs = append(errs, validateWeekdays(r.DaysOfWeek, specPath.Child("autostartRequirement", "daysOfWeek"))...)
	}
	if a := spec.Access; a != nil && changes("access") {
		errs = append(errs, validateAccess(a)...)
	}
	return errs
}

// validateWeekdays checks a list of days: names coderd knows, in week
// order, each once (the order coderd reads them back in).
func validateWeekdays(days []string, fp *field.Path) field.ErrorList {
	var errs field.ErrorList
	last := -1
	for i, d := range days {
		at := slices.Index(codersdk.AllDaysOfWeek, d)
		switch {
		case at < 0:
			errs = append(errs, field.NotSupported(fp.Index(i), d, codersdk.AllDaysOfWeek))
		case at <= last:
			errs = append(errs, field.Invalid(fp.Index(i), d, "list each day once, in week order (monday to sunday), as Coder reads them back"))
		default:
			last = at
		}
	}
	return errs
}

// setMeta sets in req, a PATCH of the template's current settings, the
// settings spec sets.
func setMeta(req *codersdk.UpdateTemplateMeta, spec *aggv1.CoderTemplateSpec) {
	setMillis := func(dst *int64, d *aggv1.Duration) {
		if d != nil {
			*dst, _ = durationMillis(*d) // validated
		}
	}
	setMillis(&req.DefaultTTLMillis, spec.DefaultTTL)
	setMillis(&req.ActivityBumpMillis, spec.ActivityBump)
	setMillis(&req.FailureTTLMillis, spec.FailureTTL)
	setMillis(&req.TimeTilDormantMillis, spec.TimeTilDormant)
	setMillis(&req.TimeTilDormantAutoDeleteMillis, spec.TimeTilDormantAutoDelete)
	setBool := func(dst *bool, v *bool) {
		if v != nil {
			*dst = *v
		}
	}
	setBool(&req.AllowUserCancelWorkspaceJobs, spec.AllowUserCancelWorkspaceJobs)
	setBool(&req.AllowUserAutostart, spec.AllowUserAutostart)
	setBool(&req.AllowUserAutostop, spec.AllowUserAutostop)
	setBool(&req.RequireActiveVersion, spec.RequireActiveVersion)
	if spec.UseClassicParameterFlow != nil {
		req.UseClassicParameterFlow = new(*spec.UseClassicParameterFlow)
	}
	if spec.CORSBehavior != "" {
		req.CORSBehavior = new(codersdk.CORSBehavior(spec.CORSBehavior))
	}
	if r := spec.AutostopRequirement; r != nil {
		req.AutostopRequirement = &codersdk.TemplateAutostopRequirement{DaysOfWeek: nonNil(r.DaysOfWeek), Weeks: r.Weeks}
	}
	if r := spec.AutostartRequirement; r != nil {
		req.AutostartRequirement = &codersdk.TemplateAutostartRequirement{DaysOfWeek: nonNil(r.DaysOfWeek)}
	}
	if spec.DeprecationMessage != nil {
		req.DeprecationMessage = new(*spec.DeprecationMessage)
	}
	if spec.MaxPortShareLevel != "" {
		req.MaxPortShareLevel = new(codersdk.WorkspaceAgentPortShareLevel(spec.MaxPortShareLevel))
	}
}

// nonNil is days as coderd's JSON wants them: a list, never null.
func nonNil(days []string) []string {
	if days == nil {
		return []string{}
	}
	return days
}

// setCreate sets in req, a new template, the settings spec gives other
// values than coderd's defaults def. Those equal to the defaults are left
// out: an open-source coderd refuses (400) any maxPortShareLevel given,
// even the one it shows. The deprecation message, which a create cannot
// carry, is set by a PATCH after it (deprecateAfterCreate).
func setCreate(req *codersdk.CreateTemplateRequest, spec, def *aggv1.CoderTemplateSpec) {
	millis := func(d *aggv1.Duration) *int64 {
		ms, _ := durationMillis(*d) // validated
		return &ms
	}
	differs := func(name string) bool { return settingNamed[name].differs(spec, def) }
	if differs("defaultTTL") {
		req.DefaultTTLMillis = millis(spec.DefaultTTL)
	}
	if differs("activityBump") {
		req.ActivityBumpMillis = millis(spec.ActivityBump)
	}
	if differs("failureTTL") {
		req.FailureTTLMillis = millis(spec.FailureTTL)
	}
	if differs("timeTilDormant") {
		req.TimeTilDormantMillis = millis(spec.TimeTilDormant)
	}
	if differs("timeTilDormantAutoDelete") {
		req.TimeTilDormantAutoDeleteMillis = millis(spec.TimeTilDormantAutoDelete)
	}
	if differs("allowUserCancelWorkspaceJobs") {
		req.AllowUserCancelWorkspaceJobs = spec.AllowUserCancelWorkspaceJobs
	}
	if differs("useClassicParameterFlow") {
		req.UseClassicParameterFlow = spec.UseClassicParameterFlow
	}
	if differs("corsBehavior") {
		req.CORSBehavior = new(codersdk.CORSBehavior(spec.CORSBehavior))
	}
	if differs("autostopRequirement") {
		req.AutostopRequirement = &codersdk.TemplateAutostopRequirement{DaysOfWeek: nonNil(spec.AutostopRequirement.DaysOfWeek), Weeks: spec.AutostopRequirement.Weeks}
	}
	if differs("autostartRequirement") {
		req.AutostartRequirement = &codersdk.TemplateAutostartRequirement{DaysOfWeek: nonNil(spec.AutostartRequirement.DaysOfWeek)}
	}
	if differs("allowUserAutostart") {
		req.AllowUserAutostart = spec.AllowUserAutostart
	}
	if differs("allowUserAutostop") {
		req.AllowUserAutostop = spec.AllowUserAutostop
	}
	if differs("requireActiveVersion") {
		req.RequireActiveVersion = *spec.RequireActiveVersion
	}
	if differs("maxPortShareLevel") {
		req.MaxPortShareLevel = new(codersdk.WorkspaceAgentPortShareLevel(spec.MaxPortShareLevel))
	}
}
