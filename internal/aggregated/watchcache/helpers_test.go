package watchcache

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	clocktesting "k8s.io/utils/clock/testing"
)

// start is the fake clock's initial time; seqs start at its Unix millis.
var start = time.UnixMilli(1_700_000_000_000)

func newObject() Object {
	return &metav1.PartialObjectMetadata{
		TypeMeta: metav1.TypeMeta{APIVersion: "test/v1", Kind: "Thing"},
	}
}

func obj(ns, name string, labels map[string]string) Object {
	return &metav1.PartialObjectMetadata{
		TypeMeta:   metav1.TypeMeta{APIVersion: "test/v1", Kind: "Thing"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
	}
}

func lbl(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func newTestCache(t *testing.T, opts Options) (*Cache, *clocktesting.FakeClock) {
	t.Helper()
	fc := clocktesting.NewFakeClock(start)
	if opts.Clock == nil {
		opts.Clock = fc
	}
	if opts.NewObject == nil {
		opts.NewObject = newObject
	}
	c, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c, fc
}

func startWatch(t *testing.T, c *Cache, opts WatchOptions) watch.Interface {
	t.Helper()
	w, err := c.Watch(context.Background(), opts)
	if err != nil {
		t.Fatalf("Watch(%+v): %v", opts, err)
	}
	t.Cleanup(w.Stop)
	return w
}

func nextEvent(t *testing.T, w watch.Interface) watch.Event {
	t.Helper()
	select {
	case ev, ok := <-w.ResultChan():
		if !ok {
			t.Fatal("result channel closed; wanted an event")
		}
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("timed out waiting for an event")
	}
	return watch.Event{}
}

func expectNoEvent(t *testing.T, w watch.Interface) {
	t.Helper()
	select {
	case ev, ok := <-w.ResultChan():
		if !ok {
			t.Fatal("result channel closed; wanted it open")
		}
		t.Fatalf("unexpected event %s", describe(ev))
	case <-time.After(30 * time.Millisecond):
	}
}

func expectClosed(t *testing.T, w watch.Interface) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-w.ResultChan():
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("result channel not closed")
		}
	}
}

// describe renders an event as "TYPE ns/name" for compact comparisons.
func describe(ev watch.Event) string {
	o, ok := ev.Object.(Object)
	if !ok {
		return fmt.Sprintf("%s %T", ev.Type, ev.Object)
	}
	if ev.Type == watch.Bookmark {
		return fmt.Sprintf("BOOKMARK %s", o.GetResourceVersion())
	}
	return fmt.Sprintf("%s %s/%s", ev.Type, o.GetNamespace(), o.GetName())
}

func nextEvents(t *testing.T, w watch.Interface, n int) []string {
	t.Helper()
	out := make([]string, 0, n)
	for range n {
		out = append(out, describe(nextEvent(t, w)))
	}
	return out
}

func equalStrings(t *testing.T, got, want []string) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got\n  %q\nwant\n  %q", got, want)
	}
}

func rvOf(t *testing.T, o any) string {
	t.Helper()
	m, ok := o.(Object)
	if !ok {
		t.Fatalf("%T is not an Object", o)
	}
	return m.GetResourceVersion()
}

func seqOf(t *testing.T, rv string) uint64 {
	t.Helper()
	v, err := parseVersion(rv)
	if err != nil {
		t.Fatalf("parseVersion(%q): %v", rv, err)
	}
	return v.seq
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// checkGoroutines fails if the goroutine count does not return to baseline.
func checkGoroutines(t *testing.T, baseline int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > baseline {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("goroutines: %d > baseline %d\n%s", runtime.NumGoroutine(), baseline, buf[:n])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fakeSource lists a configurable object set and counts calls.
type fakeSource struct {
	key   string
	calls atomic.Int64

	mu   sync.Mutex
	objs []Object
	err  error
	// block, when set, is waited on (or ctx) before answering.
	block chan struct{}
	// entered is signalled (non-blocking) when List is called.
	entered chan struct{}
}

func newFakeSource(key string, objs ...Object) *fakeSource {
	return &fakeSource{key: key, objs: objs, entered: make(chan struct{}, 100)}
}

func (s *fakeSource) Key() string { return s.key }

func (s *fakeSource) set(objs ...Object) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.objs, s.err = objs, nil
}

func (s *fakeSource) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

func (s *fakeSource) setBlock(ch chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.block = ch
}

func (s *fakeSource) List(ctx context.Context) ([]Object, error) {
	s.calls.Add(1)
	select {
	case s.entered <- struct{}{}:
	default:
	}
	s.mu.Lock()
	block := s.block
	s.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	// Fresh copies: the cache owns what List returns.
	out := make([]Object, 0, len(s.objs))
	for _, o := range s.objs {
		out = append(out, deepCopy(o))
	}
	return out, nil
}

// fakeSources is a mutable Sources function.
type fakeSources struct {
	mu   sync.Mutex
	srcs []Source
	err  error
}

func (f *fakeSources) set(srcs ...Source) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.srcs, f.err = srcs, nil
}

func (f *fakeSources) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *fakeSources) list(context.Context) ([]Source, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	return append([]Source(nil), f.srcs...), nil
}
