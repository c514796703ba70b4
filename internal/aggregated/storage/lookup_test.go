package storage

import (
	"context"
	"reflect"
	"testing"

	"github.com/coder/coder/v2/codersdk"
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

// TestListMemoPerBackend: the list memo keeps one memo per backend. A
// list of the backend's coderd at another URL (or with prefixed names)
// does not see the old memo and replaces it when kept, and a backend
// that is gone when the sources are listed loses its memo, so that no
// memo of every workspace of a coderd outlives its use.
func TestListMemoPerBackend(t *testing.T) {
	withURL := func(tg target, raw string) target {
		tg.Client = codersdk.New(fxURL(t, raw))
		return tg
	}
	a := withURL(fxTarget(t, "a", false), "https://coder-a.example.com")
	aMoved := withURL(a, "https://coder-a.example.com:8443")
	aPrefixed := a
	aPrefixed.prefixed = true
	b := withURL(fxTarget(t, "b", false), "https://coder-b.example.com")
	entries := func(hash uint64) map[uint64]*memoEntry {
		return map[uint64]*memoEntry{hash: newMemoEntry(&aggv1.CoderWorkspace{})}
	}

	var m listMemo
	m.set(a, entries(1))
	m.set(b, entries(2))
	if got := m.get(a); got[1] == nil {
		t.Fatalf("memo of a = %v, want the one set", got)
	}
	if got := m.get(aMoved); got != nil {
		t.Errorf("memo of a at another URL = %v, want none", got)
	}
	if got := m.get(aPrefixed); got != nil {
		t.Errorf("memo of a with prefixed names = %v, want none", got)
	}
	m.set(aMoved, entries(3))
	if got := m.get(a); got != nil {
		t.Errorf("memo of a at its old URL after a list at the new one = %v, want none", got)
	}
	if len(m.byBE) != 2 {
		t.Errorf("%d memos kept, want 2 (one per backend)", len(m.byBE))
	}
	m.retain([]target{b})
	if got := m.get(aMoved); got != nil {
		t.Errorf("memo of a after it was gone from the sources = %v, want none", got)
	}
	if got := m.get(b); got[2] == nil {
		t.Errorf("memo of b = %v, want the one set", got)
	}
}
