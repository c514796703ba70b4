package storage

import (
	"testing"
)

func TestInNamespace(t *testing.T) {
	if inNamespace("") != nil {
		t.Error(`inNamespace("") is not nil (all namespaces)`)
	}
	f := inNamespace("team")
	for key, want := range map[string]bool{"team/prod": true, "team/": true, "team-b/prod": false, "teamx/": false, "other/team": false} {
		if f(key) != want {
			t.Errorf("inNamespace(team)(%q) = %v, want %v", key, !want, want)
		}
	}
}
