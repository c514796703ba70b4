package storage

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

func fxNewWorkspace(name string) *aggv1.CoderWorkspace {
	return &aggv1.CoderWorkspace{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       aggv1.CoderWorkspaceSpec{TemplateName: "docker", Running: true},
	}
}

func TestValidateWorkspaceCreate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*aggv1.CoderWorkspace)
		want   []string
		// detail, when set, is a substring of the first error's detail.
		detail string
	}{
		{name: "valid", mutate: func(*aggv1.CoderWorkspace) {}},
		{name: "valid with everything", mutate: func(w *aggv1.CoderWorkspace) {
			w.Spec.Organization = "acme"
			w.Spec.TemplateVersionID = fxVersionID.String()
			w.Spec.TTLMillis = fxPtr(int64(0))
			w.Spec.AutostartSchedule = fxPtr(fxAutostartSchedule)
			w.Spec.Parameters = []aggv1.WorkspaceParameter{{Name: "a", Value: ""}, {Name: "b", Value: "x"}}
		}},
		{
			name:   "generateName",
			mutate: func(w *aggv1.CoderWorkspace) { w.Name, w.GenerateName = "", "acme.alice.dev-" },
			want:   []string{"FieldValueForbidden metadata.generateName"},
			detail: "give metadata.name",
		},
		{
			name:   "no name",
			mutate: func(w *aggv1.CoderWorkspace) { w.Name = "" },
			want:   []string{"FieldValueInvalid metadata.name"},
			detail: "<organization>.<owner>.<workspace>",
		},
		{
			name:   "malformed name",
			mutate: func(w *aggv1.CoderWorkspace) { w.Name = "acme.dev" },
			want:   []string{"FieldValueInvalid metadata.name"},
			detail: "<organization>.<owner>.<workspace>",
		},
		{
			name:   "invalid name part",
			mutate: func(w *aggv1.CoderWorkspace) { w.Name = "acme.alice.my_ws" },
			want:   []string{"FieldValueInvalid metadata.name"},
			detail: `workspace name "my_ws"`,
		},
		{
			// A bad name stops validation: nothing else is reported.
			name:   "malformed name hides the rest",
			mutate: func(w *aggv1.CoderWorkspace) { w.Name, w.Spec.TemplateName = "x", "" },
			want:   []string{"FieldValueInvalid metadata.name"},
		},
		{
			name:   "organization differs from the name",
			mutate: func(w *aggv1.CoderWorkspace) { w.Spec.Organization = "other" },
			want:   []string{"FieldValueInvalid spec.organization"},
			detail: "must match the organization in the name (acme)",
		},
		{
			name:   "no template",
			mutate: func(w *aggv1.CoderWorkspace) { w.Spec.TemplateName = "" },
			want:   []string{"FieldValueRequired spec.templateName"},
		},
		{
			name:   "template version not a UUID",
			mutate: func(w *aggv1.CoderWorkspace) { w.Spec.TemplateVersionID = "v1" },
			want:   []string{"FieldValueInvalid spec.templateVersionID"},
			detail: "UUID",
		},
		{
			name:   "negative TTL",
			mutate: func(w *aggv1.CoderWorkspace) { w.Spec.TTLMillis = fxPtr(int64(-1)) },
			want:   []string{"FieldValueInvalid spec.ttlMillis"},
			detail: "must not be negative",
		},
		{
			name: "parameter without name",
			mutate: func(w *aggv1.CoderWorkspace) {
				w.Spec.Parameters = []aggv1.WorkspaceParameter{{Name: "a", Value: "1"}, {Value: "2"}}
			},
			want: []string{"FieldValueRequired spec.parameters[1].name"},
		},
		{
			name: "duplicate parameter",
			mutate: func(w *aggv1.CoderWorkspace) {
				w.Spec.Parameters = []aggv1.WorkspaceParameter{{Name: "a", Value: "1"}, {Name: "b"}, {Name: "a", Value: "2"}}
			},
			want: []string{"FieldValueDuplicate spec.parameters[2].name"},
		},
		{
			name: "every spec error at once",
			mutate: func(w *aggv1.CoderWorkspace) {
				w.Spec = aggv1.CoderWorkspaceSpec{
					Organization:      "other",
					TemplateVersionID: "nope",
					TTLMillis:         fxPtr(int64(-5)),
					Parameters:        []aggv1.WorkspaceParameter{{Name: ""}, {Name: "x"}, {Name: "x"}},
				}
			},
			want: []string{
				"FieldValueInvalid spec.organization",
				"FieldValueRequired spec.templateName",
				"FieldValueInvalid spec.templateVersionID",
				"FieldValueInvalid spec.ttlMillis",
				"FieldValueRequired spec.parameters[0].name",
				"FieldValueDuplicate spec.parameters[2].name",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := fxNewWorkspace("acme.alice.dev")
			tc.mutate(w)
			n, errs := validateWorkspaceCreate(w)
			if got := fxErrs(errs); !fxSameStrings(got, tc.want) {
				t.Fatalf("errors = %q, want %q (%v)", got, tc.want, errs)
			}
			if tc.detail != "" && !strings.Contains(errs[0].Detail, tc.detail) {
				t.Errorf("detail %q does not contain %q", errs[0].Detail, tc.detail)
			}
			if len(errs) == 0 && n != (workspaceName{Org: "acme", Owner: "alice", Name: "dev"}) {
				t.Errorf("parsed name = %+v", n)
			}
		})
	}
}

func TestValidateWorkspaceCreateReturnsControlPlane(t *testing.T) {
	n, errs := validateWorkspaceCreate(fxNewWorkspace("prod.acme.alice.dev"))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if n != (workspaceName{ControlPlane: "prod", Org: "acme", Owner: "alice", Name: "dev"}) {
		t.Errorf("parsed name = %+v", n)
	}
}

func TestValidateWorkspaceUpdate(t *testing.T) {
	cur := toWorkspace(fxTarget(t, "prod", false), fxWorkspace(), []aggv1.WorkspaceParameter{{Name: "a", Value: "1"}})
	for _, tc := range []struct {
		name   string
		mutate func(*aggv1.CoderWorkspace)
		want   []string
		detail string
	}{
		{name: "unchanged", mutate: func(*aggv1.CoderWorkspace) {}},
		{name: "allowed changes", mutate: func(w *aggv1.CoderWorkspace) {
			w.Spec.Running = false
			w.Spec.TemplateVersionID = fxOtherVersionID.String()
			w.Spec.TTLMillis = nil
			w.Spec.AutostartSchedule = nil
			w.Spec.Parameters = []aggv1.WorkspaceParameter{{Name: "a", Value: "2"}, {Name: "b", Value: "3"}}
			w.Labels = map[string]string{"mine": "yes"}
		}},
		{name: "organization left out", mutate: func(w *aggv1.CoderWorkspace) { w.Spec.Organization = "" }},
		{
			name:   "name differs from the URL",
			mutate: func(w *aggv1.CoderWorkspace) { w.Name = "acme.alice.other" },
			want:   []string{"FieldValueInvalid metadata.name"},
			detail: "must match the name in the URL (acme.alice.dev)",
		},
		{
			name:   "organization changed",
			mutate: func(w *aggv1.CoderWorkspace) { w.Spec.Organization = "other" },
			want:   []string{"FieldValueForbidden spec.organization"},
			detail: "cannot move to another organization",
		},
		{
			name:   "template changed",
			mutate: func(w *aggv1.CoderWorkspace) { w.Spec.TemplateName = "k8s" },
			want:   []string{"FieldValueForbidden spec.templateName"},
			detail: "pick a version of docker with spec.templateVersionID",
		},
		{
			name:   "template left out",
			mutate: func(w *aggv1.CoderWorkspace) { w.Spec.TemplateName = "" },
			want:   []string{"FieldValueForbidden spec.templateName"},
		},
		{
			name: "spec errors",
			mutate: func(w *aggv1.CoderWorkspace) {
				w.Spec.TemplateVersionID = "latest"
				w.Spec.TTLMillis = fxPtr(int64(-1))
				w.Spec.Parameters = []aggv1.WorkspaceParameter{{Name: "a"}, {Name: "a"}, {}}
			},
			want: []string{
				"FieldValueInvalid spec.templateVersionID",
				"FieldValueInvalid spec.ttlMillis",
				"FieldValueDuplicate spec.parameters[1].name",
				"FieldValueRequired spec.parameters[2].name",
			},
		},
		{
			name: "everything wrong",
			mutate: func(w *aggv1.CoderWorkspace) {
				w.Name = "x"
				w.Spec.Organization = "other"
				w.Spec.TemplateName = "k8s"
				w.Spec.TTLMillis = fxPtr(int64(-1))
			},
			want: []string{
				"FieldValueInvalid metadata.name",
				"FieldValueForbidden spec.organization",
				"FieldValueForbidden spec.templateName",
				"FieldValueInvalid spec.ttlMillis",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := cur.DeepCopy()
			tc.mutate(next)
			errs := validateWorkspaceUpdate(next, cur, "acme.alice.dev")
			if got := fxErrs(errs); !fxSameStrings(got, tc.want) {
				t.Fatalf("errors = %q, want %q (%v)", got, tc.want, errs)
			}
			if tc.detail != "" && !strings.Contains(errs[0].Detail, tc.detail) {
				t.Errorf("detail %q does not contain %q", errs[0].Detail, tc.detail)
			}
		})
	}
}

func TestValidateTemplateUpdate(t *testing.T) {
	cur := toTemplate(fxTarget(t, "prod", false), fxTemplate(), fxVersion(), map[string]string{"main.tf": "v1"})
	for _, tc := range []struct {
		name   string
		mutate func(*aggv1.CoderTemplate)
		want   []string
		detail string
	}{
		{name: "unchanged", mutate: func(*aggv1.CoderTemplate) {}},
		{name: "metadata changed", mutate: func(tpl *aggv1.CoderTemplate) {
			tpl.Spec.DisplayName, tpl.Spec.Description, tpl.Spec.Icon = "D", "d", "/icon/x.svg"
		}},
		{name: "organization left out", mutate: func(tpl *aggv1.CoderTemplate) { tpl.Spec.Organization = "" }},
		{name: "version promoted, files unchanged", mutate: func(tpl *aggv1.CoderTemplate) {
			tpl.Spec.VersionID = fxOtherVersionID.String()
		}},
		{name: "version promoted, files left out", mutate: func(tpl *aggv1.CoderTemplate) {
			tpl.Spec.VersionID, tpl.Spec.Files = fxOtherVersionID.String(), nil
		}},
		{name: "files changed, version unchanged", mutate: func(tpl *aggv1.CoderTemplate) {
			tpl.Spec.Files = map[string]string{"main.tf": "v2"}
		}},
		{name: "files changed, version left out", mutate: func(tpl *aggv1.CoderTemplate) {
			tpl.Spec.VersionID, tpl.Spec.Files = "", map[string]string{"main.tf": "v2"}
		}},
		{
			name:   "name differs from the URL",
			mutate: func(tpl *aggv1.CoderTemplate) { tpl.Name = "acme.other" },
			want:   []string{"FieldValueInvalid metadata.name"},
			detail: "must match the name in the URL (acme.docker)",
		},
		{
			name:   "organization changed",
			mutate: func(tpl *aggv1.CoderTemplate) { tpl.Spec.Organization = "other" },
			want:   []string{"FieldValueForbidden spec.organization"},
			detail: "cannot move to another organization",
		},
		{
			name:   "version not a UUID",
			mutate: func(tpl *aggv1.CoderTemplate) { tpl.Spec.VersionID = "v4" },
			want:   []string{"FieldValueInvalid spec.versionID"},
			detail: "UUID",
		},
		{
			name: "version and files both changed",
			mutate: func(tpl *aggv1.CoderTemplate) {
				tpl.Spec.VersionID, tpl.Spec.Files = fxOtherVersionID.String(), map[string]string{"main.tf": "v2"}
			},
			want:   []string{"FieldValueForbidden spec.versionID"},
			detail: "not both",
		},
		{
			name: "everything wrong",
			mutate: func(tpl *aggv1.CoderTemplate) {
				tpl.Name = "acme.other"
				tpl.Spec.Organization = "other"
				tpl.Spec.VersionID = "v4"
			},
			want: []string{
				"FieldValueInvalid metadata.name",
				"FieldValueForbidden spec.organization",
				"FieldValueInvalid spec.versionID",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := cur.DeepCopy()
			tc.mutate(next)
			errs := validateTemplateUpdate(next, cur, "acme.docker")
			if got := fxErrs(errs); !fxSameStrings(got, tc.want) {
				t.Fatalf("errors = %q, want %q (%v)", got, tc.want, errs)
			}
			if tc.detail != "" && !strings.Contains(errs[0].Detail, tc.detail) {
				t.Errorf("detail %q does not contain %q", errs[0].Detail, tc.detail)
			}
		})
	}
}

func TestTemplateValidateCreate(t *testing.T) {
	_, s := fxStorages(t)
	files := map[string]string{"main.tf": "terraform {}\n"}
	for _, tc := range []struct {
		name string
		tpl  aggv1.CoderTemplate
		want []string
	}{
		{name: "files", tpl: aggv1.CoderTemplate{ObjectMeta: metav1.ObjectMeta{Name: "acme.docker"}, Spec: aggv1.CoderTemplateSpec{Files: files}}},
		{name: "version", tpl: aggv1.CoderTemplate{ObjectMeta: metav1.ObjectMeta{Name: "prod.acme.my-tpl"}, Spec: aggv1.CoderTemplateSpec{Organization: "acme", VersionID: fxVersionID.String()}}},
		{name: "underscore in a new template's name", tpl: aggv1.CoderTemplate{ObjectMeta: metav1.ObjectMeta{Name: "acme.my_tpl"}, Spec: aggv1.CoderTemplateSpec{VersionID: fxVersionID.String()}},
			want: []string{"FieldValueInvalid metadata.name"}},
		{
			name: "generateName",
			tpl:  aggv1.CoderTemplate{ObjectMeta: metav1.ObjectMeta{GenerateName: "acme.t-"}, Spec: aggv1.CoderTemplateSpec{Files: files}},
			want: []string{"FieldValueForbidden metadata.generateName"},
		},
		{
			name: "malformed name",
			tpl:  aggv1.CoderTemplate{ObjectMeta: metav1.ObjectMeta{Name: "docker"}, Spec: aggv1.CoderTemplateSpec{Files: files}},
			want: []string{"FieldValueInvalid metadata.name"},
		},
		{
			name: "organization differs",
			tpl:  aggv1.CoderTemplate{ObjectMeta: metav1.ObjectMeta{Name: "acme.docker"}, Spec: aggv1.CoderTemplateSpec{Organization: "x", Files: files}},
			want: []string{"FieldValueInvalid spec.organization"},
		},
		{
			name: "files and version",
			tpl:  aggv1.CoderTemplate{ObjectMeta: metav1.ObjectMeta{Name: "acme.docker"}, Spec: aggv1.CoderTemplateSpec{VersionID: fxVersionID.String(), Files: files}},
			want: []string{"FieldValueForbidden spec.versionID"},
		},
		{
			name: "version not a UUID",
			tpl:  aggv1.CoderTemplate{ObjectMeta: metav1.ObjectMeta{Name: "acme.docker"}, Spec: aggv1.CoderTemplateSpec{VersionID: "v1"}},
			want: []string{"FieldValueInvalid spec.versionID"},
		},
		{
			name: "neither files nor version",
			tpl:  aggv1.CoderTemplate{ObjectMeta: metav1.ObjectMeta{Name: "acme.docker"}},
			want: []string{"FieldValueRequired spec.files"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, errs := s.validateCreate(&tc.tpl)
			if got := fxErrs(errs); !fxSameStrings(got, tc.want) {
				t.Fatalf("errors = %q, want %q (%v)", got, tc.want, errs)
			}
		})
	}
}

// Sanity check of the helper the tests above compare with.
func TestFxErrs(t *testing.T) {
	got := fxErrs(field.ErrorList{field.Required(field.NewPath("spec", "b"), ""), field.Invalid(field.NewPath("spec", "a"), 1, "")})
	if want := []string{"FieldValueInvalid spec.a", "FieldValueRequired spec.b"}; !fxSameStrings(got, want) {
		t.Fatalf("fxErrs = %q", got)
	}
}

// TestCheckInNameOrder: sets coderd keeps no order for are accepted only
// in the order reads show them, with the order to use in the message.
func TestCheckInNameOrder(t *testing.T) {
	p := field.NewPath("spec", "roles")
	for _, ok := range [][]string{nil, {}, {"a"}, {"auditor", "template-admin"}} {
		if err := checkInNameOrder(p, ok); err != nil {
			t.Errorf("%v: %v, want accepted", ok, err)
		}
	}
	err := checkInNameOrder(p, []string{"user-admin", "template-admin"})
	if err == nil {
		t.Fatal("[user-admin template-admin] accepted, want refused")
	}
	if want := `spec.roles: Invalid value: ["user-admin","template-admin"]: list them in name order (template-admin, user-admin): Coder keeps no order, so reads show them sorted`; err.Error() != want {
		t.Errorf("error %q, want %q", err.Error(), want)
	}
}
