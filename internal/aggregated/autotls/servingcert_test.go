package autotls

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

type countingListener struct{ n atomic.Int32 }

func (l *countingListener) Enqueue() { l.n.Add(1) }

func TestServingCertNotifiesOnChange(t *testing.T) {
	now := time.Now()
	ca, err := newCA("ca", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := ca.issueServing(testNames, now, time.Hour)
	b, _ := ca.issueServing(testNames, now, time.Hour)

	s := NewServingCert("test")
	l := &countingListener{}
	s.AddListener(l)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.WaitForContent(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitForContent before Set: %v", err)
	}
	if c, k := s.CurrentCertKeyContent(); c != nil || k != nil {
		t.Fatal("content before Set")
	}

	if _, err := s.Set(a.certPEM, b.keyPEM); err == nil {
		t.Fatal("Set accepted a certificate with another key")
	}
	if changed, err := s.Set(a.certPEM, a.keyPEM); !changed || err != nil {
		t.Fatalf("Set: %v %v", changed, err)
	}
	if err := s.WaitForContent(context.Background()); err != nil {
		t.Fatal(err)
	}
	if changed, _ := s.Set(a.certPEM, a.keyPEM); changed {
		t.Error("Set of the same content reported a change")
	}
	if changed, _ := s.Set(b.certPEM, b.keyPEM); !changed {
		t.Error("Set of new content reported no change")
	}
	if c, k := s.CurrentCertKeyContent(); string(c) != string(b.certPEM) || string(k) != string(b.keyPEM) {
		t.Error("CurrentCertKeyContent is not the last Set")
	}
	if n := l.n.Load(); n != 2 {
		t.Errorf("listener told %d times, want 2 (two changes)", n)
	}
}

func TestResolveNamespace(t *testing.T) {
	env := func(v string) func(string) string { return func(string) string { return v } }
	file := func(v string, err error) func(string) ([]byte, error) {
		return func(p string) ([]byte, error) {
			if p != serviceAccountNamespaceFile {
				t.Errorf("read %s", p)
			}
			return []byte(v), err
		}
	}
	cases := []struct {
		name, configured, env, file string
		fileErr                     error
		want                        string
	}{
		{name: "configured wins", configured: "a", env: "b", file: "c", want: "a"},
		{name: "POD_NAMESPACE", env: "b", file: "c", want: "b"},
		{name: "service account file", file: "c\n", want: "c"},
	}
	for _, c := range cases {
		got, err := resolveNamespace(c.configured, env(c.env), file(c.file, c.fileErr))
		if err != nil || got != c.want {
			t.Errorf("%s: %q, %v; want %q", c.name, got, err, c.want)
		}
	}
	_, err := resolveNamespace("", env(""), file("", os.ErrNotExist))
	if err == nil {
		t.Fatal("no namespace anywhere: no error")
	}
	for _, want := range []string{"aggregatedAPIServer.autoTLS.namespace", PodNamespaceEnv, serviceAccountNamespaceFile} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}
