package storage

import (
	"encoding/json"
	"errors"
	"fmt"
)

// splitWorkspacesPage splits one page of coderd's GET /api/v2/workspaces,
// {"workspaces":[...],"count":N}, into each workspace's JSON without
// decoding the workspaces: a list decodes only those whose JSON it has
// not seen before (see listWorkspaces), and encoding/json's decoder
// would scan the whole page twice just to find where each one ends.
//
// It checks the page's structure (an object whose "workspaces" is an
// array or null and whose "count" is a number) and finds each element's
// end by its brackets and strings; it does not validate the elements
// themselves: each is either byte for byte a workspace decoded before or
// is decoded (and validated) with encoding/json. Members other than
// those two are skipped the same way. The elements alias data.
func splitWorkspacesPage(data []byte) (raws []json.RawMessage, count int, err error) {
	s := pageScanner{data: data}
	if !s.consume('{') {
		return nil, 0, s.fail("expected an object")
	}
	sawCount := false
	if !s.consume('}') {
		for {
			key, err := s.key()
			if err != nil {
				return nil, 0, err
			}
			switch key {
			case "workspaces":
				if raws, err = s.array(); err != nil {
					return nil, 0, err
				}
			case "count":
				start, end, err := s.value()
				if err != nil {
					return nil, 0, err
				}
				if err := json.Unmarshal(data[start:end], &count); err != nil {
					return nil, 0, fmt.Errorf("count: %w", err)
				}
				sawCount = true
			default:
				if _, _, err := s.value(); err != nil {
					return nil, 0, err
				}
			}
			if s.consume(',') {
				continue
			}
			if s.consume('}') {
				break
			}
			return nil, 0, s.fail("expected , or } after a member")
		}
	}
	s.space()
	if s.i != len(data) {
		return nil, 0, s.fail("unexpected data after the object")
	}
	if !sawCount {
		// coderd always sends it; without it every page would look
		// inconsistent.
		return nil, 0, errors.New(`no "count" member`)
	}
	return raws, count, nil
}

// pageScanner walks a JSON document by its structure only.
type pageScanner struct {
	data []byte
	i    int
}

func (s *pageScanner) fail(what string) error {
	return fmt.Errorf("invalid JSON at offset %d: %s", s.i, what)
}

func (s *pageScanner) space() {
	for s.i < len(s.data) {
		switch s.data[s.i] {
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
	if s.i < len(s.data) && s.data[s.i] == c {
		s.i++
		return true
	}
	return false
}

// key reads a member's name and its colon.
func (s *pageScanner) key() (string, error) {
	s.space()
	if s.i >= len(s.data) || s.data[s.i] != '"' {
		return "", s.fail("expected a member name")
	}
	start := s.i
	if err := s.skipString(); err != nil {
		return "", err
	}
	var key string
	if err := json.Unmarshal(s.data[start:s.i], &key); err != nil {
		return "", fmt.Errorf("member name: %w", err)
	}
	if !s.consume(':') {
		return "", s.fail("expected : after a member name")
	}
	return key, nil
}

// array reads an array (or null) and returns its elements.
func (s *pageScanner) array() ([]json.RawMessage, error) {
	s.space()
	if s.literal("null") {
		return nil, nil
	}
	if !s.consume('[') {
		return nil, s.fail("expected an array")
	}
	var out []json.RawMessage
	if s.consume(']') {
		return out, nil
	}
	for {
		start, end, err := s.value()
		if err != nil {
			return nil, err
		}
		out = append(out, json.RawMessage(s.data[start:end:end]))
		if s.consume(',') {
			continue
		}
		if s.consume(']') {
			return out, nil
		}
		return nil, s.fail("expected , or ] after an element")
	}
}

func (s *pageScanner) literal(lit string) bool {
	if len(s.data)-s.i >= len(lit) && string(s.data[s.i:s.i+len(lit)]) == lit {
		s.i += len(lit)
		return true
	}
	return false
}

// value skips one value and returns where it starts and ends.
func (s *pageScanner) value() (int, int, error) {
	s.space()
	start := s.i
	if s.i >= len(s.data) {
		return 0, 0, s.fail("expected a value")
	}
	switch s.data[s.i] {
	case '"':
		if err := s.skipString(); err != nil {
			return 0, 0, err
		}
	case '{', '[':
		depth := 0
	scan:
		for {
			if s.i >= len(s.data) {
				return 0, 0, s.fail("unterminated object or array")
			}
			switch s.data[s.i] {
			case '"':
				if err := s.skipString(); err != nil {
					return 0, 0, err
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			s.i++
			if depth == 0 {
				break scan
			}
		}
	case ',', ':', '}', ']':
		return 0, 0, s.fail("expected a value")
	default:
		// A number or literal: up to the next delimiter.
		for s.i < len(s.data) {
			c := s.data[s.i]
			if c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r' {
				break
			}
			s.i++
		}
	}
	return start, s.i, nil
}

// skipString moves past the string starting at s.i.
func (s *pageScanner) skipString() error {
	s.i++ // the opening quote
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case '\\':
			s.i += 2
			continue
		case '"':
			s.i++
			return nil
		}
		s.i++
	}
	return s.fail("unterminated string")
}
