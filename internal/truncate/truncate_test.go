package truncate

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	for _, tc := range []struct {
		in   string
		max  int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"0123456789abc", 10, "0123456…"},
		// "é" is two bytes: the cut moves back to the start of the rune.
		{"abcdeéfghij", 9, "abcde…"},
		{"abcdefgh", 2, ""},
	} {
		got := String(tc.in, tc.max)
		if got != tc.want {
			t.Errorf("String(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
		}
		if len(got) > tc.max || !utf8.ValidString(got) {
			t.Errorf("String(%q, %d) = %q: %d bytes or invalid UTF-8", tc.in, tc.max, got, len(got))
		}
	}
	// Every cut of a multi-byte text stays valid and within the limit.
	s := strings.Repeat("日本語", 50)
	for n := 0; n <= len(s); n++ {
		if got := String(s, n); len(got) > n || !utf8.ValidString(got) {
			t.Fatalf("String(_, %d) = %q", n, got)
		}
	}
}
