package storage

import (
	"reflect"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/coderapi"
)

func fxDuration(s string) *aggv1.Duration { return fxPtr(aggv1.Duration(s)) }

// fxSettingsSpec is fxTemplate's settings as a read shows them.
func fxSettingsSpec() aggv1.CoderTemplateSpec {
	var spec aggv1.CoderTemplateSpec
	showSettings(&spec, fxTemplate())
	return spec
}

func TestValidateSettings(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*aggv1.CoderTemplateSpec)
		want []string
	}{
		{"nothing set", func(*aggv1.CoderTemplateSpec) {}, nil},
		{"every setting valid", func(s *aggv1.CoderTemplateSpec) {
			*s = createDefaults(coderdFeatures{enabled: map[codersdk.FeatureName]bool{codersdk.FeatureControlSharedPorts: true, codersdk.FeatureTemplateRBAC: true}})
			s.DefaultTTL, s.ActivityBump, s.FailureTTL = fxDuration("8h"), fxDuration("1.5s"), fxDuration("1m")
			s.CORSBehavior, s.MaxPortShareLevel = aggv1.CORSBehaviorPassthru, aggv1.PortShareLevelOrganization
			s.AutostopRequirement = &aggv1.AutostopRequirement{DaysOfWeek: []string{"monday", "sunday"}, Weeks: 16}
		}, nil},
		{"bad durations", func(s *aggv1.CoderTemplateSpec) {
			s.DefaultTTL, s.ActivityBump, s.FailureTTL = fxDuration("eight hours"), fxDuration("-1h"), fxDuration("30s")
			s.TimeTilDormant, s.TimeTilDormantAutoDelete = fxDuration("100us"), fxDuration("0s")
		}, []string{"FieldValueInvalid spec.defaultTTL", "FieldValueInvalid spec.activityBump", "FieldValueInvalid spec.failureTTL", "FieldValueInvalid spec.timeTilDormant"}},
		{"unknown enums", func(s *aggv1.CoderTemplateSpec) {
			s.CORSBehavior, s.MaxPortShareLevel = "open", "everyone"
		}, []string{"FieldValueNotSupported spec.corsBehavior", "FieldValueNotSupported spec.maxPortShareLevel"}},
		{"bad days and weeks", func(s *aggv1.CoderTemplateSpec) {
			s.AutostopRequirement = &aggv1.AutostopRequirement{DaysOfWeek: []string{"friday", "monday"}, Weeks: 0}
			s.AutostartRequirement = &aggv1.AutostartRequirement{DaysOfWeek: []string{"Monday", "tuesday", "tuesday"}}
		}, []string{"FieldValueInvalid spec.autostopRequirement.daysOfWeek[1]", "FieldValueInvalid spec.autostopRequirement.weeks",
			"FieldValueNotSupported spec.autostartRequirement.daysOfWeek[0]", "FieldValueInvalid spec.autostartRequirement.daysOfWeek[2]"}},
		{"17 weeks", func(s *aggv1.CoderTemplateSpec) {
			s.AutostopRequirement = &aggv1.AutostopRequirement{Weeks: 17}
		}, []string{"FieldValueInvalid spec.autostopRequirement.weeks"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var spec aggv1.CoderTemplateSpec
			tc.set(&spec)
			if got := fxErrs(validateSettings(&spec, nil)); !fxSameStrings(got, tc.want) {
				t.Errorf("errors = %q, want %q", got, tc.want)
			}
		})
	}
	// An update is checked only where it changes Coder's value: what
	// coderd reports is accepted back even when coderd would refuse it
	// as a new value (weeks 0 from an older coderd).
	cur := fxSettingsSpec()
	cur.AutostopRequirement.Weeks = 0
	next := *cur.DeepCopy()
	if errs := validateSettings(&next, &cur); len(errs) > 0 {
		t.Errorf("an unchanged spec: %v", errs)
	}
	next.AutostopRequirement.DaysOfWeek = []string{"saturday"}
	if got, want := fxErrs(validateSettings(&next, &cur)), []string{"FieldValueInvalid spec.autostopRequirement.weeks"}; !fxSameStrings(got, want) {
		t.Errorf("a changed autostopRequirement: %q, want %q", got, want)
	}
}

// A duration reads back as last written while Coder has that value, in
// metav1.Duration's form otherwise; merging twice changes nothing, and a
// write's spec hash is the one the merged object shows.
func TestDurationSpelling(t *testing.T) {
	tgt := fxTarget(t, "prod", false)
	read := func(tpl *codersdk.Template, rec *records.Record) *aggv1.CoderTemplate {
		obj := toTemplate(tgt, tpl, fxVersion(), nil)
		mergeRecord(obj, rec)
		return obj
	}
	rec := &records.Record{Spec: coderv1alpha1.CoderObjectRecordSpec{Durations: map[string]string{"defaultTTL": "8h", "activityBump": "90m", "failureTTL": "1h"}}}
	obj := read(fxTemplate(), rec)
	if got := [3]aggv1.Duration{*obj.Spec.DefaultTTL, *obj.Spec.ActivityBump, *obj.Spec.FailureTTL}; got != [3]aggv1.Duration{"8h", "90m", "0s"} {
		t.Errorf("defaultTTL, activityBump, failureTTL = %q, want 8h, 90m as written and 0s (Coder's 0 is not the 1h written)", got)
	}
	again := obj.DeepCopy()
	mergeRecord(again, rec)
	if !reflect.DeepEqual(again.Spec, obj.Spec) {
		t.Errorf("merging again changed the spec:\n%+v\n%+v", again.Spec, obj.Spec)
	}
	changed := fxTemplate()
	changed.DefaultTTLMillis = (9 * time.Hour).Milliseconds()
	if got := *read(changed, rec).Spec.DefaultTTL; got != "9h0m0s" {
		t.Errorf("defaultTTL changed in Coder reads %q, want 9h0m0s", got)
	}
	if got := *read(fxTemplate(), nil).Spec.DefaultTTL; got != "8h0m0s" {
		t.Errorf("defaultTTL without a record reads %q, want 8h0m0s", got)
	}

	// A write of "480m" over "8h": the record keeps the new spelling and
	// drops canonical ones; an unset duration keeps what it had.
	want := &aggv1.CoderTemplate{Spec: aggv1.CoderTemplateSpec{DefaultTTL: fxDuration("480m"), ActivityBump: fxDuration("1h30m0s")}}
	got := writtenDurations(rec.Spec.Durations, &want.Spec)
	if wantRec := map[string]string{"defaultTTL": "480m", "failureTTL": "1h"}; !reflect.DeepEqual(got, wantRec) {
		t.Errorf("writtenDurations = %v, want %v", got, wantRec)
	}
	w := &write{cur: obj}
	next := w.record(want, toTemplate(tgt, fxTemplate(), fxVersion(), nil), nil)
	shown := read(fxTemplate(), next)
	if *shown.Spec.DefaultTTL != "480m" {
		t.Errorf("after the write defaultTTL reads %q, want 480m", *shown.Spec.DefaultTTL)
	}
	if next.Spec.SpecHash != specHashOf(shown) {
		t.Error("the record's spec hash is not the hash of the spec the object shows: every read would count a change made in Coder")
	}
	if next.Spec.Generation != obj.Generation+1 {
		t.Errorf("generation %d after a new spelling of %d, want one more", next.Spec.Generation, obj.Generation)
	}
}

func TestSettingsChanges(t *testing.T) {
	cur := fxSettingsSpec()
	next := aggv1.CoderTemplateSpec{}
	if settingsDiffer(&next, &cur) {
		t.Error("a spec without settings changes Coder's")
	}
	next = *cur.DeepCopy()
	if settingsDiffer(&next, &cur) {
		t.Error("the spec as read changes Coder's")
	}
	// A new spelling of the same value changes only the record.
	next.DefaultTTL = fxDuration("480m")
	if settingsDiffer(&next, &cur) {
		t.Error("480m for 8h0m0s changes Coder's value")
	}
	next.AutostartRequirement = &aggv1.AutostartRequirement{DaysOfWeek: []string{"monday"}}
	if !settingsDiffer(&next, &cur) {
		t.Error("a new autostartRequirement does not change Coder's")
	}

	// keepSettings fills what next leaves unset with cur's values.
	partial := aggv1.CoderTemplateSpec{CORSBehavior: aggv1.CORSBehaviorPassthru, RequireActiveVersion: fxPtr(true)}
	keepSettings(&partial, &cur)
	wantKept := *cur.DeepCopy()
	wantKept.CORSBehavior, wantKept.RequireActiveVersion = aggv1.CORSBehaviorPassthru, fxPtr(true)
	if !reflect.DeepEqual(partial, wantKept) {
		t.Errorf("keepSettings = %+v\nwant %+v", partial, wantKept)
	}
}

// The refusal rule: a licensed setting that changes Coder's value needs
// its feature; equal values, unlicensed settings and clearing a
// deprecation never do.
func TestUnlicensed(t *testing.T) {
	openSource := coderdFeatures{openSource: true}
	unentitled := coderdFeatures{enabled: map[codersdk.FeatureName]bool{codersdk.FeatureAccessControl: true}}
	licensed := coderdFeatures{enabled: map[codersdk.FeatureName]bool{codersdk.FeatureAdvancedTemplateScheduling: true,
		codersdk.FeatureAccessControl: true, codersdk.FeatureControlSharedPorts: true, codersdk.FeatureTemplateRBAC: true}}
	cur := fxSettingsSpec()
	for _, tc := range []struct {
		name string
		set  func(*aggv1.CoderTemplateSpec)
		f    coderdFeatures
		want []string
	}{
		{"unlicensed settings changed", func(s *aggv1.CoderTemplateSpec) {
			s.DefaultTTL, s.ActivityBump, s.AllowUserCancelWorkspaceJobs = fxDuration("1h"), fxDuration("0s"), fxPtr(true)
			s.CORSBehavior, s.UseClassicParameterFlow = aggv1.CORSBehaviorPassthru, fxPtr(true)
		}, openSource, nil},
		{"licensed settings at Coder's values", func(s *aggv1.CoderTemplateSpec) {
			*s = *cur.DeepCopy()
			s.FailureTTL = fxDuration("0ms")
		}, openSource, nil},
		{"clearing a deprecation", func(s *aggv1.CoderTemplateSpec) { s.DeprecationMessage = fxPtr("") }, openSource, nil},
		{"every licensed setting changed, open source", changeLicensed, openSource, []string{
			"FieldValueForbidden spec.autostopRequirement", "FieldValueForbidden spec.autostartRequirement",
			"FieldValueForbidden spec.allowUserAutostart", "FieldValueForbidden spec.allowUserAutostop",
			"FieldValueForbidden spec.failureTTL", "FieldValueForbidden spec.timeTilDormant", "FieldValueForbidden spec.timeTilDormantAutoDelete",
			"FieldValueForbidden spec.requireActiveVersion", "FieldValueForbidden spec.deprecationMessage", "FieldValueForbidden spec.maxPortShareLevel",
			"FieldValueForbidden spec.access"}},
		{"every licensed setting changed, access_control only", changeLicensed, unentitled, []string{
			"FieldValueForbidden spec.autostopRequirement", "FieldValueForbidden spec.autostartRequirement",
			"FieldValueForbidden spec.allowUserAutostart", "FieldValueForbidden spec.allowUserAutostop",
			"FieldValueForbidden spec.failureTTL", "FieldValueForbidden spec.timeTilDormant", "FieldValueForbidden spec.timeTilDormantAutoDelete",
			"FieldValueForbidden spec.maxPortShareLevel", "FieldValueForbidden spec.access"}},
		{"every licensed setting changed, licensed", changeLicensed, licensed, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var next aggv1.CoderTemplateSpec
			tc.set(&next)
			if got := fxErrs(unlicensed(&next, &cur, tc.f)); !fxSameStrings(got, tc.want) {
				t.Errorf("refused %q, want %q", got, tc.want)
			}
		})
	}
	var next aggv1.CoderTemplateSpec
	next.FailureTTL = fxDuration("1h")
	for f, why := range map[*coderdFeatures]string{&openSource: "open-source build", &unentitled: "not entitled by its license"} {
		errs := unlicensed(&next, &cur, *f)
		want := `spec.failureTTL: Forbidden: needs Coder's "advanced_template_scheduling" feature, which this coderd does not have (` + why + ")"
		if len(errs) != 1 || errs[0].Error() != want {
			t.Errorf("refusal = %v, want %q", errs, want)
		}
	}
}

func changeLicensed(s *aggv1.CoderTemplateSpec) {
	s.AutostopRequirement = &aggv1.AutostopRequirement{DaysOfWeek: []string{"saturday"}, Weeks: 2}
	s.AutostartRequirement = &aggv1.AutostartRequirement{DaysOfWeek: []string{"monday", "tuesday"}}
	s.AllowUserAutostart, s.AllowUserAutostop, s.RequireActiveVersion = fxPtr(false), fxPtr(false), fxPtr(true)
	s.FailureTTL, s.TimeTilDormant, s.TimeTilDormantAutoDelete = fxDuration("1h"), fxDuration("24h"), fxDuration("168h")
	s.DeprecationMessage, s.MaxPortShareLevel = fxPtr("use another"), aggv1.PortShareLevelOwner
	s.Access = &aggv1.TemplateAccess{Users: []aggv1.TemplateAccessEntry{{Name: "alice", Role: aggv1.TemplateRoleAdmin}}}
}

// A licensed round trip against a contract fake of an enterprise coderd
// (coder v2.30.0 with every template feature: patchTemplateMeta stores
// the request's settings and convertTemplate reports them): every
// setting written reads back as written, with the record's spellings.
func TestSettingsRoundTrip(t *testing.T) {
	var spec aggv1.CoderTemplateSpec
	changeLicensed(&spec)
	spec.Access = nil // not in the template's PATCH: TestAccessPatch
	spec.DefaultTTL, spec.ActivityBump = fxDuration("8h"), fxDuration("5m")
	spec.AllowUserCancelWorkspaceJobs, spec.UseClassicParameterFlow, spec.CORSBehavior = fxPtr(true), fxPtr(true), aggv1.CORSBehaviorPassthru

	tpl := fxTemplate()
	req := coderapi.TemplateMeta(tpl)
	setMeta(&req, &spec)
	stored := enterpriseStores(*tpl, req)
	obj := toTemplate(fxTarget(t, "prod", false), &stored, fxVersion(), nil)
	mergeRecord(obj, &records.Record{Spec: coderv1alpha1.CoderObjectRecordSpec{Durations: writtenDurations(nil, &spec)}})
	got := obj.Spec
	got.Organization, got.DisplayName, got.Description, got.Icon, got.VersionID = "", "", "", "", ""
	if !reflect.DeepEqual(got, spec) {
		t.Errorf("read back\n%+v\nwant\n%+v", got, spec)
	}
	// Settings a write leaves unset are sent as Coder has them.
	req = coderapi.TemplateMeta(tpl)
	setMeta(&req, &aggv1.CoderTemplateSpec{CORSBehavior: aggv1.CORSBehaviorPassthru})
	if stored := enterpriseStores(*tpl, req); stored.CORSBehavior != codersdk.CORSBehaviorPassthru || !reflect.DeepEqual(settingsSpec(&stored, "corsBehavior"), settingsSpec(tpl, "corsBehavior")) {
		t.Errorf("setting corsBehavior alone changed other settings: %+v", stored)
	}

	// A create sends what differs from coderd's defaults only: an
	// open-source coderd refuses any max_port_share_level, even public.
	var create codersdk.CreateTemplateRequest
	defaults := createDefaults(coderdFeatures{})
	setCreate(&create, &aggv1.CoderTemplateSpec{MaxPortShareLevel: aggv1.PortShareLevelPublic, DefaultTTL: fxDuration("0s"), ActivityBump: fxDuration("2h")}, &defaults)
	if create.MaxPortShareLevel != nil || create.DefaultTTLMillis != nil || create.ActivityBumpMillis == nil || *create.ActivityBumpMillis != (2*time.Hour).Milliseconds() {
		t.Errorf("create request = %+v, want only activity_bump_ms", create)
	}
	create = codersdk.CreateTemplateRequest{}
	setCreate(&create, &spec, &defaults)
	if create.FailureTTLMillis == nil || *create.FailureTTLMillis != time.Hour.Milliseconds() || !create.RequireActiveVersion ||
		create.MaxPortShareLevel == nil || *create.MaxPortShareLevel != codersdk.WorkspaceAgentPortShareLevelOwner ||
		create.AutostopRequirement == nil || create.AutostopRequirement.Weeks != 2 {
		t.Errorf("create request = %+v, want the licensed settings", create)
	}
}

// enterpriseStores is what coder v2.30.0 with advanced_template_scheduling,
// access_control and control_shared_ports reports after PATCHing tpl with
// req: the schedule store, the access control store and the port sharer
// keep the request's values.
func enterpriseStores(tpl codersdk.Template, req codersdk.UpdateTemplateMeta) codersdk.Template {
	tpl.DefaultTTLMillis, tpl.ActivityBumpMillis = req.DefaultTTLMillis, req.ActivityBumpMillis
	tpl.AllowUserCancelWorkspaceJobs = req.AllowUserCancelWorkspaceJobs
	tpl.CORSBehavior, tpl.UseClassicParameterFlow = *req.CORSBehavior, *req.UseClassicParameterFlow
	tpl.AutostopRequirement, tpl.AutostartRequirement = *req.AutostopRequirement, *req.AutostartRequirement
	if tpl.AutostopRequirement.Weeks == 0 {
		tpl.AutostopRequirement.Weeks = 1
	}
	tpl.AllowUserAutostart, tpl.AllowUserAutostop = req.AllowUserAutostart, req.AllowUserAutostop
	tpl.FailureTTLMillis, tpl.TimeTilDormantMillis, tpl.TimeTilDormantAutoDeleteMillis = req.FailureTTLMillis, req.TimeTilDormantMillis, req.TimeTilDormantAutoDeleteMillis
	tpl.RequireActiveVersion = req.RequireActiveVersion
	tpl.DeprecationMessage, tpl.Deprecated = *req.DeprecationMessage, *req.DeprecationMessage != ""
	tpl.MaxPortShareLevel = *req.MaxPortShareLevel
	return tpl
}

// settingsSpec is tpl's settings without the one named.
func settingsSpec(tpl *codersdk.Template, without string) aggv1.CoderTemplateSpec {
	var s aggv1.CoderTemplateSpec
	showSettings(&s, tpl)
	if without == "corsBehavior" {
		s.CORSBehavior = ""
	}
	return s
}
