package storage

import (
	"context"
	"errors"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/backend"
)

func TestTargetsOf(t *testing.T) {
	bs := []backend.Backend{
		{Namespace: "a", ControlPlane: "one"},
		{Namespace: "b", ControlPlane: "one"},
		{Namespace: "b", ControlPlane: "two"},
		{Namespace: "c", ControlPlane: ""},
		{Namespace: "d", ControlPlane: "x"},
		{Namespace: "d", ControlPlane: "y"},
		{Namespace: "d", ControlPlane: "z"},
	}
	got := targetsOf(bs)
	want := []bool{false, true, true, false, true, true, true}
	if len(got) != len(bs) {
		t.Fatalf("targetsOf returned %d targets for %d backends", len(got), len(bs))
	}
	for i, tg := range got {
		if tg.Key() != bs[i].Key() || tg.Client != bs[i].Client {
			t.Errorf("target %d is %+v, want %+v (same order)", i, tg.Backend, bs[i])
		}
		if tg.prefixed != want[i] {
			t.Errorf("target %s: prefixed %v, want %v", tg.Key(), tg.prefixed, want[i])
		}
	}
	// Only the namespace matters: one backend per namespace is never
	// prefixed, whatever the other namespaces hold.
	for _, tg := range targetsOf([]backend.Backend{{Namespace: "a", ControlPlane: "one"}}) {
		if tg.prefixed {
			t.Error("the only backend of a namespace is prefixed")
		}
	}
	if got := targetsOf(nil); len(got) != 0 {
		t.Errorf("targetsOf(nil) = %v", got)
	}
}

func fxResource(p backend.Provider) *genericStore {
	return &genericStore{gr: aggv1.Resource("coderworkspaces"), kind: "CoderWorkspace", backends: p}
}

func TestResolve(t *testing.T) {
	ctx := context.Background()
	p := fxProvider{backends: []backend.Backend{
		{Namespace: "single", ControlPlane: "only"},
		{Namespace: "multi", ControlPlane: "zeta"},
		{Namespace: "multi", ControlPlane: "alpha"},
		{Namespace: "static", ControlPlane: ""},
	}}
	r := fxResource(p)
	for _, tc := range []struct {
		name, namespace, controlPlane string
		want                          string // backend key on success
		wantPrefixed                  bool
		notFound                      []string // substrings of the NotFound message
	}{
		{name: "single, unprefixed", namespace: "single", want: "single/only"},
		{name: "static, unprefixed", namespace: "static", want: "static/"},
		{name: "multi, prefixed", namespace: "multi", controlPlane: "alpha", want: "multi/alpha", wantPrefixed: true},
		{name: "multi, other prefix", namespace: "multi", controlPlane: "zeta", want: "multi/zeta", wantPrefixed: true},
		{name: "empty namespace", namespace: "none", notFound: []string{`namespace "none" has no CoderControlPlane with ready operator access`}},
		{name: "multi, unprefixed", namespace: "multi", notFound: []string{"has several control planes (alpha, zeta)", "prefix the name"}},
		{name: "single, prefixed", namespace: "single", controlPlane: "only", notFound: []string{"has one control plane", `without the "only" prefix`}},
		{name: "multi, unknown prefix", namespace: "multi", controlPlane: "beta", notFound: []string{`no control plane "beta"`, "(it has alpha, zeta)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := r.resolve(ctx, tc.namespace, tc.controlPlane, "obj")
			if tc.notFound != nil {
				if !apierrors.IsNotFound(err) {
					t.Fatalf("resolve = %+v, %v; want NotFound", got, err)
				}
				for _, s := range tc.notFound {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not contain %q", err, s)
					}
				}
				if !strings.Contains(err.Error(), `"obj" not found`) {
					t.Errorf("error %q does not name the object", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Key() != tc.want || got.prefixed != tc.wantPrefixed {
				t.Errorf("resolve = %s (prefixed %v), want %s (prefixed %v)", got.Key(), got.prefixed, tc.want, tc.wantPrefixed)
			}
		})
	}

	t.Run("provider error", func(t *testing.T) {
		r := fxResource(fxProvider{err: errors.New("informers not synced")})
		_, err := r.resolve(ctx, "single", "", "obj")
		if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), "informers not synced") {
			t.Errorf("resolve = %v, want ServiceUnavailable naming the cause", err)
		}
	})
}

func TestResolveAgreesWithNames(t *testing.T) {
	// The name toWorkspace gives an object resolves back to its backend.
	ctx := context.Background()
	bs := []backend.Backend{{Namespace: "team-a", ControlPlane: "prod"}, {Namespace: "team-a", ControlPlane: "dev"}, {Namespace: "team-b", ControlPlane: "prod"}}
	r := fxResource(fxProvider{backends: bs})
	for _, tg := range targetsOf(bs) {
		obj := toWorkspace(tg, fxWorkspace(), nil)
		n, err := parseWorkspaceName(obj.Name)
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.resolve(ctx, obj.Namespace, n.ControlPlane, obj.Name)
		if err != nil {
			t.Fatalf("%s: %v", obj.Name, err)
		}
		if got.Key() != tg.Key() {
			t.Errorf("%s/%s resolves to %s, want %s", obj.Namespace, obj.Name, got.Key(), tg.Key())
		}
	}
}

func TestControlPlaneNamesSorted(t *testing.T) {
	ts := []target{{Backend: backend.Backend{ControlPlane: "b"}}, {Backend: backend.Backend{ControlPlane: "a"}}, {Backend: backend.Backend{ControlPlane: "c"}}}
	if got := controlPlaneNames(ts); got != "a, b, c" {
		t.Errorf("controlPlaneNames = %q", got)
	}
	if ts[0].ControlPlane != "b" {
		t.Error("controlPlaneNames reordered its argument")
	}
}

func TestBadNameIsNotFound(t *testing.T) {
	r := fxResource(nil)
	_, perr := parseWorkspaceName("nope")
	err := r.badName("nope", perr)
	if !apierrors.IsNotFound(err) {
		t.Fatalf("badName = %v, want NotFound", err)
	}
	if !strings.Contains(err.Error(), "<organization>.<owner>.<workspace>") {
		t.Errorf("badName message %q does not tell the expected format", err)
	}
	var se *apierrors.StatusError
	if !errors.As(err, &se) || se.ErrStatus.Details == nil || se.ErrStatus.Details.Name != "nope" || se.ErrStatus.Details.Kind != "coderworkspaces" {
		t.Errorf("status details = %+v", se.ErrStatus.Details)
	}
}
