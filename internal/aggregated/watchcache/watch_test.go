package watchcache

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
)

func TestWatchFromNowSendsCurrentState(t *testing.T) {
	for _, rv := range []string{"", "0"} {
		t.Run("rv="+rv, func(t *testing.T) {
			c, _ := newTestCache(t, Options{})
			c.Replace("k2", []Object{obj("ns2", "b", nil)})
			c.Replace("k1", []Object{obj("ns1", "z", nil), obj("ns1", "a", nil)})
			w := startWatch(t, c, WatchOptions{ResourceVersion: rv})
			equalStrings(t, nextEvents(t, w, 3), []string{"ADDED ns1/a", "ADDED ns1/z", "ADDED ns2/b"})
			c.Delete("k1", "z")
			equalStrings(t, nextEvents(t, w, 1), []string{"DELETED ns1/z"})
			expectNoEvent(t, w)
		})
	}
}

func TestWatchInitialObjectsCarryTheirRV(t *testing.T) {
	c, _ := newTestCache(t, Options{})
	out := c.Replace("k", []Object{obj("ns", "a", nil)})
	w := startWatch(t, c, WatchOptions{})
	ev := nextEvent(t, w)
	if got := rvOf(t, ev.Object); got != out[0].GetResourceVersion() {
		t.Fatalf("initial ADDED RV = %s; want %s", got, out[0].GetResourceVersion())
	}
	// Delivered objects are copies.
	ev.Object.(Object).SetLabels(lbl("mutated", "yes"))
	if got, _ := c.Get("k", "a"); len(got.GetLabels()) != 0 {
		t.Fatal("watch event shares the stored object")
	}
}

func TestWatchSendInitialEventsFalseStartsNow(t *testing.T) {
	c, _ := newTestCache(t, Options{})
	c.Replace("k", []Object{obj("ns", "a", nil)})
	w := startWatch(t, c, WatchOptions{SendInitialEvents: ptr.To(false), AllowBookmarks: true})
	expectNoEvent(t, w)
	c.Upsert("k", obj("ns", "b", nil))
	equalStrings(t, nextEvents(t, w, 1), []string{"ADDED ns/b"})
}

func TestWatchResumeDeliversExactlyMissedEvents(t *testing.T) {
	c, _ := newTestCache(t, Options{})
	c.Replace("k", []Object{obj("ns", "a", nil), obj("ns", "b", nil)})
	listRV := c.ResourceVersion()
	objRV := c.Upsert("k", obj("ns", "a", lbl("v", "1")))[0].GetResourceVersion()
	c.Upsert("k", obj("ns", "c", nil))
	c.Delete("k", "b")

	// From the list RV: everything after it.
	w := startWatch(t, c, WatchOptions{ResourceVersion: listRV})
	equalStrings(t, nextEvents(t, w, 3), []string{"MODIFIED ns/a", "ADDED ns/c", "DELETED ns/b"})
	expectNoEvent(t, w)

	// From an object's RV: everything after that object's change.
	w2 := startWatch(t, c, WatchOptions{ResourceVersion: objRV, SendInitialEvents: ptr.To(false), AllowBookmarks: true})
	equalStrings(t, nextEvents(t, w2, 2), []string{"ADDED ns/c", "DELETED ns/b"})
	expectNoEvent(t, w2)

	// Then live events, in order, to both.
	c.Upsert("k", obj("ns", "d", nil))
	equalStrings(t, nextEvents(t, w, 1), []string{"ADDED ns/d"})
	equalStrings(t, nextEvents(t, w2, 1), []string{"ADDED ns/d"})

	// From the current RV: nothing replayed.
	w3 := startWatch(t, c, WatchOptions{ResourceVersion: c.ResourceVersion()})
	expectNoEvent(t, w3)
}

func TestWatchResumeRVsAreIncreasing(t *testing.T) {
	c, _ := newTestCache(t, Options{})
	w := startWatch(t, c, WatchOptions{ResourceVersion: c.ResourceVersion()})
	for i := range 5 {
		c.Upsert("k", obj("ns", "a", lbl("i", strconv.Itoa(i))))
	}
	c.Delete("k", "a")
	var last uint64
	for range 6 {
		seq := seqOf(t, rvOf(t, nextEvent(t, w).Object))
		if seq <= last {
			t.Fatalf("seq %d not greater than %d", seq, last)
		}
		last = seq
	}
	if list := seqOf(t, c.ResourceVersion()); list != last {
		t.Fatalf("list seq %d, last event seq %d", list, last)
	}
}

func TestWatchTooOldResourceVersion(t *testing.T) {
	c, _ := newTestCache(t, Options{HistorySize: 3})
	var rvs []string
	for i := range 5 {
		c.Upsert("k", obj("ns", "a", lbl("i", strconv.Itoa(i))))
		rvs = append(rvs, c.ResourceVersion())
	}
	// Events 1 and 2 were evicted: resuming after event 1 would miss event 2.
	_, err := c.Watch(context.Background(), WatchOptions{ResourceVersion: rvs[0]})
	if !apierrors.IsResourceExpired(err) {
		t.Fatalf("err = %v; want 410 Expired", err)
	}
	if status, ok := err.(apierrors.APIStatus); !ok || status.Status().Code != 410 {
		t.Fatalf("err = %#v; want code 410", err)
	}
	// After event 2 nothing is missing.
	w := startWatch(t, c, WatchOptions{ResourceVersion: rvs[1]})
	equalStrings(t, nextEvents(t, w, 3), []string{"MODIFIED ns/a", "MODIFIED ns/a", "MODIFIED ns/a"})
	expectNoEvent(t, w)
}

// wantExpired checks that a watch from rv is refused with the 410 Expired
// that makes client-go's reflector list again, saying why.
func wantExpired(t *testing.T, c *Cache, rv, why string) {
	t.Helper()
	w, err := c.Watch(context.Background(), WatchOptions{ResourceVersion: rv})
	if err == nil {
		w.Stop()
		t.Fatalf("watch from %q started; want 410 Expired", rv)
	}
	status, ok := err.(apierrors.APIStatus)
	if !apierrors.IsResourceExpired(err) || !ok || status.Status().Code != 410 {
		t.Fatalf("watch from %q: %#v; want 410 Expired", rv, err)
	}
	if msg := err.Error(); !strings.Contains(msg, why) || !strings.Contains(msg, "list again") {
		t.Errorf("watch from %q: message %q does not say %q and that the client must list again", rv, msg, why)
	}
	if n := c.Stats().Watchers; n != 0 {
		t.Fatalf("the refused watch left %d watchers", n)
	}
}

// TestWatchForeignResourceVersion is issue 29's two replicas behind one
// Service: B has counted a change that A had not seen when it answered a
// LIST. A watch on B from A's version must not start at "now" (it would
// miss the change A's list lacks) but answer 410, so the client lists
// again.
func TestWatchForeignResourceVersion(t *testing.T) {
	a, _ := newTestCache(t, Options{})
	b, _ := newTestCache(t, Options{})
	a.Replace("k", []Object{obj("ns", "x", nil)})
	b.Replace("k", []Object{obj("ns", "x", nil)})
	b.Upsert("k", obj("ns", "x", lbl("changed", "yes")))
	for i := range 5 {
		// A's versions run ahead of B's: they must not read as B's future
		// or past.
		a.Upsert("k", obj("ns", "y", lbl("i", strconv.Itoa(i))))
	}
	listA := a.ResourceVersion()
	objA, _ := a.Get("k", "x")

	const foreign = "issued by another replica or another instance"
	wantExpired(t, b, listA, foreign)
	wantExpired(t, b, objA.GetResourceVersion(), foreign)
	// The previous format (an older binary before an upgrade): a relist.
	for _, rv := range []string{"1700000000001999999", "1000000"} {
		wantExpired(t, b, rv, foreign)
	}
	// What no API server issued is the client's bug: 400.
	for _, rv := range []string{"abc", "-5", b.incarnation} {
		_, err := b.Watch(context.Background(), WatchOptions{ResourceVersion: rv})
		if !apierrors.IsBadRequest(err) || !strings.Contains(err.Error(), "is not a resourceVersion of this API server") {
			t.Errorf("watch from %q: %v; want 400 BadRequest", rv, err)
		}
	}
	// B's own format, but newer than anything B issued.
	wantExpired(t, b, b.listRV(seqOf(t, b.ResourceVersion())+1), "newer than any this instance")
	wantExpired(t, b, b.objectRV(seqOf(t, b.ResourceVersion())+1000, 7), "newer than any this instance")

	// After relisting on B, the watch from B's version resumes.
	w := startWatch(t, b, WatchOptions{ResourceVersion: b.ResourceVersion()})
	b.Delete("k", "x")
	equalStrings(t, nextEvents(t, w, 1), []string{"DELETED ns/x"})
}

// TestWatchResumesOwnVersionExactly: a watch from one of the cache's own
// versions, a list's or an object's, gets exactly the changes after it.
func TestWatchResumesOwnVersionExactly(t *testing.T) {
	c, _ := newTestCache(t, Options{})
	// The version of a new cache, before any change, is resumable too.
	created := c.ResourceVersion()
	first := c.Upsert("k", obj("ns", "a", nil))[0].GetResourceVersion()
	c.Upsert("k", obj("ns", "b", nil))
	mid := c.ResourceVersion()
	c.Upsert("k", obj("ns", "a", lbl("v", "2")))
	c.Delete("k", "b")

	for _, tc := range []struct {
		rv   string
		want []string
	}{
		{created, []string{"ADDED ns/a", "ADDED ns/b", "MODIFIED ns/a", "DELETED ns/b"}},
		{first, []string{"ADDED ns/b", "MODIFIED ns/a", "DELETED ns/b"}},
		{mid, []string{"MODIFIED ns/a", "DELETED ns/b"}},
		{c.ResourceVersion(), nil},
	} {
		w := startWatch(t, c, WatchOptions{ResourceVersion: tc.rv})
		equalStrings(t, nextEvents(t, w, len(tc.want)), tc.want)
		expectNoEvent(t, w)
		w.Stop()
	}
}

// TestPreconditionAcrossCaches: an update's resourceVersion precondition
// handed out by one replica is checked against another replica's version
// of the object: the same content matches, other content does not.
func TestPreconditionAcrossCaches(t *testing.T) {
	a, _ := newTestCache(t, Options{})
	b, _ := newTestCache(t, Options{})
	// B numbers differently: it has seen more changes.
	for i := range 3 {
		b.Upsert("k", obj("ns", "other", lbl("i", strconv.Itoa(i))))
	}
	fromA := a.Upsert("k", obj("ns", "x", lbl("team", "a")))[0].GetResourceVersion()
	onB := b.Upsert("k", obj("ns", "x", lbl("team", "a")))[0].GetResourceVersion()
	if fromA == onB {
		t.Fatalf("two caches issued the same version %q", fromA)
	}
	if !SameContent(fromA, onB) {
		t.Errorf("SameContent(%q, %q) = false for the same content on two replicas", fromA, onB)
	}
	changed := b.Upsert("k", obj("ns", "x", lbl("team", "b")))[0].GetResourceVersion()
	if SameContent(fromA, changed) {
		t.Errorf("SameContent(%q, %q) = true after the content changed", fromA, changed)
	}
	// A list version is no object's version.
	if SameContent(a.ResourceVersion(), onB) {
		t.Errorf("a list version matched object version %q", onB)
	}
}

func TestCheckExact(t *testing.T) {
	a, _ := newTestCache(t, Options{})
	b, _ := newTestCache(t, Options{})
	a.Upsert("k", obj("ns", "x", nil))
	old := a.ResourceVersion()
	objRV := a.Upsert("k", obj("ns", "y", nil))[0].GetResourceVersion()
	if err := a.CheckExact(a.ResourceVersion()); err != nil {
		t.Errorf("Exact at the latest list version: %v", err)
	}
	if err := a.CheckExact(objRV); err != nil {
		t.Errorf("Exact at the latest object version: %v", err)
	}
	for _, rv := range []string{old, b.ResourceVersion(), "1700000000001999999", a.listRV(99)} {
		if err := a.CheckExact(rv); !apierrors.IsResourceExpired(err) {
			t.Errorf("Exact at %q: %v; want 410 Expired", rv, err)
		}
	}
	if !a.Issued(old) || !a.Issued(a.ResourceVersion()) || a.Issued(b.ResourceVersion()) || a.Issued(a.listRV(99)) || a.Issued("0") {
		t.Error("Issued does not tell this cache's versions from others")
	}
}

func TestWatchInitialEventsIgnoreForeignVersion(t *testing.T) {
	c, _ := newTestCache(t, Options{})
	other, _ := newTestCache(t, Options{})
	c.Upsert("k", obj("ns", "a", nil))
	// sendInitialEvents=true serves the current state whatever the version
	// (the storage made it fresh first).
	for _, rv := range []string{other.ResourceVersion(), "1700000000001999999", "x"} {
		w := startWatch(t, c, WatchOptions{SendInitialEvents: ptr.To(true), AllowBookmarks: true, ResourceVersion: rv})
		equalStrings(t, nextEvents(t, w, 2), []string{"ADDED ns/a", "BOOKMARK " + c.ResourceVersion()})
		w.Stop()
	}
}

func TestWatchSendInitialEvents(t *testing.T) {
	for _, rv := range []string{"", "0", "SET"} {
		t.Run("rv="+rv, func(t *testing.T) {
			c, _ := newTestCache(t, Options{})
			c.Replace("k", []Object{obj("ns", "b", nil), obj("ns", "a", lbl("skip", "1"))})
			if rv == "SET" {
				rv = c.ResourceVersion()
			}
			listRV := c.ResourceVersion()
			w := startWatch(t, c, WatchOptions{
				ResourceVersion:   rv,
				SendInitialEvents: ptr.To(true),
				AllowBookmarks:    true,
				Match:             func(o Object) bool { return o.GetLabels()["skip"] == "" },
			})
			equalStrings(t, nextEvents(t, w, 1), []string{"ADDED ns/b"})
			bm := nextEvent(t, w)
			if bm.Type != watch.Bookmark {
				t.Fatalf("got %s; want BOOKMARK", describe(bm))
			}
			o := bm.Object.(Object)
			if o.GetResourceVersion() != listRV {
				t.Fatalf("bookmark RV = %s; want list RV %s", o.GetResourceVersion(), listRV)
			}
			if o.GetAnnotations()[metav1.InitialEventsAnnotationKey] != "true" {
				t.Fatalf("bookmark annotations = %v", o.GetAnnotations())
			}
			if o.GetName() != "" || o.GetNamespace() != "" {
				t.Fatal("bookmark object is not empty")
			}
			if _, ok := bm.Object.(*metav1.PartialObjectMetadata); !ok {
				t.Fatalf("bookmark object is %T; want the kind's type", bm.Object)
			}
			c.Upsert("k", obj("ns", "c", nil))
			equalStrings(t, nextEvents(t, w, 1), []string{"ADDED ns/c"})
			expectNoEvent(t, w)
		})
	}
}

// kube-apiserver's handler defaults a legacy watch from "" to
// sendInitialEvents=true without bookmarks: initial events, no bookmark.
func TestWatchSendInitialEventsWithoutBookmarks(t *testing.T) {
	c, _ := newTestCache(t, Options{})
	c.Replace("k", []Object{obj("ns", "a", nil)})
	w := startWatch(t, c, WatchOptions{SendInitialEvents: ptr.To(true)})
	equalStrings(t, nextEvents(t, w, 1), []string{"ADDED ns/a"})
	c.Upsert("k", obj("ns", "b", nil))
	equalStrings(t, nextEvents(t, w, 1), []string{"ADDED ns/b"})
	expectNoEvent(t, w)
}

func TestWatchPeriodicBookmarks(t *testing.T) {
	c, fc := newTestCache(t, Options{BookmarkInterval: time.Minute})
	c.Upsert("k", obj("ns", "a", nil))
	w := startWatch(t, c, WatchOptions{ResourceVersion: c.ResourceVersion(), AllowBookmarks: true})
	plain := startWatch(t, c, WatchOptions{ResourceVersion: c.ResourceVersion()})
	// Only the bookmarking watcher registers a timer.
	waitFor(t, "bookmark timer", func() bool { return fc.Waiters() == 1 })

	fc.Step(59 * time.Second)
	expectNoEvent(t, w)
	fc.Step(time.Second)
	bm := nextEvent(t, w)
	if bm.Type != watch.Bookmark || rvOf(t, bm.Object) != c.ResourceVersion() {
		t.Fatalf("got %s; want BOOKMARK %s", describe(bm), c.ResourceVersion())
	}
	if len(bm.Object.(Object).GetAnnotations()) != 0 {
		t.Fatal("periodic bookmark carries the initial-events-end annotation")
	}

	c.Upsert("k", obj("ns", "b", nil))
	equalStrings(t, nextEvents(t, w, 1), []string{"ADDED ns/b"})
	fc.Step(time.Minute)
	bm = nextEvent(t, w)
	if bm.Type != watch.Bookmark || rvOf(t, bm.Object) != c.ResourceVersion() {
		t.Fatalf("got %s; want BOOKMARK %s", describe(bm), c.ResourceVersion())
	}
	equalStrings(t, nextEvents(t, plain, 1), []string{"ADDED ns/b"})
	expectNoEvent(t, plain)
}

func TestWatchBookmarkWaitsForPendingEvents(t *testing.T) {
	c, fc := newTestCache(t, Options{BookmarkInterval: time.Minute})
	w := startWatch(t, c, WatchOptions{ResourceVersion: c.ResourceVersion(), AllowBookmarks: true})
	waitFor(t, "bookmark timer", func() bool { return fc.Waiters() == 1 })
	// Queue events the consumer has not read, then let the bookmark fire:
	// the bookmark must come after them, never claim a version before them.
	for i := range 3 {
		c.Upsert("k", obj("ns", "a", lbl("i", strconv.Itoa(i))))
	}
	fc.Step(time.Minute)
	equalStrings(t, nextEvents(t, w, 3), []string{"ADDED ns/a", "MODIFIED ns/a", "MODIFIED ns/a"})
	bm := nextEvent(t, w)
	if bm.Type != watch.Bookmark || rvOf(t, bm.Object) != c.ResourceVersion() {
		t.Fatalf("got %s; want BOOKMARK %s", describe(bm), c.ResourceVersion())
	}
}

func TestWatchSelectorTransitions(t *testing.T) {
	c, _ := newTestCache(t, Options{})
	teamA := func(o Object) bool { return o.GetLabels()["team"] == "a" }
	startRV := c.ResourceVersion()
	w := startWatch(t, c, WatchOptions{ResourceVersion: startRV, Match: teamA})

	c.Upsert("k", obj("ns", "x", lbl("team", "a")))
	c.Upsert("k", obj("ns", "other", lbl("team", "b")))
	c.Upsert("k", obj("ns", "x", lbl("team", "b")))
	c.Upsert("k", obj("ns", "x", lbl("team", "b", "more", "1")))
	c.Upsert("k", obj("ns", "x", lbl("team", "a")))
	c.Upsert("k", obj("ns", "x", lbl("team", "a", "more", "1")))
	c.Delete("k", "other")
	c.Delete("k", "x")
	want := []string{"ADDED ns/x", "DELETED ns/x", "ADDED ns/x", "MODIFIED ns/x", "DELETED ns/x"}

	var evs []watch.Event
	for range len(want) {
		evs = append(evs, nextEvent(t, w))
	}
	var got []string
	for _, ev := range evs {
		got = append(got, describe(ev))
	}
	equalStrings(t, got, want)
	expectNoEvent(t, w)

	// The DELETED for leaving the selector carries the last matching content
	// with a version newer than the ADDED before it.
	gone := evs[1].Object.(Object)
	if gone.GetLabels()["team"] != "a" {
		t.Fatalf("transition DELETED carries %v; want the previous (matching) content", gone.GetLabels())
	}
	if !SameContent(gone.GetResourceVersion(), rvOf(t, evs[0].Object)) {
		t.Fatal("transition DELETED RV does not identify the previous content")
	}
	if seqOf(t, gone.GetResourceVersion()) <= seqOf(t, rvOf(t, evs[0].Object)) {
		t.Fatal("transition DELETED RV is not newer")
	}

	// Replaying history applies the same rules.
	w2 := startWatch(t, c, WatchOptions{ResourceVersion: startRV, Match: teamA})
	equalStrings(t, nextEvents(t, w2, len(want)), want)
	expectNoEvent(t, w2)
}

func TestWatchBackendFilter(t *testing.T) {
	c, _ := newTestCache(t, Options{})
	c.Replace("ns1/cp", []Object{obj("ns1", "a", nil)})
	c.Replace("ns2/cp", []Object{obj("ns2", "b", nil)})
	only1 := func(key string) bool { return key == "ns1/cp" }
	w := startWatch(t, c, WatchOptions{Backend: only1})
	equalStrings(t, nextEvents(t, w, 1), []string{"ADDED ns1/a"})
	c.Upsert("ns2/cp", obj("ns2", "c", nil))
	c.Drop("ns2/cp")
	c.Upsert("ns1/cp", obj("ns1", "d", nil))
	equalStrings(t, nextEvents(t, w, 1), []string{"ADDED ns1/d"})
	expectNoEvent(t, w)
}

func TestSlowWatcherIsTerminatedWithoutBlockingOthers(t *testing.T) {
	c, _ := newTestCache(t, Options{WatcherBuffer: 2})
	rv := c.ResourceVersion()
	slow := startWatch(t, c, WatchOptions{ResourceVersion: rv})

	fast := startWatch(t, c, WatchOptions{ResourceVersion: rv})

	// Each Upsert is its own batch; none may block on the slow watcher. The
	// fast consumer keeps up, so it stays.
	for i := range 20 {
		c.Upsert("k", obj("ns", "o"+strconv.Itoa(i), nil))
		equalStrings(t, nextEvents(t, fast, 1), []string{"ADDED ns/o" + strconv.Itoa(i)})
	}
	waitFor(t, "slow watcher removed", func() bool { return c.Stats().Watchers == 1 })
	n := 0
	for range slow.ResultChan() {
		n++
	}
	if n >= 20 {
		t.Fatalf("slow watcher got all %d events; want it terminated", n)
	}
	// The client re-watches from the last version it saw and catches up.
	again := startWatch(t, c, WatchOptions{ResourceVersion: rv})
	if got := len(nextEvents(t, again, 20)); got != 20 {
		t.Fatalf("re-watch replayed %d events", got)
	}
}

func TestLargeBatchDoesNotTerminateWatcher(t *testing.T) {
	c, _ := newTestCache(t, Options{WatcherBuffer: 2})
	w := startWatch(t, c, WatchOptions{ResourceVersion: c.ResourceVersion()})
	var objs []Object
	for i := range 50 {
		objs = append(objs, obj("ns", "o"+strconv.Itoa(i), nil))
	}
	// One Replace is one batch: a burst, not a slow consumer.
	c.Replace("k", objs)
	if n := len(nextEvents(t, w, 50)); n != 50 {
		t.Fatalf("got %d events", n)
	}
	c.Upsert("k", obj("ns", "later", nil))
	equalStrings(t, nextEvents(t, w, 1), []string{"ADDED ns/later"})
}

func TestWatchStopAndCancelReleaseEverything(t *testing.T) {
	baseline := runtime.NumGoroutine()
	c, fc := newTestCache(t, Options{BookmarkInterval: time.Minute})
	c.Upsert("k", obj("ns", "a", nil))

	// Stop with undelivered events and a consumer that never reads.
	w1, err := c.Watch(context.Background(), WatchOptions{AllowBookmarks: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w2, err := c.Watch(ctx, WatchOptions{AllowBookmarks: true, SendInitialEvents: ptr.To(true)})
	if err != nil {
		t.Fatal(err)
	}
	if n := c.Stats().Watchers; n != 2 {
		t.Fatalf("watchers = %d", n)
	}
	w1.Stop()
	w1.Stop() // idempotent
	expectClosed(t, w1)
	cancel()
	expectClosed(t, w2)
	w2.Stop()
	if n := c.Stats().Watchers; n != 0 {
		t.Fatalf("watchers = %d after stop", n)
	}
	if fc.HasWaiters() {
		t.Fatal("bookmark timers still registered")
	}
	c.Upsert("k", obj("ns", "b", nil)) // no watcher left to dispatch to
	checkGoroutines(t, baseline)
}
