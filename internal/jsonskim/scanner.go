// Package jsonskim walks JSON by its structure alone (strings, brackets,
// delimiters), so that a reader can pick out the few values it decodes
// and pass over the rest without decoding or validating them: a list of
// hundreds of objects of which a caller reads a handful of fields, or a
// page of coderd's answer read as it arrives.
//
// A Scanner never panics on malformed input and reports it as an error
// where the structure breaks, but it does not check what it passes over:
// a number, literal or string it skips is taken as it is, to be decoded
// (and so validated) by encoding/json if the caller wants it.
package jsonskim

import (
	"bytes"
	"errors"
	"fmt"
	"io"
)

// readChunk is how much a Scanner reading a stream asks for at a time;
// its window grows beyond that only for a value that does not fit.
const readChunk = 64 << 10

// Scanner walks one JSON document, held whole (NewBytes) or read as it
// arrives (NewReader) through a window that holds the value being
// skipped and what has been read past it, not the whole stream.
type Scanner struct {
	r io.Reader
	// buf holds the stream from the start of the value being skipped
	// (mark) or from the next byte (i) on; more() moves what it keeps to
	// the front before reading again.
	buf []byte
	i   int
	// mark is where in buf the value being skipped starts, or -1.
	mark int
	// off is how many bytes of the stream came before buf[0].
	off int64
	// rerr is the reader's error once it returned one (io.EOF at the end).
	rerr error
}

// NewBytes scans data; the values it returns are slices of data.
func NewBytes(data []byte) *Scanner {
	return &Scanner{buf: data, mark: -1, rerr: io.EOF}
}

// NewReader scans what it reads from r; the values it returns are valid
// until the scanner reads on.
func NewReader(r io.Reader) *Scanner {
	return &Scanner{r: r, mark: -1}
}

// SyntaxError is JSON whose structure breaks at Offset.
type SyntaxError struct {
	Offset int64
	msg    string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("invalid JSON at offset %d: %s", e.Offset, e.msg)
}

// Errorf returns a *SyntaxError at the scanner's offset.
func (s *Scanner) Errorf(format string, args ...any) error {
	return &SyntaxError{Offset: s.Offset(), msg: fmt.Sprintf(format, args...)}
}

// Offset is how far into the document the scanner is.
func (s *Scanner) Offset() int64 { return s.off + int64(s.i) }

// ReadErr is the error the reader failed with, if any: a scan that ends
// in an error because the stream broke off is told apart from one that
// ends because the JSON is malformed.
func (s *Scanner) ReadErr() error {
	if errors.Is(s.rerr, io.EOF) {
		return nil
	}
	return s.rerr
}

// more reads more of the stream into buf; false once the stream ended or
// failed.
func (s *Scanner) more() bool {
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
	if cap(s.buf)-len(s.buf) < readChunk/2 {
		grown := make([]byte, len(s.buf), max(2*cap(s.buf), readChunk))
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

// space moves past white space.
func (s *Scanner) space() {
	for {
		for ; s.i < len(s.buf); s.i++ {
			switch s.buf[s.i] {
			case ' ', '\t', '\n', '\r':
			default:
				return
			}
		}
		if !s.more() {
			return
		}
	}
}

// Peek returns the next byte after white space without consuming it;
// false at the end.
func (s *Scanner) Peek() (byte, bool) {
	s.space()
	if s.i < len(s.buf) {
		return s.buf[s.i], true
	}
	return 0, false
}

// Consume moves past white space and c if c comes next.
func (s *Scanner) Consume(c byte) bool {
	if next, ok := s.Peek(); ok && next == c {
		s.i++
		return true
	}
	return false
}

// Literal moves past white space and lit if lit comes next.
func (s *Scanner) Literal(lit string) bool {
	s.space()
	for len(s.buf)-s.i < len(lit) && s.more() {
	}
	if len(s.buf)-s.i >= len(lit) && string(s.buf[s.i:s.i+len(lit)]) == lit {
		s.i += len(lit)
		return true
	}
	return false
}

// End moves past white space and reports whether the document ends there.
func (s *Scanner) End() bool {
	_, ok := s.Peek()
	return !ok
}

// Value moves past the next value and returns its bytes: a string with
// its quotes, an object or array with all it holds, or a number or
// literal up to the next delimiter.
func (s *Scanner) Value() ([]byte, error) {
	c, ok := s.Peek()
	if !ok {
		return nil, s.Errorf("expected a value")
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
		return nil, s.Errorf("expected a value")
	default:
	literal:
		for {
			for ; s.i < len(s.buf); s.i++ {
				switch s.buf[s.i] {
				case ',', ':', '}', ']', ' ', '\t', '\n', '\r':
					break literal
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
func (s *Scanner) skipNested() error {
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
			return s.Errorf("unterminated object or array")
		}
	}
}

// skipString moves past the string starting at s.i, inside the value
// that starts at s.mark. It looks for each quote with bytes.IndexByte
// (long strings are most of a list's bytes) and counts the backslashes
// before it: an odd number escapes it. The string is in buf from its
// opening quote, which stops the count, since more() keeps the value
// from mark.
func (s *Scanner) skipString() error {
	s.i++ // the opening quote
	for {
		if j := bytes.IndexByte(s.buf[s.i:], '"'); j >= 0 {
			end := s.i + j
			backslashes := 0
			for k := end - 1; k > s.mark && s.buf[k] == '\\'; k-- {
				backslashes++
			}
			s.i = end + 1
			if backslashes%2 == 0 {
				return nil
			}
			continue
		}
		s.i = len(s.buf)
		if !s.more() {
			return s.Errorf("unterminated string")
		}
	}
}
