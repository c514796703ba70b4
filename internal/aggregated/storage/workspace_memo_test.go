package storage

import (
	"testing"

	"github.com/coder/coder/v2/codersdk"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

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

	var m listMemo[*memoEntry]
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
