package storage

import (
	"strings"
	"testing"
)

// Object names come from any client: parsing never panics, and a name it
// accepts is exactly the name the parts print back.
func FuzzParseWorkspaceName(f *testing.F) {
	for _, s := range []string{"coder.alice.dev", "cp.coder.alice.dev", "", ".", "...", ".a.b.c", "a..b", "A.B.C",
		"coder.alice.dev-1", strings.Repeat("a", 40) + ".b.c", "coder.alice.dév", "a.b.c.d.e", "cp-1.o.u.w"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseWorkspaceName(s)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("empty error for %q", s)
			}
			return
		}
		if got := n.String(n.ControlPlane != ""); got != s {
			t.Fatalf("parse(%q) prints back as %q", s, got)
		}
	})
}

func FuzzParseTemplateName(f *testing.F) {
	for _, s := range []string{"coder.docker", "cp.coder.docker", "coder.my_tpl", "", ".", ".a.b", "a..b", "a.b.c.d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseTemplateName(s)
		if err != nil {
			return
		}
		if got := n.String(n.ControlPlane != ""); got != s {
			t.Fatalf("parse(%q) prints back as %q", s, got)
		}
	})
}
