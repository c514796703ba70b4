// Package truncate shortens text for places with a size limit (condition
// messages, event notes, tool output) without cutting a UTF-8 character
// in half.
package truncate

import "unicode/utf8"

// ellipsis marks text that was cut.
const ellipsis = "…"

// String returns s when it fits in max bytes, otherwise its longest
// prefix that, with "…" appended, does, cut on a rune boundary.
func String(s string, max int) string {
	if len(s) <= max {
		return s
	}
	if max < len(ellipsis) {
		return ""
	}
	cut := max - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}
