package jsonskim

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// seeds are JSON as the callers meet it (a Kubernetes list, a page of
// coderd's workspaces) and the corners of its structure: strings holding
// brackets, quotes and escapes (runs of backslashes too), nesting, white
// space, literals, and documents broken at each kind of place.
var seeds = []string{
	`{"workspaces":[],"count":0}`,
	`{"count":2,"workspaces":[{"id":"a"},{"id":"b"}]}`,
	`{"workspaces":[{"id":"a","name":"x]}\"{[","n":[1,[2,{"c":"\\"}]],"t":true,"z":null,"f":-1.5e3}],"count":1}`,
	`{"extra":{"a":["]","}"]},"workspaces":[{"id":"a"}],"more":"s","num":12,"count":1,"lit":false}`,
	`{"workspaces":[{"id":"\\\\"},{"id":"\\\\\""}],"count":2}`,
	" \n{ \"workspaces\" : [ {\"id\" : \"a\"} ,\t{\"id\":\"b\\u0022\"} ] , \"count\" : 7 } \n",
	`{"metadata":{"resourceVersion":"17"},"items":[{"metadata":{"name":"coder.alice.ws-0","labels":{"a":"quote \" and \\ backslash"},"annotations":{"note":"ünïcödé <&>"}},"spec":{"parameters":[{"name":"cpu","value":"{\"nested\": [\"]\", \"}\"]}"}]}}]}`,
	` { "METADATA" : { "ResourceVersion" : "5" } , "Items" : [ { "metadata" : { "name" : "a\u0062c" } , "status" : { "latestBuild" : null } } ] } `,
	`"just a string"`,
	`-1.5e3`,
	`[null,true,false,{}]`,
	`{"workspaces":[{"id":"a"},],"count":1}`,
	`{"workspaces":[{"id":"a}],"count":1}`,
	`{"workspaces":[{"id":"a"`,
	`{"workspaces":[{"id":"a\`,
	`{"items":[{]}`,
	`{"items":"unterminated`,
	`{"a"::1}`,
}

// walk copies the document s scans without its white space, stepping
// into every object and array with Peek, Consume and Value as the
// callers do.
func walk(s *Scanner, out *bytes.Buffer) error {
	c, ok := s.Peek()
	if !ok {
		return s.Errorf("expected a value")
	}
	if c != '{' && c != '[' {
		raw, err := s.Value()
		out.Write(raw)
		return err
	}
	s.Consume(c)
	out.WriteByte(c)
	end := c + 2 // '}' or ']'
	if s.Consume(end) {
		out.WriteByte(end)
		return nil
	}
	for {
		if c == '{' {
			key, err := s.Value()
			if err != nil {
				return err
			}
			// Written before the scanner reads on, which may reuse
			// its bytes.
			out.Write(key)
			if key[0] != '"' || !s.Consume(':') {
				return s.Errorf("expected a member name and a colon")
			}
			out.WriteByte(':')
		}
		if err := walk(s, out); err != nil {
			return err
		}
		if s.Consume(',') {
			out.WriteByte(',')
			continue
		}
		if s.Consume(end) {
			out.WriteByte(end)
			return nil
		}
		return s.Errorf("expected , or %c", end)
	}
}

// skim scans doc with s: the top-level value whole, then walked again
// from a second scanner made by again.
func skim(doc []byte, s, again *Scanner) (raw []byte, walked string, err error) {
	raw, err = s.Value()
	raw = bytes.Clone(raw)
	if err == nil && !s.End() {
		err = s.Errorf("unexpected data after the value")
	}
	var out bytes.Buffer
	if werr := walk(again, &out); werr == nil && again.End() {
		walked = out.String()
	}
	return raw, walked, err
}

// FuzzScanner: a Scanner never panics; it finds the same values whether
// the document is held whole or arrives a byte at a time; on a valid
// document its top-level value is the document, and a walk through the
// document's structure finds exactly what encoding/json does.
func FuzzScanner(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		oneByte := func() *Scanner { return NewReader(iotest.OneByteReader(bytes.NewReader(doc))) }
		raw, walked, err := skim(doc, NewBytes(doc), NewBytes(doc))
		sraw, swalked, serr := skim(doc, oneByte(), oneByte())
		if (err == nil) != (serr == nil) || !bytes.Equal(raw, sraw) || walked != swalked {
			t.Fatalf("%q: whole: %q, walk %q, error %v; byte by byte: %q, walk %q, error %v", doc, raw, walked, err, sraw, swalked, serr)
		}
		if err != nil && err.Error() == "" {
			t.Fatalf("%q: empty error", doc)
		}
		if !json.Valid(doc) {
			return
		}
		var want bytes.Buffer
		if err := json.Compact(&want, doc); err != nil {
			t.Fatal(err)
		}
		if err != nil || !bytes.Equal(raw, bytes.Trim(doc, " \t\r\n")) || walked != want.String() {
			t.Fatalf("%q: value %q, error %v, walk %q; want the document, its compact form %q", doc, raw, err, walked, want.String())
		}
	})
}

// TestReadErr: a stream that breaks off is told apart from one that ends.
func TestReadErr(t *testing.T) {
	reset := errors.New("connection reset by peer")
	s := NewReader(io.MultiReader(strings.NewReader(`{"a":"b`), iotest.ErrReader(reset)))
	if _, err := s.Value(); err == nil || !errors.Is(s.ReadErr(), reset) {
		t.Errorf("value of a broken stream: error %v, read error %v; want an error and %v", err, s.ReadErr(), reset)
	}
	s = NewReader(strings.NewReader(`{"a":"b`))
	if _, err := s.Value(); err == nil || s.ReadErr() != nil {
		t.Errorf("value of a truncated document: error %v, read error %v; want an error and none", err, s.ReadErr())
	}
	var se *SyntaxError
	if _, err := NewBytes([]byte(`  ]`)).Value(); !errors.As(err, &se) || se.Offset != 2 || err.Error() != "invalid JSON at offset 2: expected a value" {
		t.Errorf("value at a closing bracket: %v", err)
	}
}

// TestWindow: a long document read as it arrives is held through a
// window of about one value, not whole.
func TestWindow(t *testing.T) {
	elem := `{"pad":"` + strings.Repeat("x", 2400) + `"}`
	doc := "[" + strings.Repeat(elem+",", 9999) + elem + "]"
	s := NewReader(strings.NewReader(doc))
	if !s.Consume('[') {
		t.Fatal("no array")
	}
	for n := 0; ; n++ {
		raw, err := s.Value()
		if err != nil || string(raw) != elem {
			t.Fatalf("element %d: %.40q, %v", n, raw, err)
		}
		if cap(s.buf) > 4*readChunk {
			t.Fatalf("window of %d bytes after %d elements", cap(s.buf), n)
		}
		if s.Consume(']') {
			break
		}
		if !s.Consume(',') {
			t.Fatalf("after element %d: no comma", n)
		}
	}
	if !s.End() {
		t.Error("data after the array")
	}
}
