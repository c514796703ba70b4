package coderapi_test

import (
	"net/http"
	"testing"

	"github.com/coder/coder/v2/codersdk"

	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/testenv"
)

// TestUpdateTemplateMetaUnchanged PATCHes a template on the real coderd
// with the settings it already has (TemplateMeta): coderd answers 304, which codersdk's
// own call reports as an error without a status (a write that another
// writer already made would fail as a 500), and coderapi's as unchanged.
// A real change is reported changed, with the updated template.
func TestUpdateTemplateMetaUnchanged(t *testing.T) {
	c := testenv.NewCoder(t, testenv.CoderOptions{ProvisionerTypes: []codersdk.ProvisionerType{codersdk.ProvisionerTypeEcho}})
	ctx := t.Context()
	tpl, err := c.PushEchoTemplate(ctx, "meta")
	if err != nil {
		t.Fatal(err)
	}
	same := coderapi.TemplateMeta(&tpl)

	_, sdkErr := c.Client.UpdateTemplateMeta(ctx, tpl.ID, same)
	if sdkErr == nil || coderapi.StatusCode(sdkErr) != 0 {
		t.Fatalf("codersdk's PATCH without a change: %v (status %d), want its plain not-modified error: coderd no longer answers 304", sdkErr, coderapi.StatusCode(sdkErr))
	}
	if _, changed, err := coderapi.UpdateTemplateMeta(ctx, c.Client, tpl.ID, same); err != nil || changed {
		t.Errorf("PATCH without a change: changed %v, %v; want unchanged and no error", changed, err)
	}

	name := "Meta, renamed"
	rename := coderapi.TemplateMeta(&tpl)
	rename.DisplayName = &name
	got, changed, err := coderapi.UpdateTemplateMeta(ctx, c.Client, tpl.ID, rename)
	if err != nil || !changed || got.DisplayName != name || got.ID != tpl.ID {
		t.Errorf("PATCH of the display name: %q (template %s), changed %v, %v; want %q of %s, changed", got.DisplayName, got.ID, changed, err, name, tpl.ID)
	}

	invalid := coderapi.TemplateMeta(&tpl)
	invalid.Name = "Not A Valid Name!"
	_, _, err = coderapi.UpdateTemplateMeta(ctx, c.Client, tpl.ID, invalid)
	if coderapi.StatusCode(err) != http.StatusBadRequest {
		t.Errorf("PATCH with an invalid name: %v, want coderd's 400", err)
	}
}
