package storage

import (
	"context"
	"reflect"
	"testing"

	"github.com/google/uuid"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

func TestBuildParamsEvictsOldest(t *testing.T) {
	p := newBuildParams(2)
	ids := []coderdID{{"a", uuid.New()}, {"a", uuid.New()}, {"a", uuid.New()}}
	vals := [][]aggv1.WorkspaceParameter{{{Name: "a", Value: "0"}}, {{Name: "a", Value: "1"}}, nil}
	p.store(ids[0], vals[0])
	p.store(ids[1], vals[1])
	// Storing a known build again changes nothing, not even its age.
	p.store(ids[0], []aggv1.WorkspaceParameter{{Name: "a", Value: "changed"}})
	if got, ok := p.lookup(ids[0]); !ok || !reflect.DeepEqual(got, vals[0]) {
		t.Fatalf("lookup = %v, %v; want the first value", got, ok)
	}
	p.store(ids[2], vals[2])
	if _, ok := p.lookup(ids[0]); ok {
		t.Error("the oldest build was kept beyond max")
	}
	for i := 1; i < 3; i++ {
		if got, ok := p.lookup(ids[i]); !ok || !reflect.DeepEqual(got, vals[i]) {
			t.Errorf("build %d: lookup = %v, %v", i, got, ok)
		}
	}
	if len(p.byID) != 2 || len(p.order) != 2 {
		t.Errorf("holds %d builds in a queue of %d, want 2", len(p.byID), len(p.order))
	}
}

// fill asks coderd only about builds it does not remember: with every
// build known (or none at all) it needs no client.
func TestBuildParamsFillFromMemory(t *testing.T) {
	p := newBuildParams(10)
	known := uuid.New()
	tgt := fxTarget(t, "prod", false)
	p.store(coderdID{tgt.coderdKey(), known}, []aggv1.WorkspaceParameter{{Name: "region", Value: "eu"}})
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
