package coderapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
)

// UpdateTemplateMeta PATCHes template id's settings and reports whether
// coderd changed anything. coderd answers a PATCH that changes nothing
// with 304 Not Modified, which codersdk's UpdateTemplateMeta turns into a
// plain error (no status); here it is changed == false and no error, so a
// write that another writer already made is not a failure.
func UpdateTemplateMeta(ctx context.Context, c *codersdk.Client, id uuid.UUID, req codersdk.UpdateTemplateMeta) (codersdk.Template, bool, error) {
	res, err := c.Request(ctx, http.MethodPatch, fmt.Sprintf("/api/v2/templates/%s", id), req)
	if err != nil {
		return codersdk.Template{}, false, err
	}
	defer res.Body.Close()
	switch res.StatusCode {
	case http.StatusNotModified:
		return codersdk.Template{}, false, nil
	case http.StatusOK:
	default:
		return codersdk.Template{}, false, codersdk.ReadBodyAsError(res)
	}
	var updated codersdk.Template
	if err := json.NewDecoder(res.Body).Decode(&updated); err != nil {
		return codersdk.Template{}, false, fmt.Errorf("decode the updated template: %w", err)
	}
	return updated, true, nil
}

// TemplateMeta is a PATCH of template t that changes nothing: its
// current settings. coderd's PATCH replaces the settings a request leaves
// at their zero value, so every change starts from this.
func TemplateMeta(t *codersdk.Template) codersdk.UpdateTemplateMeta {
	return codersdk.UpdateTemplateMeta{
		Name:                           t.Name,
		DisplayName:                    &t.DisplayName,
		Description:                    &t.Description,
		Icon:                           &t.Icon,
		DefaultTTLMillis:               t.DefaultTTLMillis,
		ActivityBumpMillis:             t.ActivityBumpMillis,
		AutostopRequirement:            &t.AutostopRequirement,
		AutostartRequirement:           &t.AutostartRequirement,
		AllowUserAutostart:             t.AllowUserAutostart,
		AllowUserAutostop:              t.AllowUserAutostop,
		AllowUserCancelWorkspaceJobs:   t.AllowUserCancelWorkspaceJobs,
		FailureTTLMillis:               t.FailureTTLMillis,
		TimeTilDormantMillis:           t.TimeTilDormantMillis,
		TimeTilDormantAutoDeleteMillis: t.TimeTilDormantAutoDeleteMillis,
		RequireActiveVersion:           t.RequireActiveVersion,
		DeprecationMessage:             &t.DeprecationMessage,
		MaxPortShareLevel:              &t.MaxPortShareLevel,
		CORSBehavior:                   &t.CORSBehavior,
		UseClassicParameterFlow:        &t.UseClassicParameterFlow,
	}
}
