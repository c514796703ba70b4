package storage

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metainternalversionscheme "k8s.io/apimachinery/pkg/apis/meta/internalversion/scheme"
	metainternalversionvalidation "k8s.io/apimachinery/pkg/apis/meta/internalversion/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/watch"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
)

// FuzzSelector sends label and field selectors from any client through
// the path a list or watch request takes: the query parameters decoded
// into ListOptions and validated as k8s.io/apiserver does, field labels
// converted by the scheme's conversion functions
// (api/aggregation/v1alpha1/fields.go), then the storages' List and Watch
// (served from the watch cache) holding one workspace and one template
// converted from fuzzed Coder data. Selectors are only ever applied as a
// filter to converted objects; nothing of them reaches coderd.
//
// Properties, for both resources:
//   - nothing panics;
//   - a selector is either refused with a 400 (naming the unsupported
//     field when the syntax was fine), or accepted, and then every field it
//     names is one the objects have;
//   - an accepted selector selects the object in List and in Watch's
//     initial events exactly when each of its requirements holds for the
//     object's labels and fields (evaluated here independently);
//   - the selector as a client prints it back (informers re-send
//     String()) selects the same;
//   - an object is selected by its own fields, and, when it holds Coder
//     data coderd accepts, by its own labels.
//
// Seeds are in testdata/fuzz/FuzzSelector.
func FuzzSelector(f *testing.F) {
	h := newSelectorHarness(f)
	f.Fuzz(func(t *testing.T, labelSel, fieldSel, org, owner, name, tpl, controlPlane, phase string, running bool) {
		// Coder data arrives as JSON, whose decoding replaces invalid
		// UTF-8; control plane names are Kubernetes names.
		for _, s := range []*string{&org, &owner, &name, &tpl, &phase, &controlPlane} {
			*s = strings.ToValidUTF8(*s, "\uFFFD")
		}
		h.provider.backends = []backend.Backend{{Namespace: selNamespace, ControlPlane: controlPlane, URL: h.url}}
		tgt := target{Backend: h.provider.backends[0]}
		key := tgt.Key()
		w := toWorkspace(tgt, &codersdk.Workspace{
			ID: selWorkspaceID, OrganizationName: org, OwnerName: owner, Name: name, TemplateName: tpl,
			LatestBuild: codersdk.WorkspaceBuild{ID: selBuildID, Transition: selTransition(running), Status: codersdk.WorkspaceStatus(phase)},
		}, nil)
		ct := toTemplate(tgt, &codersdk.Template{ID: selTemplateID, OrganizationName: org, Name: tpl, Deprecated: running},
			&codersdk.TemplateVersion{Name: "v1", Job: codersdk.ProvisionerJob{Status: codersdk.ProvisionerJobStatus(phase)}}, nil)
		h.ws.cache.ReplaceListed(key, h.ws.cache.StartList(), []watchcache.Object{w})
		h.ts.cache.ReplaceListed(key, h.ts.cache.StartList(), []watchcache.Object{ct})
		defer h.ws.cache.Drop(key)
		defer h.ts.cache.Drop(key)

		for _, r := range []struct {
			res        *genericStore
			list       func(context.Context, *metainternalversion.ListOptions) (runtime.Object, error)
			obj        metav1.Object
			labels     map[string]string
			fields     fields.Set
			coderValid bool
		}{
			{&h.ws.genericStore, h.ws.List, w, w.Labels, aggv1.WorkspaceFields(w),
				selCoderNames(org, owner, name, tpl) && selControlPlaneValid(controlPlane)},
			{&h.ts.genericStore, h.ts.List, ct, ct.Labels, aggv1.TemplateFields(ct),
				selCoderNames(org) && templateName.MatchString(tpl) && len(tpl) <= maxTplName && selControlPlaneValid(controlPlane)},
		} {
			kind := r.res.kind
			opts, err := h.listOptions(kind, labelSel, fieldSel)
			if err != nil {
				h.checkRefusal(t, kind, labelSel, fieldSel, err)
			} else {
				for _, req := range opts.FieldSelector.Requirements() {
					if _, ok := r.fields[req.Field]; !ok {
						t.Fatalf("%s: field selector %q accepted with field %q, which the objects do not have", kind, fieldSel, req.Field)
					}
				}
				want := selMatches(opts, r.labels, r.fields)
				h.check(t, r.res, r.list, opts, r.obj.GetName(), want, "labels "+strconv.Quote(labelSel)+" fields "+strconv.Quote(fieldSel))

				// What a client prints and sends again selects the same.
				again, err := h.listOptions(kind, opts.LabelSelector.String(), opts.FieldSelector.String())
				if err != nil {
					t.Fatalf("%s: selector printed back as labels %q fields %q is refused: %v", kind, opts.LabelSelector, opts.FieldSelector, err)
				}
				if got := selMatches(again, r.labels, r.fields); got != want {
					t.Fatalf("%s: labels %q fields %q select %v, printed back as %q %q select %v",
						kind, labelSel, fieldSel, want, opts.LabelSelector, opts.FieldSelector, got)
				}
			}

			// An object is selected by its own fields...
			own := fields.SelectorFromSet(r.fields).String()
			opts, err = h.listOptions(kind, "", own)
			if err != nil {
				t.Fatalf("%s: the object's own fields %q are refused as a field selector: %v", kind, own, err)
			}
			h.check(t, r.res, r.list, opts, r.obj.GetName(), true, "own fields "+strconv.Quote(own))
			// ...and by its own labels, whenever coderd could have sent the
			// data.
			ownLabels, err := labels.ValidatedSelectorFromSet(r.labels)
			if err != nil {
				if r.coderValid {
					t.Fatalf("%s: labels %v of valid Coder data are not valid Kubernetes labels: %v", kind, r.labels, err)
				}
				continue
			}
			opts, err = h.listOptions(kind, ownLabels.String(), "")
			if err != nil {
				t.Fatalf("%s: the object's own labels %q are refused as a label selector: %v", kind, ownLabels, err)
			}
			h.check(t, r.res, r.list, opts, r.obj.GetName(), true, "own labels "+strconv.Quote(ownLabels.String()))
		}
	})
}

const selNamespace = "team-a"

var (
	selWorkspaceID = uuid.MustParse("aaaaaaaa-0000-4000-8000-000000000001")
	selBuildID     = uuid.MustParse("aaaaaaaa-0000-4000-8000-000000000002")
	selTemplateID  = uuid.MustParse("aaaaaaaa-0000-4000-8000-000000000003")
)

func selTransition(running bool) codersdk.WorkspaceTransition {
	if running {
		return codersdk.WorkspaceTransitionStart
	}
	return codersdk.WorkspaceTransitionStop
}

func selCoderNames(names ...string) bool {
	for _, n := range names {
		if len(n) > maxCoderName || !coderName.MatchString(n) {
			return false
		}
	}
	return true
}

func selControlPlaneValid(cp string) bool { return cp == "" || checkControlPlane(cp) == nil }

// selProvider serves the one backend the current fuzz input uses.
type selProvider struct{ backends []backend.Backend }

func (p *selProvider) Backends(_ context.Context, namespace string) ([]backend.Backend, error) {
	if namespace != "" && namespace != selNamespace {
		return nil, nil
	}
	return p.backends, nil
}

func (p *selProvider) Ready() error { return nil }

type selectorHarness struct {
	provider *selProvider
	url      *url.URL
	scheme   *runtime.Scheme
	ws       *WorkspaceStorage
	ts       *TemplateStorage
}

func newSelectorHarness(tb testing.TB) *selectorHarness {
	h := &selectorHarness{provider: &selProvider{}, url: fxURL(tb, "https://coder.example.com"), scheme: runtime.NewScheme()}
	if err := aggv1.AddToScheme(h.scheme); err != nil {
		tb.Fatal(err)
	}
	// The poll interval only decides how long listed objects count as
	// fresh: an hour keeps lists at resourceVersion 0 in the cache.
	o := Options{Backends: h.provider, PollInterval: time.Hour}
	var err error
	if h.ws, err = NewWorkspaces(o); err != nil {
		tb.Fatal(err)
	}
	if h.ts, err = NewTemplates(o, TemplateOptions{}); err != nil {
		tb.Fatal(err)
	}
	return h
}

// listOptions decodes ?labelSelector=&fieldSelector=&resourceVersion=0 for
// kind as k8s.io/apiserver's list handler does (listOpts in
// handlers/get.go), with its errors.
func (h *selectorHarness) listOptions(kind, labelSel, fieldSel string) (*metainternalversion.ListOptions, error) {
	q := url.Values{"labelSelector": {labelSel}, "fieldSelector": {fieldSel}, "resourceVersion": {"0"}}
	var opts metainternalversion.ListOptions
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(q, metav1.SchemeGroupVersion, &opts); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	if errs := metainternalversionvalidation.ValidateListOptions(&opts, false); len(errs) > 0 {
		return nil, apierrors.NewInvalid(schema.GroupKind{Group: metav1.GroupName, Kind: "ListOptions"}, "", errs)
	}
	if opts.FieldSelector == nil || opts.LabelSelector == nil {
		return nil, apierrors.NewBadRequest("no selectors decoded") // both parameters are always sent
	}
	gvk := aggv1.SchemeGroupVersion.WithKind(kind)
	var err error
	opts.FieldSelector, err = opts.FieldSelector.Transform(func(label, value string) (string, string, error) {
		return h.scheme.ConvertFieldLabel(gvk, label, value)
	})
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	return &opts, nil
}

// checkRefusal: a refused selector is a 400 with a message; when both
// selectors are well-formed, the only reason left is a field the resource
// does not have, and the message names it and the supported ones.
func (h *selectorHarness) checkRefusal(t *testing.T, kind, labelSel, fieldSel string, err error) {
	t.Helper()
	if !apierrors.IsBadRequest(err) || err.Error() == "" {
		t.Fatalf("%s: labels %q fields %q refused with %v (reason %q), want a 400 with a message", kind, labelSel, fieldSel, err, apierrors.ReasonForError(err))
	}
	if _, lerr := labels.Parse(labelSel); lerr != nil {
		return
	}
	parsed, ferr := fields.ParseSelector(fieldSel)
	if ferr != nil {
		return
	}
	msg := err.Error()
	if !strings.Contains(msg, "is not supported for "+kind+"; supported: [") {
		t.Fatalf("%s: well-formed labels %q fields %q refused with %q, want an unsupported field", kind, labelSel, fieldSel, msg)
	}
	named := false
	for _, req := range parsed.Requirements() {
		named = named || strings.Contains(msg, strconv.Quote(req.Field))
	}
	if !named {
		t.Fatalf("%s: refusal %q of fields %q names none of its fields", kind, msg, fieldSel)
	}
}

// check lists and watches with opts and fails unless both select the one
// object (name) exactly when want is true.
func (h *selectorHarness) check(t *testing.T, r *genericStore, list func(context.Context, *metainternalversion.ListOptions) (runtime.Object, error),
	opts *metainternalversion.ListOptions, name string, want bool, what string) {
	t.Helper()
	ctx := genericapirequest.WithNamespace(context.Background(), selNamespace)
	obj, err := list(ctx, opts)
	if err != nil {
		t.Fatalf("%s: List with %s: %v", r.kind, what, err)
	}
	items := itemNames(obj)
	if got := len(items) == 1 && items[0] == name; got != want || len(items) > 1 {
		t.Fatalf("%s: List with %s returned %q, want the object %q selected: %v", r.kind, what, items, name, want)
	}

	// A watch from now with its initial events, as informers open it.
	wopts := *opts
	wopts.Watch, wopts.AllowWatchBookmarks = true, true
	wopts.SendInitialEvents = new(true)
	wopts.ResourceVersionMatch = metav1.ResourceVersionMatchNotOlderThan
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wi, err := r.Watch(wctx, &wopts)
	if err != nil {
		t.Fatalf("%s: Watch with %s: %v", r.kind, what, err)
	}
	defer wi.Stop()
	var added []string
	timeout := time.After(30 * time.Second)
	for done := false; !done; {
		select {
		case ev, ok := <-wi.ResultChan():
			if !ok {
				t.Fatalf("%s: watch with %s closed before its initial events ended", r.kind, what)
			}
			switch ev.Type {
			case watch.Added:
				m, _ := ev.Object.(metav1.Object)
				if m == nil {
					t.Fatalf("%s: watch with %s: ADDED %T", r.kind, what, ev.Object)
				}
				added = append(added, m.GetName())
			case watch.Bookmark:
				done = true
			default:
				t.Fatalf("%s: watch with %s: unexpected %s event before the initial events ended", r.kind, what, ev.Type)
			}
		case <-timeout:
			t.Fatalf("%s: watch with %s: no end of initial events within 30s", r.kind, what)
		}
	}
	if got := len(added) == 1 && added[0] == name; got != want || len(added) > 1 {
		t.Fatalf("%s: Watch with %s sent ADDED %q, want the object %q selected: %v", r.kind, what, added, name, want)
	}
}

func itemNames(obj runtime.Object) []string {
	var names []string
	switch l := obj.(type) {
	case *workspaceList:
		for _, i := range l.Items {
			names = append(names, i.Name)
		}
	case *templateList:
		for _, i := range l.Items {
			names = append(names, i.Name)
		}
	}
	return names
}

// selMatches evaluates every requirement on its own, from the operators'
// documented meaning (not through the selector types' Matches): what the
// storage's filter must agree with.
func selMatches(opts *metainternalversion.ListOptions, l map[string]string, f fields.Set) bool {
	lreqs, _ := opts.LabelSelector.Requirements()
	for _, r := range lreqs {
		v, has := l[r.Key()]
		in := r.Values().Has(v)
		var ok bool
		switch r.Operator() {
		case selection.In, selection.Equals, selection.DoubleEquals:
			ok = has && in
		case selection.NotIn, selection.NotEquals:
			ok = !has || !in
		case selection.Exists:
			ok = has
		case selection.DoesNotExist:
			ok = !has
		case selection.GreaterThan, selection.LessThan:
			vals := r.Values().List()
			have, err1 := strconv.ParseInt(v, 10, 64)
			if !has || err1 != nil || len(vals) != 1 {
				break
			}
			bound, err2 := strconv.ParseInt(vals[0], 10, 64)
			if err2 != nil {
				break
			}
			ok = (r.Operator() == selection.GreaterThan && have > bound) || (r.Operator() == selection.LessThan && have < bound)
		}
		if !ok {
			return false
		}
	}
	for _, r := range opts.FieldSelector.Requirements() {
		v := f[r.Field]
		switch r.Operator {
		case selection.Equals, selection.DoubleEquals:
			if v != r.Value {
				return false
			}
		case selection.NotEquals:
			if v == r.Value {
				return false
			}
		default:
			return false
		}
	}
	return true
}
