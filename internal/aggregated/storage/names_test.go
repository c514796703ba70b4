package storage

import (
	"strings"
	"testing"
)

func TestParseWorkspaceNameRoundTrip(t *testing.T) {
	long := strings.Repeat("a", maxCoderName)
	cp63 := "c" + strings.Repeat("p", 61) + "1"
	for _, tc := range []struct {
		in       string
		want     workspaceName
		prefixed bool
	}{
		{in: "acme.alice.dev", want: workspaceName{Org: "acme", Owner: "alice", Name: "dev"}},
		{in: "Acme.Alice.My-WS-2", want: workspaceName{Org: "Acme", Owner: "Alice", Name: "My-WS-2"}},
		{in: "1.2.3", want: workspaceName{Org: "1", Owner: "2", Name: "3"}},
		{in: long + "." + long + "." + long, want: workspaceName{Org: long, Owner: long, Name: long}},
		{in: "prod.acme.alice.dev", want: workspaceName{ControlPlane: "prod", Org: "acme", Owner: "alice", Name: "dev"}, prefixed: true},
		{in: "a.acme.alice.dev", want: workspaceName{ControlPlane: "a", Org: "acme", Owner: "alice", Name: "dev"}, prefixed: true},
		{in: "eu-west-1.acme.alice.dev", want: workspaceName{ControlPlane: "eu-west-1", Org: "acme", Owner: "alice", Name: "dev"}, prefixed: true},
		{in: cp63 + ".acme.alice.dev", want: workspaceName{ControlPlane: cp63, Org: "acme", Owner: "alice", Name: "dev"}, prefixed: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseWorkspaceName(tc.in)
			if err != nil {
				t.Fatalf("parseWorkspaceName(%q): %v", tc.in, err)
			}
			if got != tc.want {
				t.Fatalf("parseWorkspaceName(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
			if s := got.String(tc.prefixed); s != tc.in {
				t.Fatalf("String(%v) = %q, want %q", tc.prefixed, s, tc.in)
			}
			unprefixed := tc.want.Org + "." + tc.want.Owner + "." + tc.want.Name
			if s := got.String(false); s != unprefixed {
				t.Fatalf("String(false) = %q, want %q", s, unprefixed)
			}
			// And back: String's output parses to the same name.
			again, err := parseWorkspaceName(got.String(tc.prefixed))
			if err != nil || again != got {
				t.Fatalf("parse(String()) = %+v, %v; want %+v", again, err, got)
			}
		})
	}
}

func TestParseWorkspaceNameRejects(t *testing.T) {
	const format = "<organization>.<owner>.<workspace>, or <control plane>.<organization>.<owner>.<workspace>"
	long := strings.Repeat("a", maxCoderName+1)
	for _, tc := range []struct {
		name, in string
		// wantErr are substrings of the error message.
		wantErr []string
	}{
		{"empty", "", []string{format, `"" has 1 parts`}},
		{"one part", "dev", []string{format, "has 1 parts"}},
		{"two parts", "alice.dev", []string{format, "has 2 parts"}},
		{"five parts", "x.prod.acme.alice.dev", []string{format, "has 5 parts"}},
		{"empty organization", ".alice.dev", []string{"the organization part of the name is empty"}},
		{"empty owner", "acme..dev", []string{"the owner part of the name is empty"}},
		{"empty workspace", "acme.alice.", []string{"the workspace part of the name is empty"}},
		{"empty owner, prefixed", "prod.acme..dev", []string{"the owner part of the name is empty"}},
		{"underscore in workspace", "acme.alice.my_ws", []string{`workspace name "my_ws" is not a valid Coder name`, "letters, digits and single hyphens"}},
		{"underscore in owner", "acme.al_ice.dev", []string{`owner name "al_ice"`}},
		{"underscore in organization", "ac_me.alice.dev", []string{`organization name "ac_me"`}},
		{"leading hyphen", "acme.alice.-dev", []string{`workspace name "-dev"`}},
		{"trailing hyphen", "acme.alice.dev-", []string{`workspace name "dev-"`}},
		{"double hyphen", "acme.alice.d--v", []string{`workspace name "d--v"`}},
		{"space", "acme.al ice.dev", []string{`owner name "al ice"`}},
		{"slash", "acme.alice.d/v", []string{`workspace name "d/v"`}},
		{"non-ASCII", "acme.alice.dév", []string{`workspace name "dév"`}},
		{"workspace too long", "acme.alice." + long, []string{"workspace name", "at most 32 characters"}},
		{"owner too long", "acme." + long + ".dev", []string{"owner name", "at most 32 characters"}},
		{"organization too long", long + ".alice.dev", []string{"organization name", "at most 32 characters"}},
		{"uppercase control plane", "Prod.acme.alice.dev", []string{`control plane "Prod" is not a valid CoderControlPlane name`}},
		{"control plane starting with a digit", "1prod.acme.alice.dev", []string{`control plane "1prod"`}},
		{"control plane ending with a hyphen", "prod-.acme.alice.dev", []string{`control plane "prod-"`}},
		{"control plane with underscore", "pr_od.acme.alice.dev", []string{`control plane "pr_od"`}},
		{"control plane too long", "c" + strings.Repeat("p", 63) + ".acme.alice.dev", []string{"is not a valid CoderControlPlane name"}},
		{"empty control plane", ".acme.alice.dev", []string{`control plane ""`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseWorkspaceName(tc.in)
			if err == nil {
				t.Fatalf("parseWorkspaceName(%q) = %+v, want an error", tc.in, got)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("parseWorkspaceName(%q) error %q does not contain %q", tc.in, err, want)
				}
			}
		})
	}
}

func TestParseTemplateNameRoundTrip(t *testing.T) {
	long := strings.Repeat("t", maxTplName)
	for _, tc := range []struct {
		in       string
		want     templateObjectName
		prefixed bool
	}{
		{in: "acme.docker", want: templateObjectName{Org: "acme", Name: "docker"}},
		{in: "acme.my_template", want: templateObjectName{Org: "acme", Name: "my_template"}},
		{in: "acme.a-b_c-d", want: templateObjectName{Org: "acme", Name: "a-b_c-d"}},
		{in: "Acme.Docker", want: templateObjectName{Org: "Acme", Name: "Docker"}},
		{in: "acme." + long, want: templateObjectName{Org: "acme", Name: long}},
		{in: "prod.acme.docker", want: templateObjectName{ControlPlane: "prod", Org: "acme", Name: "docker"}, prefixed: true},
		{in: "prod.acme.my_template", want: templateObjectName{ControlPlane: "prod", Org: "acme", Name: "my_template"}, prefixed: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseTemplateName(tc.in)
			if err != nil {
				t.Fatalf("parseTemplateName(%q): %v", tc.in, err)
			}
			if got != tc.want {
				t.Fatalf("parseTemplateName(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
			if s := got.String(tc.prefixed); s != tc.in {
				t.Fatalf("String(%v) = %q, want %q", tc.prefixed, s, tc.in)
			}
			if s, want := got.String(false), tc.want.Org+"."+tc.want.Name; s != want {
				t.Fatalf("String(false) = %q, want %q", s, want)
			}
			again, err := parseTemplateName(got.String(tc.prefixed))
			if err != nil || again != got {
				t.Fatalf("parse(String()) = %+v, %v; want %+v", again, err, got)
			}
		})
	}
}

func TestParseTemplateNameRejects(t *testing.T) {
	const format = "<organization>.<template>, or <control plane>.<organization>.<template>"
	for _, tc := range []struct {
		name, in string
		wantErr  []string
	}{
		{"empty", "", []string{format, "has 1 parts"}},
		{"one part", "docker", []string{format, "has 1 parts"}},
		{"four parts", "prod.acme.alice.docker", []string{format, "has 4 parts"}},
		{"empty organization", ".docker", []string{"the organization part of the name is empty"}},
		{"empty template", "acme.", []string{"the template part of the name is empty"}},
		{"empty organization, prefixed", "prod..docker", []string{"the organization part of the name is empty"}},
		{"underscore in organization", "ac_me.docker", []string{`organization name "ac_me"`}},
		{"double underscore", "acme.my__tpl", []string{`template name "my__tpl"`}},
		{"underscore then hyphen", "acme.my_-tpl", []string{`template name "my_-tpl"`}},
		{"leading underscore", "acme._tpl", []string{`template name "_tpl"`}},
		{"trailing underscore", "acme.tpl_", []string{`template name "tpl_"`}},
		{"invalid character", "acme.tp+l", []string{`template name "tp+l"`}},
		{"template too long", "acme." + strings.Repeat("t", maxTplName+1), []string{"template name", "at most 32 characters"}},
		{"uppercase control plane", "PROD.acme.docker", []string{`control plane "PROD"`}},
		{"empty control plane", ".acme.docker", []string{`control plane ""`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseTemplateName(tc.in)
			if err == nil {
				t.Fatalf("parseTemplateName(%q) = %+v, want an error", tc.in, got)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("parseTemplateName(%q) error %q does not contain %q", tc.in, err, want)
				}
			}
		})
	}
}

// Template names may use underscores; workspace, owner and organization
// names may not. The same word is accepted in one place and refused in the
// other.
func TestUnderscoreOnlyInTemplateNames(t *testing.T) {
	if _, err := parseTemplateName("acme.my_tpl"); err != nil {
		t.Fatalf("template name with an underscore refused: %v", err)
	}
	if _, err := parseWorkspaceName("acme.alice.my_tpl"); err == nil {
		t.Fatal("workspace name with an underscore accepted")
	}
	if _, err := parseTemplateName("my_org.tpl"); err == nil {
		t.Fatal("organization name with an underscore accepted in a template name")
	}
}
