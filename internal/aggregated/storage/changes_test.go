package storage

import (
	"reflect"
	"testing"

	"github.com/coder/coder/v2/codersdk"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

func fxSpec() aggv1.CoderWorkspaceSpec {
	return aggv1.CoderWorkspaceSpec{
		Organization:      "acme",
		TemplateName:      "docker",
		TemplateVersionID: fxVersionID.String(),
		Running:           true,
		TTLMillis:         fxPtr(int64(3_600_000)),
		AutostartSchedule: fxPtr(fxAutostartSchedule),
		Parameters:        []aggv1.WorkspaceParameter{{Name: "region", Value: "eu"}, {Name: "cpus", Value: "4"}},
	}
}

func TestWorkspaceChanges(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*aggv1.CoderWorkspaceSpec)
		want   workspaceChange
	}{
		{name: "nothing", mutate: func(*aggv1.CoderWorkspaceSpec) {}},
		{name: "organization left out", mutate: func(s *aggv1.CoderWorkspaceSpec) { s.Organization = "" }},
		{name: "TTL changed", mutate: func(s *aggv1.CoderWorkspaceSpec) { s.TTLMillis = fxPtr(int64(60_000)) }, want: workspaceChange{ttl: true}},
		{name: "TTL removed", mutate: func(s *aggv1.CoderWorkspaceSpec) { s.TTLMillis = nil }, want: workspaceChange{ttl: true}},
		{name: "TTL same value, new pointer", mutate: func(s *aggv1.CoderWorkspaceSpec) { s.TTLMillis = fxPtr(int64(3_600_000)) }},
		{name: "autostart changed", mutate: func(s *aggv1.CoderWorkspaceSpec) { s.AutostartSchedule = fxPtr("CRON_TZ=UTC 0 8 * * *") }, want: workspaceChange{autostart: true}},
		{name: "autostart removed", mutate: func(s *aggv1.CoderWorkspaceSpec) { s.AutostartSchedule = nil }, want: workspaceChange{autostart: true}},
		{name: "autostart emptied", mutate: func(s *aggv1.CoderWorkspaceSpec) { s.AutostartSchedule = fxPtr("") }, want: workspaceChange{autostart: true}},
		{
			name:   "schedule only",
			mutate: func(s *aggv1.CoderWorkspaceSpec) { s.TTLMillis, s.AutostartSchedule = nil, nil },
			want:   workspaceChange{ttl: true, autostart: true},
		},
		{name: "stop", mutate: func(s *aggv1.CoderWorkspaceSpec) { s.Running = false }, want: workspaceChange{running: true}},
		{name: "version changed", mutate: func(s *aggv1.CoderWorkspaceSpec) { s.TemplateVersionID = fxOtherVersionID.String() }, want: workspaceChange{version: true}},
		{name: "version left out", mutate: func(s *aggv1.CoderWorkspaceSpec) { s.TemplateVersionID = "" }},
		{
			name: "parameter value changed",
			mutate: func(s *aggv1.CoderWorkspaceSpec) {
				s.Parameters = []aggv1.WorkspaceParameter{{Name: "region", Value: "us"}}
			},
			want: workspaceChange{parameters: true},
		},
		{
			name: "parameter added",
			mutate: func(s *aggv1.CoderWorkspaceSpec) {
				s.Parameters = append(s.Parameters, aggv1.WorkspaceParameter{Name: "disk", Value: "10"})
			},
			want: workspaceChange{parameters: true},
		},
		{name: "parameters left out", mutate: func(s *aggv1.CoderWorkspaceSpec) { s.Parameters = nil }},
		{
			name: "one parameter left out, the other unchanged",
			mutate: func(s *aggv1.CoderWorkspaceSpec) {
				s.Parameters = []aggv1.WorkspaceParameter{{Name: "cpus", Value: "4"}}
			},
		},
		{
			name: "parameters reordered",
			mutate: func(s *aggv1.CoderWorkspaceSpec) {
				s.Parameters = []aggv1.WorkspaceParameter{{Name: "cpus", Value: "4"}, {Name: "region", Value: "eu"}}
			},
		},
		{
			name: "everything",
			mutate: func(s *aggv1.CoderWorkspaceSpec) {
				s.TTLMillis, s.AutostartSchedule, s.Running = nil, nil, false
				s.TemplateVersionID = fxOtherVersionID.String()
				s.Parameters = []aggv1.WorkspaceParameter{{Name: "cpus", Value: "8"}}
			},
			want: workspaceChange{ttl: true, autostart: true, running: true, version: true, parameters: true},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur, next := fxSpec(), fxSpec()
			tc.mutate(&next)
			got := workspaceChanges(&cur, &next)
			if got != tc.want {
				t.Fatalf("workspaceChanges = %+v, want %+v", got, tc.want)
			}
			wantBuild := tc.want.running || tc.want.version || tc.want.parameters
			if got.build() != wantBuild {
				t.Errorf("build() = %v, want %v", got.build(), wantBuild)
			}
			if got.none() != (tc.want == workspaceChange{}) {
				t.Errorf("none() = %v for %+v", got.none(), got)
			}
		})
	}
}

// A TTL or autostart change alone needs no build; anything else does.
func TestWorkspaceChangeBuild(t *testing.T) {
	for _, tc := range []struct {
		c           workspaceChange
		build, none bool
	}{
		{workspaceChange{}, false, true},
		{workspaceChange{ttl: true}, false, false},
		{workspaceChange{autostart: true}, false, false},
		{workspaceChange{ttl: true, autostart: true}, false, false},
		{workspaceChange{running: true}, true, false},
		{workspaceChange{version: true}, true, false},
		{workspaceChange{parameters: true}, true, false},
		{workspaceChange{ttl: true, parameters: true}, true, false},
	} {
		if tc.c.build() != tc.build || tc.c.none() != tc.none {
			t.Errorf("%+v: build %v none %v, want %v %v", tc.c, tc.c.build(), tc.c.none(), tc.build, tc.none)
		}
	}
}

func TestParametersChanged(t *testing.T) {
	cur := []aggv1.WorkspaceParameter{{Name: "a", Value: "1"}, {Name: "b", Value: ""}}
	for _, tc := range []struct {
		name string
		next []aggv1.WorkspaceParameter
		want bool
	}{
		{"nil", nil, false},
		{"empty", []aggv1.WorkspaceParameter{}, false},
		{"same", cur, false},
		{"subset", []aggv1.WorkspaceParameter{{Name: "b", Value: ""}}, false},
		{"value changed", []aggv1.WorkspaceParameter{{Name: "a", Value: "2"}}, true},
		{"empty value set", []aggv1.WorkspaceParameter{{Name: "b", Value: "x"}}, true},
		{"value emptied", []aggv1.WorkspaceParameter{{Name: "a", Value: ""}}, true},
		{"new parameter", []aggv1.WorkspaceParameter{{Name: "c", Value: ""}}, true},
		{"name case differs", []aggv1.WorkspaceParameter{{Name: "A", Value: "1"}}, true},
	} {
		if got := parametersChanged(cur, tc.next); got != tc.want {
			t.Errorf("%s: parametersChanged = %v, want %v", tc.name, got, tc.want)
		}
	}
	if parametersChanged(nil, nil) {
		t.Error("parametersChanged(nil, nil) = true")
	}
	if !parametersChanged(nil, []aggv1.WorkspaceParameter{{Name: "a"}}) {
		t.Error("a parameter the workspace has no value for is not a change")
	}
}

func TestEqualPtr(t *testing.T) {
	one, one2, two := fxPtr(1), fxPtr(1), fxPtr(2)
	for _, tc := range []struct {
		a, b *int
		want bool
	}{
		{nil, nil, true},
		{one, nil, false},
		{nil, one, false},
		{one, one2, true},
		{one, two, false},
	} {
		if got := equalPtr(tc.a, tc.b); got != tc.want {
			t.Errorf("equalPtr(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestParameterConversion(t *testing.T) {
	if fromParameters(nil) != nil || fromParameters([]aggv1.WorkspaceParameter{}) != nil {
		t.Error("fromParameters of no parameters is not nil")
	}
	if toParameters(nil) != nil || toParameters([]codersdk.WorkspaceBuildParameter{}) != nil {
		t.Error("toParameters of no parameters is not nil")
	}
	in := []aggv1.WorkspaceParameter{{Name: "a", Value: `["x","y"]`}, {Name: "b", Value: ""}}
	sdk := fromParameters(in)
	if want := []codersdk.WorkspaceBuildParameter{{Name: "a", Value: `["x","y"]`}, {Name: "b", Value: ""}}; !reflect.DeepEqual(sdk, want) {
		t.Errorf("fromParameters = %+v", sdk)
	}
	if back := toParameters(sdk); !reflect.DeepEqual(back, in) {
		t.Errorf("toParameters(fromParameters(x)) = %+v, want %+v", back, in)
	}
}
