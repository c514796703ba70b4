package storage

import (
	"context"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/coder/coder-k8s/internal/aggregated/backend"
)

// Fixtures for the pure-logic tests of this package: plain codersdk values
// as coderd would return them, and targets without clients. Nothing here
// talks to coderd. Identifiers start with fx so they do not collide with
// other test files of the package.

var (
	fxWorkspaceID       = uuid.MustParse("11111111-1111-4111-8111-111111111111")
	fxBuildID           = uuid.MustParse("22222222-2222-4222-8222-222222222222")
	fxVersionID         = uuid.MustParse("33333333-3333-4333-8333-333333333333")
	fxTemplateID        = uuid.MustParse("44444444-4444-4444-8444-444444444444")
	fxOtherVersionID    = uuid.MustParse("55555555-5555-4555-8555-555555555555")
	fxOrgID             = uuid.MustParse("66666666-6666-4666-8666-666666666666")
	fxCreated           = time.Date(2025, 3, 4, 5, 6, 7, 890_123_456, time.UTC)
	fxBuildQueued       = fxCreated.Add(time.Hour + 456*time.Millisecond)
	fxBuildCompleted    = fxBuildQueued.Add(95*time.Second + 999*time.Millisecond)
	fxLastUsed          = fxCreated.Add(2*time.Hour + 1*time.Millisecond)
	fxDeadline          = fxBuildCompleted.Add(8*time.Hour + 700*time.Millisecond)
	fxTemplateUpdated   = fxCreated.Add(30*time.Minute + 250*time.Millisecond)
	fxVersionCreated    = fxCreated.Add(10*time.Minute + 10*time.Millisecond)
	fxVersionCompleted  = fxVersionCreated.Add(42*time.Second + 420*time.Millisecond)
	fxAutostartSchedule = "CRON_TZ=Europe/Berlin 30 9 * * 1-5"
)

func fxPtr[T any](v T) *T { return &v }

func fxURL(t testing.TB, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("parse %q: %v", raw, err)
	}
	return u
}

// fxTarget is a backend of namespace team-a. controlPlane "" is the static
// backend.
func fxTarget(t testing.TB, controlPlane string, prefixed bool) target {
	return target{
		Backend: backend.Backend{
			Namespace:    "team-a",
			ControlPlane: controlPlane,
			URL:          fxURL(t, "https://coder.example.com"),
		},
		prefixed: prefixed,
	}
}

// fxWorkspace is a running workspace whose start build succeeded. Every
// time has sub-second digits, so truncation is visible.
func fxWorkspace() *codersdk.Workspace {
	completed := fxBuildCompleted
	return &codersdk.Workspace{
		ID:                  fxWorkspaceID,
		CreatedAt:           fxCreated,
		UpdatedAt:           fxCreated.Add(time.Minute),
		OwnerName:           "alice",
		OrganizationName:    "acme",
		TemplateID:          fxTemplateID,
		TemplateName:        "docker",
		TemplateDisplayName: "Docker",
		Name:                "dev",
		Outdated:            true,
		TTLMillis:           fxPtr(int64(8 * time.Hour / time.Millisecond)),
		AutostartSchedule:   fxPtr(fxAutostartSchedule),
		LastUsedAt:          fxLastUsed,
		Health:              codersdk.WorkspaceHealth{Healthy: true},
		LatestBuild: codersdk.WorkspaceBuild{
			ID:                  fxBuildID,
			CreatedAt:           fxBuildQueued,
			WorkspaceID:         fxWorkspaceID,
			TemplateVersionID:   fxVersionID,
			TemplateVersionName: "v1",
			BuildNumber:         3,
			Transition:          codersdk.WorkspaceTransitionStart,
			InitiatorUsername:   "bob",
			Job: codersdk.ProvisionerJob{
				Status:      codersdk.ProvisionerJobSucceeded,
				CompletedAt: &completed,
			},
			Deadline: codersdk.NewNullTime(fxDeadline, true),
			Status:   codersdk.WorkspaceStatusRunning,
		},
	}
}

// fxTemplate is a template of organization acme whose active version is
// fxVersion, with settings as an open-source coderd shows them.
func fxTemplate() *codersdk.Template {
	return &codersdk.Template{
		ID:                 fxTemplateID,
		CreatedAt:          fxCreated,
		UpdatedAt:          fxTemplateUpdated,
		OrganizationID:     fxOrgID,
		OrganizationName:   "acme",
		Name:               "docker",
		DisplayName:        "Docker",
		Description:        "Docker containers",
		Icon:               "/icon/docker.png",
		ActiveVersionID:    fxVersionID,
		ActiveUserCount:    7,
		Deprecated:         true,
		DeprecationMessage: "use docker-v2",

		DefaultTTLMillis:     (8 * time.Hour).Milliseconds(),
		ActivityBumpMillis:   (90 * time.Minute).Milliseconds(),
		AutostopRequirement:  codersdk.TemplateAutostopRequirement{DaysOfWeek: []string{}, Weeks: 1},
		AutostartRequirement: codersdk.TemplateAutostartRequirement{DaysOfWeek: codersdk.AllDaysOfWeek},
		AllowUserAutostart:   true,
		AllowUserAutostop:    true,
		CORSBehavior:         codersdk.CORSBehaviorSimple,
		MaxPortShareLevel:    codersdk.WorkspaceAgentPortShareLevelPublic,
	}
}

// fxVersion is a template version whose build succeeded.
func fxVersion() *codersdk.TemplateVersion {
	completed := fxVersionCompleted
	return &codersdk.TemplateVersion{
		ID:         fxVersionID,
		TemplateID: fxPtr(fxTemplateID),
		CreatedAt:  fxVersionCreated,
		Name:       "v3",
		Job: codersdk.ProvisionerJob{
			Status:      codersdk.ProvisionerJobSucceeded,
			CompletedAt: &completed,
		},
	}
}

// fxProvider is a backend.Provider answering from a fixed list; its
// backends have no client, so only code that does not call coderd may use
// it.
type fxProvider struct {
	backends []backend.Backend
	err      error
}

func (p fxProvider) Backends(_ context.Context, namespace string) ([]backend.Backend, error) {
	if p.err != nil {
		return nil, p.err
	}
	var out []backend.Backend
	for _, b := range p.backends {
		if namespace == "" || b.Namespace == namespace {
			out = append(out, b)
		}
	}
	return out, nil
}

func (p fxProvider) Ready() error { return nil }

// fxErrs renders a field.ErrorList as "<type> <field>" lines, sorted, for
// comparison with the expected errors.
func fxErrs(errs field.ErrorList) []string {
	out := make([]string, 0, len(errs))
	for _, e := range errs {
		out = append(out, string(e.Type)+" "+e.Field)
	}
	sort.Strings(out)
	return out
}

func fxSameStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	sa := append([]string(nil), a...)
	sb := append([]string(nil), b...)
	sort.Strings(sa)
	sort.Strings(sb)
	return strings.Join(sa, "\n") == strings.Join(sb, "\n")
}

// fxStorages constructs both storages without backends: fine for code
// that never asks for one (table conversion, selectors, validation).
func fxStorages(t testing.TB) (*WorkspaceStorage, *TemplateStorage) {
	t.Helper()
	ws, err := NewWorkspaces(Options{PollInterval: time.Second})
	if err != nil {
		t.Fatalf("NewWorkspaces: %v", err)
	}
	ts, err := NewTemplates(Options{PollInterval: time.Second}, TemplateOptions{})
	if err != nil {
		t.Fatalf("NewTemplates: %v", err)
	}
	return ws, ts
}
