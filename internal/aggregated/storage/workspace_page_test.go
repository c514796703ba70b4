package storage

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
)

// scanAll scans doc from r and returns copies of its elements.
func scanAll(r io.Reader) ([][]byte, int, error) {
	var raws [][]byte
	count, err := scanWorkspacesPage(r, func(raw []byte) error {
		raws = append(raws, bytes.Clone(raw))
		return nil
	})
	return raws, count, err
}

// readers are the ways a page may arrive: at once, in halves of each
// read, and a byte at a time (every value, string and escape split
// across reads).
var readers = map[string]func(doc []byte) io.Reader{
	"whole":        func(doc []byte) io.Reader { return bytes.NewReader(doc) },
	"half reads":   func(doc []byte) io.Reader { return iotest.HalfReader(bytes.NewReader(doc)) },
	"byte by byte": func(doc []byte) io.Reader { return iotest.OneByteReader(bytes.NewReader(doc)) },
}

// TestScanWorkspacesPage: the elements and count scanWorkspacesPage
// finds are exactly those encoding/json decodes, for pages as coderd
// writes them and for the harder cases JSON allows (strings holding
// brackets, quotes and escapes, nesting, white space, other members,
// members in another order, null), however the answer is split into
// reads; broken pages are refused.
func TestScanWorkspacesPage(t *testing.T) {
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
		for how, reader := range readers {
			raws, count, err := scanAll(reader([]byte(doc)))
			if err != nil {
				t.Errorf("%s: scanWorkspacesPage(%q): %v", how, doc, err)
				continue
			}
			if count != want.Count || len(raws) != len(want.Workspaces) {
				t.Errorf("%s: scanWorkspacesPage(%q) = %d elements, count %d; want %d, %d", how, doc, len(raws), count, len(want.Workspaces), want.Count)
				continue
			}
			for i := range raws {
				if !bytes.Equal(raws[i], want.Workspaces[i]) {
					t.Errorf("%s: scanWorkspacesPage(%q) element %d = %s, want %s", how, doc, i, raws[i], want.Workspaces[i])
				}
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
		`{"workspaces":[{"id":"a\`,
	}
	for _, doc := range invalid {
		for how, reader := range readers {
			raws, count, err := scanAll(reader([]byte(doc)))
			if err == nil {
				t.Errorf("%s: scanWorkspacesPage(%q) = %d elements, count %d; want an error", how, doc, len(raws), count)
			} else if !strings.HasPrefix(err.Error(), "decode coderd's answer: ") {
				t.Errorf("%s: scanWorkspacesPage(%q): error %q does not say the answer is malformed", how, doc, err)
			}
		}
	}
}

// TestScanWorkspacesPageErrors: a read that fails part way is reported as
// the failed read (not as malformed JSON), after the elements that
// arrived whole; an error of the caller's function ends the scan and is
// returned unchanged.
func TestScanWorkspacesPageErrors(t *testing.T) {
	reset := errors.New("connection reset by peer")
	r := io.MultiReader(strings.NewReader(`{"workspaces":[{"id":"a"},{"id":"b"},{"id":`), iotest.ErrReader(reset))
	raws, _, err := scanAll(r)
	if !errors.Is(err, reset) || err.Error() != "read coderd's answer: connection reset by peer" {
		t.Errorf("scan of a failed read: error %v, want \"read coderd's answer: connection reset by peer\"", err)
	}
	if got := fmt.Sprintf("%s", raws); got != `[{"id":"a"} {"id":"b"}]` {
		t.Errorf("scan of a failed read passed %s, want the two elements that arrived whole", got)
	}

	stop := errors.New("stop")
	calls := 0
	_, err = scanWorkspacesPage(strings.NewReader(`{"workspaces":[{"id":"a"},{"id":"b"}],"count":2}`), func([]byte) error {
		calls++
		return stop
	})
	if err != stop || calls != 1 {
		t.Errorf("each's error: got %v after %d calls, want it unchanged after 1", err, calls)
	}
}

// TestScanWorkspacesPageMemory: a page of 10,000 workspaces (about 25 MB,
// coderd's answer at the default page size) is read through a window of
// a few workspaces, not held whole: scanning it allocates less than
// 1 MiB. Holding whole pages for reuse was the largest part of the heap
// at 10,000 workspaces.
func TestScanWorkspacesPageMemory(t *testing.T) {
	elem := `{"id":"%08d-aaaa-4aaa-8aaa-aaaaaaaaaaaa","name":"ws-%d","pad":"` + strings.Repeat("x", 2400) + `"}`
	var doc bytes.Buffer
	doc.WriteString(`{"workspaces":[`)
	for i := range DefaultWorkspacePageSize {
		if i > 0 {
			doc.WriteByte(',')
		}
		fmt.Fprintf(&doc, elem, i, i)
	}
	fmt.Fprintf(&doc, `],"count":%d}`, DefaultWorkspacePageSize)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	n := 0
	count, err := scanWorkspacesPage(bytes.NewReader(doc.Bytes()), func([]byte) error { n++; return nil })
	runtime.ReadMemStats(&after)
	if err != nil || n != DefaultWorkspacePageSize || count != DefaultWorkspacePageSize {
		t.Fatalf("scan: %d elements, count %d, error %v; want %d, %d, none", n, count, err, DefaultWorkspacePageSize, DefaultWorkspacePageSize)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc >= 1<<20 {
		t.Errorf("scanning a %d-byte page allocated %d bytes, want < 1 MiB", doc.Len(), alloc)
	}
}
