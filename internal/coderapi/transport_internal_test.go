package coderapi

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// TestLimitedBody reads bodies at, and one byte past, the limit.
func TestLimitedBody(t *testing.T) {
	tooLarge := errors.New("too large")
	for _, tc := range []struct {
		body    string
		wantErr error
		wantLen int
	}{
		{"0123456789", nil, 10},
		{"0123456789A", tooLarge, 10},
		{strings.Repeat("x", 100), tooLarge, 10},
		{"", nil, 0},
	} {
		b := &limitedBody{body: io.NopCloser(strings.NewReader(tc.body)), left: 10, err: tooLarge}
		got, err := io.ReadAll(b)
		if !errors.Is(err, tc.wantErr) || len(got) != tc.wantLen {
			t.Errorf("body of %d bytes: read %d bytes, err %v; want %d bytes, err %v", len(tc.body), len(got), err, tc.wantLen, tc.wantErr)
		}
		// Reading on after the limit keeps failing.
		if tc.wantErr != nil {
			if n, err := b.Read(make([]byte, 4)); n != 0 || !errors.Is(err, tooLarge) {
				t.Errorf("read after the limit: %d, %v", n, err)
			}
		}
	}
}
