package storage

import (
	"bytes"
	"encoding/json"
	"testing"
)

// TestSplitWorkspacesPage: the elements and count splitWorkspacesPage
// finds are exactly those encoding/json decodes, for pages as coderd
// writes them and for the harder cases JSON allows (strings holding
// brackets, quotes and escapes, nesting, white space, other members,
// members in another order, null); broken pages are refused.
func TestSplitWorkspacesPage(t *testing.T) {
	valid := []string{
		`{"workspaces":[],"count":0}`,
		`{"workspaces":null,"count":0}`,
		`{"count":2,"workspaces":[{"id":"a"},{"id":"b"}]}`,
		`{"workspaces":[{"id":"a","name":"x]}\"{[","n":[1,[2,{"c":"\\"}]],"t":true,"z":null,"f":-1.5e3}],"count":1}`,
		" \n{ \"workspaces\" : [ {\"id\" : \"a\"} ,\t{\"id\":\"b\\u0022\"} ] , \"count\" : 7 } \n",
		`{"extra":{"a":["]","}"]},"workspaces":[{"id":"a"}],"more":"s","num":12,"count":1,"lit":false}`,
		`{"workspaces":[{"id":"\\\\"},{"id":"\\\\\""}],"count":2}`,
	}
	for _, doc := range valid {
		var want struct {
			Workspaces []json.RawMessage `json:"workspaces"`
			Count      int               `json:"count"`
		}
		if err := json.Unmarshal([]byte(doc), &want); err != nil {
			t.Fatalf("test page %q does not decode: %v", doc, err)
		}
		raws, count, err := splitWorkspacesPage([]byte(doc))
		if err != nil {
			t.Errorf("splitWorkspacesPage(%q): %v", doc, err)
			continue
		}
		if count != want.Count || len(raws) != len(want.Workspaces) {
			t.Errorf("splitWorkspacesPage(%q) = %d elements, count %d; want %d, %d", doc, len(raws), count, len(want.Workspaces), want.Count)
			continue
		}
		for i := range raws {
			if !bytes.Equal(raws[i], want.Workspaces[i]) {
				t.Errorf("splitWorkspacesPage(%q) element %d = %s, want %s", doc, i, raws[i], want.Workspaces[i])
			}
		}
	}
	invalid := []string{
		``,
		`[]`,
		`{"workspaces":[{"id":"a"}]}`,
		`{"workspaces":[{"id":"a"},],"count":1}`,
		`{"workspaces":[{"id":"a"}],"count":"1"}`,
		`{"workspaces":[{"id":"a"}],"count":1`,
		`{"workspaces":[{"id":"a}],"count":1}`,
		`{"workspaces":{"id":"a"},"count":1}`,
		`{"workspaces":[{"id":"a"}],"count":1} x`,
		`{"workspaces":[{"id":"a"}] "count":1}`,
		`{"workspaces":[{"id":"a"`,
	}
	for _, doc := range invalid {
		if raws, count, err := splitWorkspacesPage([]byte(doc)); err == nil {
			t.Errorf("splitWorkspacesPage(%q) = %d elements, count %d; want an error", doc, len(raws), count)
		}
	}
}

// coderd's answer is parsed by a hand-written scanner on every poll: it
// never panics or reads out of bounds, and on a valid JSON document every
// element it returns is itself a valid JSON value taken from the document.
func FuzzSplitWorkspacesPage(f *testing.F) {
	for _, s := range []string{
		`{"workspaces":[],"count":0}`,
		`{"count":2,"workspaces":[{"id":"a"},{"id":"b"}]}`,
		`{"workspaces":[{"id":"a","name":"x]}\"{[","n":[1,[2,{"c":"\\"}]],"t":true,"z":null,"f":-1.5e3}],"count":1}`,
		`{"extra":{"a":["]","}"]},"workspaces":[{"id":"a"}],"more":"s","num":12,"count":1,"lit":false}`,
		`{"workspaces":[{"id":"a"},],"count":1}`,
		`{"workspaces":[{"id":"a}],"count":1}`,
		`{"workspaces":[{"id":"a"`,
		`{"workspaces":null,"count":1e400}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		raws, count, err := splitWorkspacesPage(doc)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("empty error for %q", doc)
			}
			return
		}
		if !json.Valid(doc) {
			return
		}
		for i, raw := range raws {
			if !json.Valid(raw) || !bytes.Contains(doc, raw) {
				t.Fatalf("splitWorkspacesPage(%q) element %d = %q: not a JSON value of the document (count %d)", doc, i, raw, count)
			}
		}
	})
}
