package storage

import (
	"fmt"
	"slices"
	"time"

	"github.com/coder/coder/v2/codersdk"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
)

// A template's settings (spec.defaultTTL and the others after spec.files)
// are Coder's template settings. A read shows Coder's value of every one;
// a write changes those it sets (unset keeps Coder's value) and is
// refused (422) when it changes a licensed setting that the coderd cannot
// honour: an unlicensed coderd answers such a PATCH with 200 and keeps
// the old value, which would look like success. Durations are read back
// as last written (the template's record keeps the spelling), as long as
// Coder still has that value.

// setting describes one template setting.
type setting struct {
	// name is its JSON name under spec.
	name string
	// feature is the license feature coderd needs to change it; "" for
	// none.
	feature codersdk.FeatureName
	// differs reports whether next sets the setting to another value than
	// cur has.
	differs func(next, cur *aggv1.CoderTemplateSpec) bool
	// free, when set, reports that next's change needs no feature
	// (coderd honours it without the license).
	free func(next *aggv1.CoderTemplateSpec) bool
}

// durationSetting is a setting held as a duration.
type durationSetting struct {
	name string
	of   func(*aggv1.CoderTemplateSpec) **aggv1.Duration
	// atLeastMinute: coderd refuses values between 0 and one minute.
	atLeastMinute bool
}

var durationSettings = []durationSetting{
	{name: "defaultTTL", of: func(s *aggv1.CoderTemplateSpec) **aggv1.Duration { return &s.DefaultTTL }},
	{name: "activityBump", of: func(s *aggv1.CoderTemplateSpec) **aggv1.Duration { return &s.ActivityBump }},
	{name: "failureTTL", of: func(s *aggv1.CoderTemplateSpec) **aggv1.Duration { return &s.FailureTTL }, atLeastMinute: true},
	{name: "timeTilDormant", of: func(s *aggv1.CoderTemplateSpec) **aggv1.Duration { return &s.TimeTilDormant }, atLeastMinute: true},
	{name: "timeTilDormantAutoDelete", of: func(s *aggv1.CoderTemplateSpec) **aggv1.Duration { return &s.TimeTilDormantAutoDelete }, atLeastMinute: true},
}

// templateSettings are every setting with the feature it needs (read in
// coder v2.30.0: enterprise/coderd swaps in the template schedule store
// with advanced_template_scheduling, the access control store with
// access_control and the port sharer with control_shared_ports; the
// open-source stores keep the old values).
var templateSettings = []setting{
	{name: "defaultTTL", differs: durationDiffers(durationSettings[0])},
	{name: "activityBump", differs: durationDiffers(durationSettings[1])},
	{name: "allowUserCancelWorkspaceJobs", differs: func(n, c *aggv1.CoderTemplateSpec) bool {
		return ptrDiffers(n.AllowUserCancelWorkspaceJobs, c.AllowUserCancelWorkspaceJobs)
	}},
	{name: "corsBehavior", differs: func(n, c *aggv1.CoderTemplateSpec) bool {
		return n.CORSBehavior != "" && n.CORSBehavior != c.CORSBehavior
	}},
	{name: "useClassicParameterFlow", differs: func(n, c *aggv1.CoderTemplateSpec) bool {
		return ptrDiffers(n.UseClassicParameterFlow, c.UseClassicParameterFlow)
	}},
	{name: "autostopRequirement", feature: codersdk.FeatureAdvancedTemplateScheduling, differs: func(n, c *aggv1.CoderTemplateSpec) bool {
		return n.AutostopRequirement != nil && (c.AutostopRequirement == nil ||
			!slices.Equal(n.AutostopRequirement.DaysOfWeek, c.AutostopRequirement.DaysOfWeek) ||
			n.AutostopRequirement.Weeks != c.AutostopRequirement.Weeks)
	}},
	{name: "autostartRequirement", feature: codersdk.FeatureAdvancedTemplateScheduling, differs: func(n, c *aggv1.CoderTemplateSpec) bool {
		return n.AutostartRequirement != nil && (c.AutostartRequirement == nil ||
			!slices.Equal(n.AutostartRequirement.DaysOfWeek, c.AutostartRequirement.DaysOfWeek))
	}},
	{name: "allowUserAutostart", feature: codersdk.FeatureAdvancedTemplateScheduling, differs: func(n, c *aggv1.CoderTemplateSpec) bool {
		return ptrDiffers(n.AllowUserAutostart, c.AllowUserAutostart)
	}},
	{name: "allowUserAutostop", feature: codersdk.FeatureAdvancedTemplateScheduling, differs: func(n, c *aggv1.CoderTemplateSpec) bool {
		return ptrDiffers(n.AllowUserAutostop, c.AllowUserAutostop)
	}},
	{name: "failureTTL", feature: codersdk.FeatureAdvancedTemplateScheduling, differs: durationDiffers(durationSettings[2])},
	{name: "timeTilDormant", feature: codersdk.FeatureAdvancedTemplateScheduling, differs: durationDiffers(durationSettings[3])},
	{name: "timeTilDormantAutoDelete", feature: codersdk.FeatureAdvancedTemplateScheduling, differs: durationDiffers(durationSettings[4])},
	{name: "requireActiveVersion", feature: codersdk.FeatureAccessControl, differs: func(n, c *aggv1.CoderTemplateSpec) bool {
		return ptrDiffers(n.RequireActiveVersion, c.RequireActiveVersion)
	}},
	{name: "deprecationMessage", feature: codersdk.FeatureAccessControl, differs: func(n, c *aggv1.CoderTemplateSpec) bool {
		return ptrDiffers(n.DeprecationMessage, c.DeprecationMessage)
	}, free: func(n *aggv1.CoderTemplateSpec) bool {
		// The open-source access control store clears a deprecation.
		return *n.DeprecationMessage == ""
	}},
	{name: "maxPortShareLevel", feature: codersdk.FeatureControlSharedPorts, differs: func(n, c *aggv1.CoderTemplateSpec) bool {
		return n.MaxPortShareLevel != "" && n.MaxPortShareLevel != c.MaxPortShareLevel
	}},
	// Not part of the template's PATCH: setAccess writes it
	// (template_access.go).
	{name: "access", feature: codersdk.FeatureTemplateRBAC, differs: accessDiffers},
}

// settingNamed finds a setting by its JSON name.
var settingNamed = func() map[string]setting {
	m := make(map[string]setting, len(templateSettings))
	for _, s := range templateSettings {
		m[s.name] = s
	}
	return m
}()

func ptrDiffers[T comparable](next, cur *T) bool {
	return next != nil && (cur == nil || *next != *cur)
}

func durationDiffers(d durationSetting) func(next, cur *aggv1.CoderTemplateSpec) bool {
	return func(next, cur *aggv1.CoderTemplateSpec) bool {
		n, c := *d.of(next), *d.of(cur)
		if n == nil {
			return false
		}
		if c == nil {
			return true
		}
		nms, nerr := durationMillis(*n)
		cms, cerr := durationMillis(*c)
		return nerr != nil || cerr != nil || nms != cms
	}
}

// settingsDiffer reports whether next sets any setting to another value
// than cur has.
func settingsDiffer(next, cur *aggv1.CoderTemplateSpec) bool {
	for _, s := range templateSettings {
		if s.differs(next, cur) {
			return true
		}
	}
	return false
}

// durationMillis parses a duration setting into coderd's milliseconds.
func durationMillis(d aggv1.Duration) (int64, error) {
	v, err := time.ParseDuration(string(d))
	if err != nil {
		return 0, err
	}
	if v < 0 {
		return 0, fmt.Errorf("must not be negative")
	}
	if v%time.Millisecond != 0 {
		return 0, fmt.Errorf("must be whole milliseconds (Coder keeps milliseconds)")
	}
	return v.Milliseconds(), nil
}

// canonicalDuration is how a duration of ms milliseconds reads when it
// was not written through Kubernetes (metav1.Duration's form, "8h0m0s").
func canonicalDuration(ms int64) *aggv1.Duration {
	d := aggv1.Duration((time.Duration(ms) * time.Millisecond).String())
	return &d
}

// showSettings sets spec's settings to the values of Coder template tpl
// (durations in their canonical form; showDurations spells them as
// written).
func showSettings(spec *aggv1.CoderTemplateSpec, tpl *codersdk.Template) {
	spec.DefaultTTL = canonicalDuration(tpl.DefaultTTLMillis)
	spec.ActivityBump = canonicalDuration(tpl.ActivityBumpMillis)
	spec.AllowUserCancelWorkspaceJobs = new(tpl.AllowUserCancelWorkspaceJobs)
	spec.CORSBehavior = aggv1.CORSBehavior(tpl.CORSBehavior)
	spec.UseClassicParameterFlow = new(tpl.UseClassicParameterFlow)
	spec.AutostopRequirement = &aggv1.AutostopRequirement{DaysOfWeek: weekdays(tpl.AutostopRequirement.DaysOfWeek), Weeks: tpl.AutostopRequirement.Weeks}
	spec.AutostartRequirement = &aggv1.AutostartRequirement{DaysOfWeek: weekdays(tpl.AutostartRequirement.DaysOfWeek)}
	spec.AllowUserAutostart = new(tpl.AllowUserAutostart)
	spec.AllowUserAutostop = new(tpl.AllowUserAutostop)
	spec.FailureTTL = canonicalDuration(tpl.FailureTTLMillis)
	spec.TimeTilDormant = canonicalDuration(tpl.TimeTilDormantMillis)
	spec.TimeTilDormantAutoDelete = canonicalDuration(tpl.TimeTilDormantAutoDeleteMillis)
	spec.RequireActiveVersion = new(tpl.RequireActiveVersion)
	spec.DeprecationMessage = new(tpl.DeprecationMessage)
	spec.MaxPortShareLevel = aggv1.PortShareLevel(tpl.MaxPortShareLevel)
}

// weekdays is coderd's list of days (in week order), nil when empty.
func weekdays(days []string) []string {
	if len(days) == 0 {
		return nil
	}
	return slices.Clone(days)
}

// showDurations spells spec's durations as rec (nil: none) last recorded
// them, where that is still their value, and in the canonical form
// otherwise. It sets new pointers (spec may share them with another
// object) and may run again on its own output.
func showDurations(spec *aggv1.CoderTemplateSpec, rec *records.Record) {
	for _, d := range durationSettings {
		p := d.of(spec)
		if *p == nil {
			continue
		}
		ms, err := durationMillis(**p)
		if err != nil {
			continue
		}
		shown := canonicalDuration(ms)
		if rec != nil {
			if w, ok := rec.Spec.Durations[d.name]; ok {
				if wms, err := durationMillis(aggv1.Duration(w)); err == nil && wms == ms {
					shown = new(aggv1.Duration(w))
				}
			}
		}
		*p = shown
	}
}

// writtenDurations is what a record keeps of spellings after a write of
// spec: prev's, with those spec sets replaced. Canonical spellings are not
// kept: they read back as written anyway.
func writtenDurations(prev map[string]string, spec *aggv1.CoderTemplateSpec) map[string]string {
	out := map[string]string{}
	for k, v := range prev {
		out[k] = v
	}
	for _, d := range durationSettings {
		p := *d.of(spec)
		if p == nil {
			continue
		}
		ms, err := durationMillis(*p)
		if err != nil {
			continue
		}
		if *canonicalDuration(ms) == *p {
			delete(out, d.name)
		} else {
			out[d.name] = string(*p)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// keepSettings sets every setting next leaves unset to cur's: what an
// object shows after a write that keeps Coder's values.
func keepSettings(next *aggv1.CoderTemplateSpec, cur *aggv1.CoderTemplateSpec) {
	for _, d := range durationSettings {
		if p := d.of(next); *p == nil {
			*p = *d.of(cur)
		}
	}
	keep := func(n **bool, c *bool) {
		if *n == nil {
			*n = c
		}
	}
	keep(&next.AllowUserCancelWorkspaceJobs, cur.AllowUserCancelWorkspaceJobs)
	keep(&next.UseClassicParameterFlow, cur.UseClassicParameterFlow)
	keep(&next.AllowUserAutostart, cur.AllowUserAutostart)
	keep(&next.AllowUserAutostop, cur.AllowUserAutostop)
	keep(&next.RequireActiveVersion, cur.RequireActiveVersion)
	if next.CORSBehavior == "" {
		next.CORSBehavior = cur.CORSBehavior
	}
	if next.AutostopRequirement == nil {
		next.AutostopRequirement = cur.AutostopRequirement.DeepCopy()
	}
	if next.AutostartRequirement == nil {
		next.AutostartRequirement = cur.AutostartRequirement.DeepCopy()
	}
	if next.DeprecationMessage == nil {
		next.DeprecationMessage = cur.DeprecationMessage
	}
	if next.MaxPortShareLevel == "" {
		next.MaxPortShareLevel = cur.MaxPortShareLevel
	}
	// Where coderd cannot show its access list (cur has none), a write's
	// answer does not either, as its reads will not.
	if next.Access == nil || cur.Access == nil {
		next.Access = cur.Access.DeepCopy()
	} else {
		next.Access = sortedAccess(next.Access)
	}
}
