package storage

import (
	"context"
	"reflect"
	"testing"

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
