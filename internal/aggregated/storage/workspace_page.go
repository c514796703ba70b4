package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/coder/coder-k8s/internal/jsonskim"
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
// end by its brackets and strings (jsonskim); it does not validate the elements
// themselves: each is either byte for byte a workspace decoded before or
// is decoded (and validated) with encoding/json. Members other than
// those two are skipped the same way. An error from each ends the scan
// and is returned as it is; a failed read is told apart from a malformed
// answer.
func scanWorkspacesPage(r io.Reader, each func(raw []byte) error) (count int, err error) {
	s := jsonskim.NewReader(r)
	var eachErr error
	defer func() {
		if err != nil && err != eachErr && s.ReadErr() != nil {
			err = fmt.Errorf("read coderd's answer: %w", s.ReadErr())
		}
	}()
	if !s.Consume('{') {
		return 0, malformed(s.Errorf("expected an object"))
	}
	sawCount := false
	if !s.Consume('}') {
		for {
			key, err := memberName(s)
			if err != nil {
				return 0, err
			}
			switch key {
			case "workspaces":
				if err := elements(s, func(raw []byte) error { eachErr = each(raw); return eachErr }); err != nil {
					return 0, err
				}
			case "count":
				raw, err := s.Value()
				if err != nil {
					return 0, malformed(err)
				}
				if err := json.Unmarshal(raw, &count); err != nil {
					return 0, fmt.Errorf("decode coderd's answer: count: %w", err)
				}
				sawCount = true
			default:
				if _, err := s.Value(); err != nil {
					return 0, malformed(err)
				}
			}
			if s.Consume(',') {
				continue
			}
			if s.Consume('}') {
				break
			}
			return 0, malformed(s.Errorf("expected , or } after a member"))
		}
	}
	if !s.End() {
		return 0, malformed(s.Errorf("unexpected data after the object"))
	}
	if !sawCount {
		// coderd always sends it; without it every page would look
		// inconsistent.
		return 0, errors.New(`decode coderd's answer: no "count" member`)
	}
	return count, nil
}

// malformed says that err is in coderd's answer.
func malformed(err error) error {
	return fmt.Errorf("decode coderd's answer: %w", err)
}

// memberName reads a member's name and its colon.
func memberName(s *jsonskim.Scanner) (string, error) {
	if c, ok := s.Peek(); !ok || c != '"' {
		return "", malformed(s.Errorf("expected a member name"))
	}
	raw, err := s.Value()
	if err != nil {
		return "", malformed(err)
	}
	var key string
	if err := json.Unmarshal(raw, &key); err != nil {
		return "", fmt.Errorf("decode coderd's answer: member name: %w", err)
	}
	if !s.Consume(':') {
		return "", malformed(s.Errorf("expected : after a member name"))
	}
	return key, nil
}

// elements reads an array (or null) and calls each with its elements;
// an error of each ends it and is returned as it is.
func elements(s *jsonskim.Scanner, each func(raw []byte) error) error {
	if s.Literal("null") {
		return nil
	}
	if !s.Consume('[') {
		return malformed(s.Errorf("expected an array"))
	}
	if s.Consume(']') {
		return nil
	}
	for {
		raw, err := s.Value()
		if err != nil {
			return malformed(err)
		}
		if err := each(raw); err != nil {
			return err
		}
		if s.Consume(',') {
			continue
		}
		if s.Consume(']') {
			return nil
		}
		return malformed(s.Errorf("expected , or ] after an element"))
	}
}
