package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"

	"github.com/coder/coder-k8s/internal/coderapi"
)

// TestTemplateSettings drives a CoderTemplate's settings with kubectl
// apply --server-side through kube-apiserver against the real open-source
// coderd: the settings it honours are written, read back as written and
// show changes made in Coder; those that need a license are refused
// naming the feature, unless they keep Coder's value. Through a contract
// fake of a licensed coderd in front of the same coderd (licensedCoderd),
// the licensed ones are written and read back.
func TestTemplateSettings(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := context.Background()
	manifest := func(name, settings string) string { return templateManifest(t, s.ns, name, settings, mainTF) }
	const shown = `jsonpath={.spec.defaultTTL} {.spec.activityBump} {.spec.allowUserCancelWorkspaceJobs} {.spec.corsBehavior} {.spec.useClassicParameterFlow}`
	get := func(t *testing.T) string {
		return strings.TrimSpace(s.must(t, "get", "ctpl", "coder.settings", "-n", s.ns, "-o", shown))
	}
	generation := func(t *testing.T) string {
		return strings.TrimSpace(s.must(t, "get", "ctpl", "coder.settings", "-n", s.ns, "-o", "jsonpath={.metadata.generation}/{.status.observedGeneration}"))
	}
	// What coderd has, in the same order.
	inCoder := func(t *testing.T) string {
		tpl := s.coderTemplate(t, "settings")
		return fmt.Sprintf("%s %s %v %s %v", time.Duration(tpl.DefaultTTLMillis)*time.Millisecond, time.Duration(tpl.ActivityBumpMillis)*time.Millisecond,
			tpl.AllowUserCancelWorkspaceJobs, tpl.CORSBehavior, tpl.UseClassicParameterFlow)
	}

	first := "defaultTTL: 8h\nactivityBump: 90m\nallowUserCancelWorkspaceJobs: true\ncorsBehavior: passthru\nuseClassicParameterFlow: true"
	second := "defaultTTL: 2h30m\nactivityBump: 0s\nallowUserCancelWorkspaceJobs: false\ncorsBehavior: simple\nuseClassicParameterFlow: false"

	t.Run("created with every unlicensed setting, read back as written", func(t *testing.T) {
		m := manifest("settings", first)
		s.must(t, "apply", "--server-side", "-f", m)
		if got, want := get(t), "8h 90m true passthru true"; got != want {
			t.Errorf("kubectl get shows %q, want %q (as applied)", got, want)
		}
		if got, want := inCoder(t), "8h0m0s 1h30m0s true passthru true"; got != want {
			t.Errorf("coderd has %q, want %q", got, want)
		}
		// A list shows them as written too.
		list := s.must(t, "get", "ctpl", "-n", s.ns, "-o", `jsonpath={.items[?(@.metadata.name=="coder.settings")].spec.defaultTTL}`)
		if strings.TrimSpace(list) != "8h" {
			t.Errorf("kubectl get (list) shows defaultTTL %q, want 8h", list)
		}
		if out, err := s.run("diff", "--server-side", "-f", m); err != nil {
			t.Errorf("kubectl diff --server-side right after the apply shows a difference: %v\n%s", err, out)
		}
		// The spelling is part of the spec the record counts: polls
		// count no change made in Coder.
		gen := generation(t)
		time.Sleep(3 * s.watchPollInterval())
		if got := generation(t); got != gen {
			t.Errorf("generation moved from %s to %s without a change", gen, got)
		}
	})

	t.Run("the same value spelled otherwise changes only the record", func(t *testing.T) {
		before := s.coderTemplate(t, "settings")
		gen := generation(t)
		s.must(t, "apply", "--server-side", "-f", manifest("settings", strings.Replace(first, "defaultTTL: 8h", "defaultTTL: 480m", 1)))
		if got, want := get(t), "480m 90m true passthru true"; got != want {
			t.Errorf("kubectl get shows %q, want %q", got, want)
		}
		if after := s.coderTemplate(t, "settings"); !after.UpdatedAt.Equal(before.UpdatedAt) {
			t.Errorf("a new spelling of the same value changed the template in Coder (updated_at %s → %s)", before.UpdatedAt, after.UpdatedAt)
		}
		if got := generation(t); got == gen {
			t.Errorf("generation stayed %s after a spec change", got)
		}
	})

	t.Run("changed with apply, read back as written", func(t *testing.T) {
		s.must(t, "apply", "--server-side", "-f", manifest("settings", second))
		if got, want := get(t), "2h30m 0s false simple false"; got != want {
			t.Errorf("kubectl get shows %q, want %q", got, want)
		}
		if got, want := inCoder(t), "2h30m0s 0s false simple false"; got != want {
			t.Errorf("coderd has %q, want %q", got, want)
		}
	})

	t.Run("a change made in Coder shows as drift; applying again heals it", func(t *testing.T) {
		tpl := s.coderTemplate(t, "settings")
		req := coderapi.TemplateMeta(&tpl)
		req.DefaultTTLMillis = (4 * time.Hour).Milliseconds()
		req.CORSBehavior = new(codersdk.CORSBehaviorPassthru)
		if _, err := s.coder.Client.UpdateTemplateMeta(ctx, tpl.ID, req); err != nil {
			t.Fatalf("coderd: update template meta: %v", err)
		}
		if got, want := get(t), "4h0m0s 0s false passthru false"; got != want {
			t.Errorf("after the change in Coder kubectl get shows %q, want %q", got, want)
		}
		m := manifest("settings", second)
		out, err := s.run("diff", "--server-side", "-f", m)
		if err == nil || !strings.Contains(out, "defaultTTL: 4h0m0s") || !strings.Contains(out, "corsBehavior: passthru") {
			t.Errorf("kubectl diff --server-side after the change in Coder: %v, want the drift of defaultTTL and corsBehavior:\n%s", err, out)
		}
		s.must(t, "apply", "--server-side", "-f", m)
		if got, want := get(t), "2h30m 0s false simple false"; got != want {
			t.Errorf("after applying again kubectl get shows %q, want %q", got, want)
		}
		if got, want := inCoder(t), "2h30m0s 0s false simple false"; got != want {
			t.Errorf("after applying again coderd has %q, want %q", got, want)
		}
	})

	t.Run("a field dropped from the apply keeps Coder's value", func(t *testing.T) {
		s.must(t, "apply", "--server-side", "-f", manifest("settings", "activityBump: 0s\nallowUserCancelWorkspaceJobs: false\ncorsBehavior: simple\nuseClassicParameterFlow: false"))
		if got, want := get(t), "2h30m 0s false simple false"; got != want {
			t.Errorf("after dropping defaultTTL kubectl get shows %q, want %q", got, want)
		}
		if got := s.coderTemplate(t, "settings").DefaultTTLMillis; got != (150 * time.Minute).Milliseconds() {
			t.Errorf("after dropping defaultTTL coderd has %d ms, want 2h30m", got)
		}
	})

	licensed := []struct{ yaml, path, feature string }{
		{"autostopRequirement: {daysOfWeek: [saturday], weeks: 1}", "spec.autostopRequirement", "advanced_template_scheduling"},
		{"autostartRequirement: {daysOfWeek: [monday, tuesday]}", "spec.autostartRequirement", "advanced_template_scheduling"},
		{"allowUserAutostart: false", "spec.allowUserAutostart", "advanced_template_scheduling"},
		{"allowUserAutostop: false", "spec.allowUserAutostop", "advanced_template_scheduling"},
		{"failureTTL: 1h", "spec.failureTTL", "advanced_template_scheduling"},
		{"timeTilDormant: 24h", "spec.timeTilDormant", "advanced_template_scheduling"},
		{"timeTilDormantAutoDelete: 168h", "spec.timeTilDormantAutoDelete", "advanced_template_scheduling"},
		{"requireActiveVersion: true", "spec.requireActiveVersion", "access_control"},
		{"deprecationMessage: use another template", "spec.deprecationMessage", "access_control"},
		{"maxPortShareLevel: owner", "spec.maxPortShareLevel", "control_shared_ports"},
	}
	t.Run("a licensed setting that changes Coder's value is refused, dry run too, and nothing changes", func(t *testing.T) {
		before := s.coderTemplate(t, "settings")
		for _, l := range licensed {
			m := manifest("settings", second+"\n"+l.yaml)
			want := fmt.Sprintf("%s: Forbidden: needs Coder's %q feature, which this coderd does not have (open-source build)", l.path, l.feature)
			for _, args := range [][]string{{"apply", "--server-side", "-f", m}, {"apply", "--server-side", "--dry-run=server", "-f", m}} {
				out, err := s.run(args...)
				if err == nil || !strings.Contains(out, want) || !strings.Contains(out, "is invalid") {
					t.Errorf("kubectl %s with %s: %v\n%s\nwant a 422 saying %q", strings.Join(args[:len(args)-2], " "), l.yaml, err, out, want)
				}
			}
		}
		if after := s.coderTemplate(t, "settings"); !reflect.DeepEqual(settingsOf(after), settingsOf(before)) || !after.UpdatedAt.Equal(before.UpdatedAt) {
			t.Errorf("refused applies changed the template in Coder:\nbefore %+v\nafter  %+v", settingsOf(before), settingsOf(after))
		}
		// On create as well: no template is made.
		out, err := s.run("apply", "--server-side", "-f", manifest("refused", "failureTTL: 1h"))
		if err == nil || !strings.Contains(out, `spec.failureTTL: Forbidden: needs Coder's "advanced_template_scheduling" feature`) {
			t.Errorf("creating a template with failureTTL: %v\n%s", err, out)
		}
		if _, err := s.coder.Client.TemplateByName(ctx, s.coder.OrganizationID, "refused"); !coderapi.IsNotFound(err) {
			t.Errorf("after the refused create, Coder's template refused: %v, want 404", err)
		}
	})

	t.Run("licensed settings that keep Coder's value are accepted", func(t *testing.T) {
		same := "autostopRequirement: {weeks: 1}\nautostartRequirement: {daysOfWeek: [monday, tuesday, wednesday, thursday, friday, saturday, sunday]}\n" +
			"allowUserAutostart: true\nallowUserAutostop: true\nfailureTTL: 0s\ntimeTilDormant: 0s\ntimeTilDormantAutoDelete: 0s\n" +
			"requireActiveVersion: false\ndeprecationMessage: \"\"\nmaxPortShareLevel: public"
		m := manifest("settings", second+"\n"+same)
		s.must(t, "apply", "--server-side", "-f", m)
		if out, err := s.run("diff", "--server-side", "-f", m); err != nil {
			t.Errorf("kubectl diff --server-side after applying Coder's values shows a difference: %v\n%s", err, out)
		}
		// And on create, where they are coderd's defaults; a dry run shows
		// the defaults of those left unset as the create does.
		dry := s.must(t, "create", "--dry-run=server", "-f", manifest("defaults", "defaultTTL: 8h"), "-o",
			`jsonpath={.spec.defaultTTL} {.spec.activityBump} {.spec.maxPortShareLevel} {.spec.allowUserAutostart}`)
		if want := "8h 1h0m0s public true"; strings.TrimSpace(dry) != want {
			t.Errorf("kubectl create --dry-run=server shows %q, want %q", dry, want)
		}
		s.must(t, "apply", "--server-side", "-f", manifest("defaults", same))
		got := s.must(t, "get", "ctpl", "coder.defaults", "-n", s.ns, "-o", `jsonpath={.spec.maxPortShareLevel} {.spec.requireActiveVersion} {.spec.activityBump}`)
		if want := "public false 1h0m0s"; strings.TrimSpace(got) != want {
			t.Errorf("a template created with the default licensed settings shows %q, want %q", got, want)
		}
	})

	t.Run("with a licensed coderd (contract fake) licensed settings are written and read back as written", func(t *testing.T) {
		fake := newLicensedCoderd(t, s.coder.URL.String())
		adoptControlPlane(t, s, "licensed", "coder", fake.url)
		licensedManifest := func(settings string) string { return templateManifest(t, "licensed", "licensed", settings, mainTF) }
		get := func(t *testing.T) string {
			return strings.TrimSpace(s.must(t, "get", "ctpl", "coder.licensed", "-n", "licensed", "-o",
				`jsonpath={.spec.failureTTL} {.spec.timeTilDormant} {.spec.timeTilDormantAutoDelete} {.spec.autostopRequirement.daysOfWeek[*]}/{.spec.autostopRequirement.weeks} `+
					`{.spec.autostartRequirement.daysOfWeek[*]} {.spec.allowUserAutostart} {.spec.allowUserAutostop} {.spec.requireActiveVersion} {.spec.maxPortShareLevel} {.spec.deprecationMessage}`))
		}
		all := "failureTTL: 1h\ntimeTilDormant: 24h\ntimeTilDormantAutoDelete: 168h\nautostopRequirement: {daysOfWeek: [saturday], weeks: 2}\n" +
			"autostartRequirement: {daysOfWeek: [monday, tuesday]}\nallowUserAutostart: false\nallowUserAutostop: false\n" +
			"requireActiveVersion: true\ndeprecationMessage: use another template\nmaxPortShareLevel: organization"
		m := licensedManifest(all)
		s.must(t, "apply", "--server-side", "-f", m)
		if got, want := get(t), "1h 24h 168h saturday/2 monday tuesday false false true organization use another template"; got != want {
			t.Errorf("created with every licensed setting, kubectl get shows %q, want %q", got, want)
		}
		if out, err := s.run("diff", "--server-side", "-f", m); err != nil {
			t.Errorf("kubectl diff --server-side right after the apply shows a difference: %v\n%s", err, out)
		}
		changed := strings.NewReplacer("failureTTL: 1h", "failureTTL: 2h", "maxPortShareLevel: organization", "maxPortShareLevel: public",
			"deprecationMessage: use another template", `deprecationMessage: ""`, "weeks: 2", "weeks: 3").Replace(all)
		s.must(t, "apply", "--server-side", "-f", licensedManifest(changed))
		if got, want := get(t), "2h 24h 168h saturday/3 monday tuesday false false true public"; got != want {
			t.Errorf("changed, kubectl get shows %q, want %q", got, want)
		}
		fake.mu.Lock()
		defer fake.mu.Unlock()
		if len(fake.settings) != 1 {
			t.Fatalf("the fake coderd holds the settings of %d templates, want 1", len(fake.settings))
		}
		for _, got := range fake.settings {
			if got.failureTTL != time.Hour.Milliseconds()*2 || got.autostop.Weeks != 3 || got.maxPortShareLevel != "public" || got.deprecationMessage != "" {
				t.Errorf("the fake coderd was sent %+v", got)
			}
		}
	})
}

// templateManifest writes the manifest of CoderTemplate coder.<name> in
// namespace ns: spec's fields (YAML lines) and tf as its main.tf.
func templateManifest(t *testing.T, ns, name, spec, tf string) string {
	return writeManifest(t, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderTemplate
metadata: {name: coder.%s, namespace: %s}
spec:
%s
  files:
    main.tf: |
%s`, name, ns, indent(spec, 2), indent(tf, 6)))
}

// settingsOf is a template's settings as coderd reports them.
func settingsOf(t codersdk.Template) codersdk.UpdateTemplateMeta {
	req := coderapi.TemplateMeta(&t)
	req.Name = ""
	return req
}

// licensedCoderd is a contract fake of a licensed coderd v2.30.0 in front
// of the stack's real, open-source one, for what the real stack cannot
// produce: a coderd with advanced_template_scheduling, access_control and
// control_shared_ports. It answers GET /api/v2/entitlements with those
// features enabled and keeps the licensed template settings as
// enterprise/coderd's stores do (schedule store, access control store,
// port sharer): remembered per template from each create and PATCH, and
// reported in every template it answers with. The open-source coderd
// behind it keeps its own values of those (and would refuse any
// max_port_share_level, so the fake does not pass that on); everything
// else is the real coderd's.
type licensedCoderd struct {
	url    string
	target string

	mu       sync.Mutex
	settings map[uuid.UUID]licensedSettings
	// acl, when set, adds template_rbac: the template ACL and group
	// routes (template_access_test.go).
	acl *aclCoderd
}

// licensedSettings are a template's settings that need a license.
type licensedSettings struct {
	autostop                                      codersdk.TemplateAutostopRequirement
	autostart                                     codersdk.TemplateAutostartRequirement
	allowUserAutostart, allowUserAutostop         bool
	failureTTL, timeTilDormant, timeTilAutoDelete int64
	requireActiveVersion                          bool
	deprecationMessage                            string
	maxPortShareLevel                             codersdk.WorkspaceAgentPortShareLevel
}

var (
	templateByID   = regexp.MustCompile(`^/api/v2/templates/[0-9a-f-]{36}$`)
	templateByName = regexp.MustCompile(`^/api/v2/organizations/[^/]+/templates/[^/]+$`)
	templateList   = regexp.MustCompile(`^/api/v2/(organizations/[^/]+/)?templates$`)
)

func newLicensedCoderd(t *testing.T, target string) *licensedCoderd {
	f := &licensedCoderd{target: target, settings: map[uuid.UUID]licensedSettings{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

func (f *licensedCoderd) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/api/v2/entitlements" {
		feature := codersdk.Feature{Entitlement: codersdk.EntitlementEntitled, Enabled: true}
		features := map[codersdk.FeatureName]codersdk.Feature{
			codersdk.FeatureAdvancedTemplateScheduling: feature, codersdk.FeatureAccessControl: feature, codersdk.FeatureControlSharedPorts: feature}
		if f.acl != nil {
			features[codersdk.FeatureTemplateRBAC] = feature
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(codersdk.Entitlements{HasLicense: true, Features: features})
		return
	}
	if f.acl != nil && f.acl.serve(w, r) {
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	// The licensed settings a create or PATCH stores, taken before the
	// request goes on without max_port_share_level.
	var stores *licensedSettings
	var private bool // the create's disable_everyone_group_access
	create := r.Method == http.MethodPost && templateList.MatchString(r.URL.Path)
	patch := r.Method == http.MethodPatch && templateByID.MatchString(r.URL.Path)
	switch {
	case create:
		var req codersdk.CreateTemplateRequest
		if json.Unmarshal(body, &req) == nil {
			stores = new(createdSettings(&req))
			private = req.DisableEveryoneGroupAccess
			req.MaxPortShareLevel = nil
			body, _ = json.Marshal(req)
		}
	case patch:
		var req codersdk.UpdateTemplateMeta
		if json.Unmarshal(body, &req) == nil {
			stores = new(patchedSettings(&req))
			req.MaxPortShareLevel = nil
			body, _ = json.Marshal(req)
		}
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, f.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	out.Header.Del("Accept-Encoding") // read the answer as plain JSON
	res, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer res.Body.Close()
	answer, err := io.ReadAll(res.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	ok := res.StatusCode/100 == 2
	switch {
	case stores != nil && create && ok:
		var tpl codersdk.Template
		if json.Unmarshal(answer, &tpl) == nil {
			f.remember(tpl.ID, *stores)
			if f.acl != nil {
				f.acl.created(tpl, private)
			}
		}
	case stores != nil && patch && (ok || res.StatusCode == http.StatusNotModified):
		f.remember(uuid.MustParse(path.Base(r.URL.Path)), *stores)
	}
	if ok && r.Method != http.MethodDelete && (templateByID.MatchString(r.URL.Path) || templateList.MatchString(r.URL.Path) ||
		(templateByName.MatchString(r.URL.Path) && path.Base(r.URL.Path) != "examples")) {
		answer = f.overlay(answer)
	}
	for k, v := range res.Header {
		if k != "Content-Length" {
			w.Header()[k] = v
		}
	}
	w.WriteHeader(res.StatusCode)
	_, _ = w.Write(answer)
}

func (f *licensedCoderd) remember(id uuid.UUID, s licensedSettings) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.settings[id] = s
}

// createdSettings are what postTemplateByOrganization stores with the
// enterprise stores: the request's values, or its defaults.
func createdSettings(req *codersdk.CreateTemplateRequest) licensedSettings {
	s := licensedSettings{
		autostop:           codersdk.TemplateAutostopRequirement{DaysOfWeek: []string{}, Weeks: 1},
		autostart:          codersdk.TemplateAutostartRequirement{DaysOfWeek: codersdk.AllDaysOfWeek},
		allowUserAutostart: true, allowUserAutostop: true,
		requireActiveVersion: req.RequireActiveVersion,
		maxPortShareLevel:    codersdk.WorkspaceAgentPortShareLevelOwner,
	}
	if r := req.AutostopRequirement; r != nil {
		s.autostop = codersdk.TemplateAutostopRequirement{DaysOfWeek: r.DaysOfWeek, Weeks: max(r.Weeks, 1)}
	}
	if r := req.AutostartRequirement; r != nil {
		s.autostart = *r
	}
	deref := func(dst *bool, v *bool) {
		if v != nil {
			*dst = *v
		}
	}
	deref(&s.allowUserAutostart, req.AllowUserAutostart)
	deref(&s.allowUserAutostop, req.AllowUserAutostop)
	for dst, v := range map[*int64]*int64{&s.failureTTL: req.FailureTTLMillis, &s.timeTilDormant: req.TimeTilDormantMillis, &s.timeTilAutoDelete: req.TimeTilDormantAutoDeleteMillis} {
		if v != nil {
			*dst = *v
		}
	}
	if req.MaxPortShareLevel != nil {
		s.maxPortShareLevel = *req.MaxPortShareLevel
	}
	return s
}

// patchedSettings are what patchTemplateMeta stores with the enterprise
// stores: the request's values (coder-k8s always sends them all).
func patchedSettings(req *codersdk.UpdateTemplateMeta) licensedSettings {
	s := licensedSettings{
		allowUserAutostart: req.AllowUserAutostart, allowUserAutostop: req.AllowUserAutostop,
		failureTTL: req.FailureTTLMillis, timeTilDormant: req.TimeTilDormantMillis, timeTilAutoDelete: req.TimeTilDormantAutoDeleteMillis,
		requireActiveVersion: req.RequireActiveVersion,
	}
	if r := req.AutostopRequirement; r != nil {
		s.autostop = codersdk.TemplateAutostopRequirement{DaysOfWeek: r.DaysOfWeek, Weeks: max(r.Weeks, 1)}
	}
	if r := req.AutostartRequirement; r != nil {
		s.autostart = *r
	}
	if req.DeprecationMessage != nil {
		s.deprecationMessage = *req.DeprecationMessage
	}
	if req.MaxPortShareLevel != nil {
		s.maxPortShareLevel = *req.MaxPortShareLevel
	}
	return s
}

// overlay sets the remembered licensed settings in an answer holding a
// template or a list of them.
func (f *licensedCoderd) overlay(answer []byte) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	set := func(tpl *codersdk.Template) {
		s, ok := f.settings[tpl.ID]
		if !ok {
			return
		}
		tpl.AutostopRequirement, tpl.AutostartRequirement = s.autostop, s.autostart
		tpl.AllowUserAutostart, tpl.AllowUserAutostop = s.allowUserAutostart, s.allowUserAutostop
		tpl.FailureTTLMillis, tpl.TimeTilDormantMillis, tpl.TimeTilDormantAutoDeleteMillis = s.failureTTL, s.timeTilDormant, s.timeTilAutoDelete
		tpl.RequireActiveVersion = s.requireActiveVersion
		tpl.DeprecationMessage, tpl.Deprecated = s.deprecationMessage, s.deprecationMessage != ""
		tpl.MaxPortShareLevel = s.maxPortShareLevel
	}
	var out any
	if bytes.HasPrefix(bytes.TrimSpace(answer), []byte("[")) {
		var l []codersdk.Template
		if json.Unmarshal(answer, &l) != nil {
			return answer
		}
		for i := range l {
			set(&l[i])
		}
		out = l
	} else {
		var tpl codersdk.Template
		if json.Unmarshal(answer, &tpl) != nil || tpl.ID == uuid.Nil {
			return answer
		}
		set(&tpl)
		out = tpl
	}
	data, err := json.Marshal(out)
	if err != nil {
		return answer
	}
	return data
}
