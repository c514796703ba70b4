package coderapi

import "testing"

func TestSameURL(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"http://Coder.Example.com:80/", "http://coder.example.com", true},
		{"https://coder.example.com", "https://coder.example.com:443/", true},
		{"https://coder.example.com/coder/", "https://coder.example.com/coder", true},
		{"http://coder.ns.svc.cluster.local", "http://coder.ns.svc.cluster.local:8080", false},
		{"https://coder.example.com", "http://coder.example.com", false},
		{"https://coder.example.com", "https://coder.example.com.evil.test", false},
		{"https://coder.example.com/a", "https://coder.example.com/b", false},
		{"http://[fd00::1]:80", "http://[FD00::1]", true},
		{"", "", false},
		{"ftp://coder.example.com", "ftp://coder.example.com", false},
		{"coder.example.com", "coder.example.com", false},
	} {
		if got := SameURL(tc.a, tc.b); got != tc.same {
			t.Errorf("SameURL(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.same)
		}
	}
}
