package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// scanWorkspacesPage reads one page of coderd's GET /api/v2/workspaces,
// {"workspaces":[...],"count":N}, from r as it arrives and calls each
// with every workspace's JSON, without decoding the workspaces: a list
// decodes only those whose JSON it has not seen before (see
// listWorkspaces). raw is valid only during the call.
//
// Reading as it arrives keeps memory to a window of the answer (one
// workspace at least) instead of the whole answer: a page of 10,000
// workspaces is about 25 MB, and a whole-page buffer kept for the next
// poll was the largest thing in the heap.
//
// It checks the page's structure (an object whose "workspaces" is an
// array or null and whose "count" is a number) and finds each element's
// end by its brackets and strings; it does not validate the elements
// themselves: each is either byte for byte a workspace decoded before or
// is decoded (and validated) with encoding/json. Members other than
// those two are skipped the same way. An error from each ends the scan
// and is returned as it is; a failed read is told apart from a malformed
// answer.
func scanWorkspacesPage(r io.Reader, each func(raw []byte) error) (count int, err error) {
	s := pageScanner{r: r, mark: -1}
	defer func() {
		if err != nil && err != s.eachErr && s.rerr != nil && !errors.Is(s.rerr, io.EOF) {
			err = fmt.Errorf("read coderd's answer: %w", s.rerr)
		}
	}()
	if !s.consume('{') {
		return 0, s.fail("expected an object")
	}
	sawCount := false
	if !s.consume('}') {
		for {
			key, err := s.key()
			if err != nil {
				return 0, err
			}
			switch key {
			case "workspaces":
				if err := s.array(each); err != nil {
					return 0, err
				}
			case "count":
				raw, err := s.value()
				if err != nil {
					return 0, err
				}
				if err := json.Unmarshal(raw, &count); err != nil {
					return 0, fmt.Errorf("decode coderd's answer: count: %w", err)
				}
				sawCount = true
			default:
				if _, err := s.value(); err != nil {
					return 0, err
				}
			}
			if s.consume(',') {
				continue
			}
			if s.consume('}') {
				break
			}
			return 0, s.fail("expected , or } after a member")
		}
	}
	s.space()
	if s.i < len(s.buf) || s.more() {
		return 0, s.fail("unexpected data after the object")
	}
	if !sawCount {
		// coderd always sends it; without it every page would look
		// inconsistent.
		return 0, errors.New(`decode coderd's answer: no "count" member`)
	}
	return count, nil
}

// pageScanChunk is how much the scanner asks the reader for at a time;
// its window grows beyond that only for a value that does not fit.
const pageScanChunk = 64 << 10

// pageScanner walks a JSON document by its structure only, through a
// window of the stream: buf holds the bytes from the start of the value
// being returned (mark) or from the next byte (i) on, and more() moves
// what it keeps to the front before reading again.
type pageScanner struct {
	r   io.Reader
	buf []byte
	i   int
	// mark is where in buf the value being scanned starts, or -1.
	mark int
	// off is how many bytes of the stream came before buf[0].
	off int64
	// rerr is the reader's error once it returned one (io.EOF at the end).
	rerr error
	// eachErr is the error each returned, which ends the scan.
	eachErr error
}

func (s *pageScanner) fail(what string) error {
	return fmt.Errorf("decode coderd's answer: invalid JSON at offset %d: %s", s.off+int64(s.i), what)
}

// more reads more of the stream into buf; false once the stream ended or
// failed.
func (s *pageScanner) more() bool {
	if s.rerr != nil {
		return false
	}
	keep := min(s.i, len(s.buf))
	if s.mark >= 0 {
		keep = s.mark
	}
	if keep > 0 {
		n := copy(s.buf, s.buf[keep:])
		s.buf = s.buf[:n]
		s.off += int64(keep)
		s.i -= keep
		if s.mark >= 0 {
			s.mark = 0
		}
	}
	if cap(s.buf)-len(s.buf) < pageScanChunk/2 {
		grown := make([]byte, len(s.buf), max(2*cap(s.buf), pageScanChunk))
		copy(grown, s.buf)
		s.buf = grown
	}
	for {
		n, err := s.r.Read(s.buf[len(s.buf):cap(s.buf)])
		s.buf = s.buf[:len(s.buf)+n]
		if err != nil {
			s.rerr = err
		}
		if n > 0 {
			return true
		}
		if err != nil {
			return false
		}
	}
}

// peek returns the next byte without consuming it; false at the end.
func (s *pageScanner) peek() (byte, bool) {
	if s.i < len(s.buf) || s.more() {
		return s.buf[s.i], true
	}
	return 0, false
}

func (s *pageScanner) space() {
	for {
		c, ok := s.peek()
		if !ok {
			return
		}
		switch c {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// consume skips white space and c if c comes next.
func (s *pageScanner) consume(c byte) bool {
	s.space()
	if next, ok := s.peek(); ok && next == c {
		s.i++
		return true
	}
	return false
}

// key reads a member's name and its colon.
func (s *pageScanner) key() (string, error) {
	s.space()
	if c, ok := s.peek(); !ok || c != '"' {
		return "", s.fail("expected a member name")
	}
	raw, err := s.value()
	if err != nil {
		return "", err
	}
	var key string
	if err := json.Unmarshal(raw, &key); err != nil {
		return "", fmt.Errorf("decode coderd's answer: member name: %w", err)
	}
	if !s.consume(':') {
		return "", s.fail("expected : after a member name")
	}
	return key, nil
}

// array reads an array (or null) and calls each with its elements.
func (s *pageScanner) array(each func(raw []byte) error) error {
	s.space()
	if s.literal("null") {
		return nil
	}
	if !s.consume('[') {
		return s.fail("expected an array")
	}
	if s.consume(']') {
		return nil
	}
	for {
		raw, err := s.value()
		if err != nil {
			return err
		}
		if err := each(raw); err != nil {
			s.eachErr = err
			return err
		}
		if s.consume(',') {
			continue
		}
		if s.consume(']') {
			return nil
		}
		return s.fail("expected , or ] after an element")
	}
}

func (s *pageScanner) literal(lit string) bool {
	for len(s.buf)-s.i < len(lit) && s.more() {
	}
	if len(s.buf)-s.i >= len(lit) && string(s.buf[s.i:s.i+len(lit)]) == lit {
		s.i += len(lit)
		return true
	}
	return false
}

// value skips one value and returns it; the bytes are valid until the
// scanner reads on.
func (s *pageScanner) value() ([]byte, error) {
	s.space()
	c, ok := s.peek()
	if !ok {
		return nil, s.fail("expected a value")
	}
	s.mark = s.i
	defer func() { s.mark = -1 }()
	switch c {
	case '"':
		if err := s.skipString(); err != nil {
			return nil, err
		}
	case '{', '[':
		if err := s.skipNested(); err != nil {
			return nil, err
		}
	case ',', ':', '}', ']':
		return nil, s.fail("expected a value")
	default:
		// A number or literal: up to the next delimiter.
	scan:
		for {
			for ; s.i < len(s.buf); s.i++ {
				switch s.buf[s.i] {
				case ',', '}', ']', ' ', '\t', '\n', '\r':
					break scan
				}
			}
			if !s.more() {
				break
			}
		}
	}
	return s.buf[s.mark:s.i], nil
}

// skipNested moves past the object or array starting at s.i.
func (s *pageScanner) skipNested() error {
	depth := 0
	for {
		for s.i < len(s.buf) {
			switch s.buf[s.i] {
			case '"':
				if err := s.skipString(); err != nil {
					return err
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					s.i++
					return nil
				}
			}
			s.i++
		}
		if !s.more() {
			return s.fail("unterminated object or array")
		}
	}
}

// skipString moves past the string starting at s.i. An escape's second
// byte may not have arrived yet: s.i then points past the window, and
// more() keeps the string (mark) and reads it.
func (s *pageScanner) skipString() error {
	s.i++ // the opening quote
	for {
		for s.i < len(s.buf) {
			switch s.buf[s.i] {
			case '\\':
				s.i += 2
				continue
			case '"':
				s.i++
				return nil
			}
			s.i++
		}
		if !s.more() {
			return s.fail("unterminated string")
		}
	}
}
