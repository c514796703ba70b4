package storage

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

func TestCoderdFactsEvictsOldest(t *testing.T) {
	f := coderdFacts[uuid.UUID, []aggv1.WorkspaceParameter]{max: 2}
	ids := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	vals := [][]aggv1.WorkspaceParameter{{{Name: "a", Value: "0"}}, {{Name: "a", Value: "1"}}, nil}
	f.add("a", ids[0], vals[0])
	f.add("a", ids[1], vals[1])
	// Adding a known fact again changes nothing, not even its age.
	f.add("a", ids[0], []aggv1.WorkspaceParameter{{Name: "a", Value: "changed"}})
	if got, ok := f.known("a", ids[0]); !ok || !reflect.DeepEqual(got, vals[0]) {
		t.Fatalf("known = %v, %v; want the first value", got, ok)
	}
	if _, ok := f.known("b", ids[0]); ok {
		t.Error("a fact of coderd a was served for coderd b")
	}
	f.add("a", ids[2], vals[2])
	if _, ok := f.known("a", ids[0]); ok {
		t.Error("the oldest fact was kept beyond max")
	}
	for i := 1; i < 3; i++ {
		if got, ok := f.known("a", ids[i]); !ok || !reflect.DeepEqual(got, vals[i]) {
			t.Errorf("fact %d: known = %v, %v", i, got, ok)
		}
	}
	if len(f.facts) != 2 || len(f.order) != 2 {
		t.Errorf("holds %d facts in a queue of %d, want 2", len(f.facts), len(f.order))
	}
}

// fill asks coderd only about builds it does not remember: with every
// build known (or none at all) it needs no client.
func TestBuildParamsFillFromMemory(t *testing.T) {
	p := newBuildParams(10)
	known := uuid.New()
	tgt := fxTarget(t, "prod", false)
	p.add(tgt.coderdKey(), known, []aggv1.WorkspaceParameter{{Name: "region", Value: "eu"}})
	got, err := p.fill(context.Background(), tgt, []uuid.UUID{known, uuid.Nil, known})
	if err != nil {
		t.Fatal(err)
	}
	want := map[uuid.UUID][]aggv1.WorkspaceParameter{known: {{Name: "region", Value: "eu"}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("fill = %v, want %v (no entry for the nil build)", got, want)
	}
	if got, err := p.fill(context.Background(), tgt, nil); err != nil || len(got) != 0 {
		t.Errorf("fill(nil) = %v, %v", got, err)
	}
}

// The features come from GET /api/v2/entitlements, remembered per coderd
// for a while: coderd's 404 "Route not found." is the open-source build.
func TestFeatureCache(t *testing.T) {
	var asked atomic.Int32
	openSource := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v2/entitlements" {
			http.NotFound(w, r)
			return
		}
		asked.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if openSource {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(codersdk.Response{Message: "Route not found."})
			return
		}
		_ = json.NewEncoder(w).Encode(codersdk.Entitlements{Features: map[codersdk.FeatureName]codersdk.Feature{
			codersdk.FeatureAccessControl:              {Entitlement: codersdk.EntitlementEntitled, Enabled: true},
			codersdk.FeatureAdvancedTemplateScheduling: {Entitlement: codersdk.EntitlementNotEntitled, Enabled: false},
		}})
	}))
	defer srv.Close()
	tgt := fxTarget(t, "prod", false)
	tgt.Client = codersdk.New(fxURL(t, srv.URL))
	c := newFeatureCache()
	ctx := context.Background()
	f, err := c.get(ctx, tgt)
	if err != nil || !f.openSource || len(f.enabled) != 0 {
		t.Fatalf("open-source coderd: %+v, %v", f, err)
	}
	if _, err := c.get(ctx, tgt); err != nil || asked.Load() != 1 {
		t.Errorf("asked coderd %d times for two gets within %s (%v), want once", asked.Load(), featureTTL, err)
	}
	// A license added: seen once the answer expired.
	openSource = false
	c.ttl = time.Millisecond
	time.Sleep(5 * time.Millisecond)
	f, err = c.get(ctx, tgt)
	if err != nil || f.openSource || !f.enabled[codersdk.FeatureAccessControl] || f.enabled[codersdk.FeatureAdvancedTemplateScheduling] {
		t.Errorf("licensed coderd: %+v, %v", f, err)
	}
	if !strings.Contains(f.lacking(), "license") {
		t.Errorf("lacking() = %q", f.lacking())
	}
}

func TestCoderdFactsExpire(t *testing.T) {
	f := coderdFacts[string, int]{ttl: 20 * time.Millisecond, max: 10}
	f.add("a", "x", 1)
	f.add("a", "x", 2)
	if v, ok := f.known("a", "x"); !ok || v != 1 {
		t.Errorf("known = %v, %v; want the first answer while fresh", v, ok)
	}
	time.Sleep(30 * time.Millisecond)
	if _, ok := f.known("a", "x"); ok {
		t.Error("an expired fact is still served")
	}
	f.add("a", "x", 3)
	if v, ok := f.known("a", "x"); !ok || v != 3 || len(f.order) != 1 {
		t.Errorf("known = %v, %v with %d keys queued; want the new answer, queued once", v, ok, len(f.order))
	}
}
