package watchcache

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestNewRequiresNewObject(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Fatal("New without NewObject succeeded")
	}
	if _, err := New(Options{NewObject: newObject, Interval: -1}); err == nil {
		t.Fatal("New with a negative interval succeeded")
	}
}

func TestParseVersion(t *testing.T) {
	for rv, want := range map[string]version{
		"0123456789ab.0":                                 {incarnation: "0123456789ab"},
		"0123456789ab.42":                                {incarnation: "0123456789ab", seq: 42},
		"0123456789ab.42.000000000007":                   {incarnation: "0123456789ab", seq: 42, fp: 7, hasFP: true},
		"ffffffffffff.18446744073709551615.ffffffffffff": {incarnation: "ffffffffffff", seq: 18446744073709551615, fp: fpMask, hasFP: true},
	} {
		got, err := parseVersion(rv)
		if err != nil || got != want {
			t.Errorf("parseVersion(%q) = %+v, %v; want %+v", rv, got, err, want)
		}
		if got.String() != rv {
			t.Errorf("version %+v formats as %q, want %q", got, got.String(), rv)
		}
	}
	for _, rv := range []string{
		"", "0", "abc",
		// The previous format: decimals.
		"1700000000001123456", "1700000000001999999",
		// Not canonical: leading zeros, upper case, short or long parts.
		"0123456789ab.042", "0123456789AB.42", "0123456789ab.42.00000000000A", "0123456789ab.42.7",
		"0123456789ab.42.0000000000007", "0123456789a.42", "0123456789abc.42",
		// Malformed.
		"0123456789ab", "0123456789ab.", "0123456789ab.-1", "0123456789ab.1.2.3",
		"0123456789ab.18446744073709551616", "0123456789ab.42.1000000000000", "g123456789ab.42", " 0123456789ab.42",
	} {
		if v, err := parseVersion(rv); err == nil {
			t.Errorf("parseVersion(%q) = %+v; want an error", rv, v)
		}
	}
}

func TestSameContent(t *testing.T) {
	cases := []struct {
		a, b string
		want bool
	}{
		// Same content stamped by two replicas (or a replica before and
		// after a restart) at different sequences.
		{"0123456789ab.5.00000001e240", "ba9876543210.9000.00000001e240", true},
		{"0123456789ab.5.00000001e240", "0123456789ab.5.00000001e241", false},
		// List and bookmark versions describe no content.
		{"0123456789ab.5", "0123456789ab.5", false},
		{"0123456789ab.5.00000001e240", "0123456789ab.5", false},
		// The previous (decimal) format: a precondition conflicts.
		{"5000123", "5000123", false},
		{"5000123", "0123456789ab.5.00000001e240", false},
		{"", "", false},
		{"x", "x", false},
		{"0123456789ab.5.00000001e240", "", false},
	}
	for _, tc := range cases {
		if got := SameContent(tc.a, tc.b); got != tc.want {
			t.Errorf("SameContent(%q, %q) = %v; want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

// expectedFP recomputes the documented fingerprint independently.
func expectedFP(t *testing.T, o Object) uint64 {
	t.Helper()
	cp := deepCopy(o)
	cp.SetResourceVersion("")
	data, err := json.Marshal(cp)
	if err != nil {
		t.Fatal(err)
	}
	h := fnv.New64a()
	_, _ = h.Write(data)
	return h.Sum64() & (1<<48 - 1)
}

func TestResourceVersionFormat(t *testing.T) {
	c, fc := newTestCache(t, Options{})
	inc := c.incarnation
	if len(inc) != 12 || strings.Trim(inc, "0123456789abcdef") != "" {
		t.Fatalf("incarnation %q is not 12 lower-case hex digits", inc)
	}
	if got, want := c.ResourceVersion(), inc+".0"; got != want {
		t.Fatalf("initial list RV = %s; want %s", got, want)
	}

	in := obj("ns1", "a", lbl("k", "v"))
	in.SetManagedFields([]metav1.ManagedFieldsEntry{{Manager: "m"}})
	in.SetResourceVersion("42")
	fp := expectedFP(t, in)
	out := c.Upsert("ns1/cp1", in)
	if len(out) != 1 {
		t.Fatalf("Upsert returned %d objects", len(out))
	}
	want := fmt.Sprintf("%s.1.%012x", inc, fp)
	if got := out[0].GetResourceVersion(); got != want {
		t.Fatalf("object RV = %s; want %s", got, want)
	}
	if got, want := c.ResourceVersion(), inc+".1"; got != want {
		t.Fatalf("list RV = %s; want %s", got, want)
	}

	// Sequences count changes whatever the clock does.
	for i, step := range []time.Duration{time.Hour, -2 * time.Hour, 0} {
		fc.SetTime(fc.Now().Add(step))
		out = c.Upsert("ns1/cp1", obj("ns1", "a", lbl("k", strconv.Itoa(i))))
		if got, want := seqOf(t, out[0].GetResourceVersion()), uint64(i+2); got != want {
			t.Fatalf("seq = %d after clock step %s; want %d", got, step, want)
		}
	}
	if got, want := c.ResourceVersion(), inc+".4"; got != want {
		t.Fatalf("list RV = %s; want %s", got, want)
	}

	// Every cache is an incarnation of its own.
	other, _ := newTestCache(t, Options{})
	if other.incarnation == inc {
		t.Fatalf("two caches share incarnation %q", inc)
	}
}

func TestIdenticalContentIsNoChange(t *testing.T) {
	c, fc := newTestCache(t, Options{})
	first := c.Replace("k", []Object{obj("ns", "a", lbl("x", "1")), obj("ns", "b", nil)})
	events := c.Stats().Events
	listRV := c.ResourceVersion()
	fc.Step(time.Minute)

	// A different incoming resourceVersion does not count as content.
	again := obj("ns", "a", lbl("x", "1"))
	again.SetResourceVersion("1")
	second := c.Replace("k", []Object{again, obj("ns", "b", nil)})
	third := c.Upsert("k", obj("ns", "a", lbl("x", "1")))

	if got := c.Stats().Events; got != events {
		t.Fatalf("events = %d after identical content; want %d", got, events)
	}
	if c.ResourceVersion() != listRV {
		t.Fatal("list RV moved without a change")
	}
	for i := range first {
		if first[i].GetResourceVersion() != second[i].GetResourceVersion() {
			t.Fatalf("object %d RV changed: %s -> %s", i, first[i].GetResourceVersion(), second[i].GetResourceVersion())
		}
	}
	if third[0].GetResourceVersion() != first[0].GetResourceVersion() {
		t.Fatal("Upsert of identical content changed the RV")
	}
	// Field ownership is content: a change of it alone is a change.
	owned := obj("ns", "a", lbl("x", "1"))
	owned.SetManagedFields([]metav1.ManagedFieldsEntry{{Manager: "other"}})
	fourth := c.Upsert("k", owned)
	if fourth[0].GetResourceVersion() == first[0].GetResourceVersion() {
		t.Fatal("a managedFields change kept the RV")
	}
	if got, _ := c.Get("k", "a"); len(got.GetManagedFields()) != 1 {
		t.Fatal("a managedFields change was not stored")
	}
}

func TestReplaceEvents(t *testing.T) {
	c, _ := newTestCache(t, Options{})
	c.Replace("k", []Object{obj("ns", "a", nil), obj("ns", "b", nil)})
	bBefore, _ := c.Get("k", "b")
	w := startWatch(t, c, WatchOptions{ResourceVersion: c.ResourceVersion()})

	out := c.Replace("k", []Object{obj("ns", "c", nil), obj("ns", "a", lbl("changed", "yes"))})
	if len(out) != 2 || out[0].GetName() != "c" || out[1].GetName() != "a" {
		t.Fatalf("Replace returned %v; want c, a in order", out)
	}
	for _, o := range out {
		if o.GetResourceVersion() == "" {
			t.Fatal("returned object has no RV")
		}
	}
	evs := []string{}
	var deleted Object
	for range 3 {
		ev := nextEvent(t, w)
		evs = append(evs, describe(ev))
		if ev.Type == "DELETED" {
			deleted = ev.Object.(Object)
		}
	}
	equalStrings(t, evs, []string{"ADDED ns/c", "MODIFIED ns/a", "DELETED ns/b"})
	if deleted.GetResourceVersion() == bBefore.GetResourceVersion() {
		t.Fatal("DELETED event reuses the old RV")
	}
	if seqOf(t, deleted.GetResourceVersion()) <= seqOf(t, out[1].GetResourceVersion()) {
		t.Fatal("DELETED RV is not newer than the preceding events")
	}
	if !SameContent(deleted.GetResourceVersion(), bBefore.GetResourceVersion()) {
		t.Fatal("DELETED event does not carry the last known content")
	}
	if _, ok := c.Get("k", "b"); ok {
		t.Fatal("b still stored")
	}
	expectNoEvent(t, w)
}

func TestReplaceSkipsUnusableObjects(t *testing.T) {
	c, _ := newTestCache(t, Options{})
	var typedNil *metav1.PartialObjectMetadata
	out := c.Replace("k", []Object{nil, typedNil, obj("ns", "", nil), obj("ns", "a", nil)})
	if len(out) != 1 || out[0].GetName() != "a" {
		t.Fatalf("Replace returned %v; want only a", out)
	}
	if n := c.Stats().Objects; n != 1 {
		t.Fatalf("objects = %d; want 1", n)
	}
}

func TestUpsertDeleteDrop(t *testing.T) {
	c, _ := newTestCache(t, Options{})
	w := startWatch(t, c, WatchOptions{ResourceVersion: c.ResourceVersion()})

	c.Upsert("k1", obj("ns1", "a", nil), obj("ns1", "b", nil))
	c.Upsert("k1", obj("ns1", "a", lbl("v", "2")))
	c.Upsert("k2", obj("ns2", "z", nil))
	if c.Synced("k1") {
		t.Fatal("Upsert marked the backend synced")
	}
	c.Delete("k1", "b", "missing")
	c.Delete("unknown", "a")
	c.Drop("k2")
	c.Drop("unknown")

	equalStrings(t, nextEvents(t, w, 6), []string{
		"ADDED ns1/a", "ADDED ns1/b", "MODIFIED ns1/a", "ADDED ns2/z", "DELETED ns1/b", "DELETED ns2/z",
	})
	expectNoEvent(t, w)
	if _, ok := c.Get("k2", "z"); ok {
		t.Fatal("dropped object still stored")
	}
	if got := c.Stats(); got.Objects != 1 || got.Events != 6 || got.Watchers != 1 {
		t.Fatalf("stats = %+v", got)
	}
}

// TestUpsertIfUnchanged: a change of an object read with Get is stored
// only while the object is still the one read; once another write
// stored a newer one, or deleted it, the change is refused and the newer
// state stays, with no event.
func TestUpsertIfUnchanged(t *testing.T) {
	c, _ := newTestCache(t, Options{})
	c.Upsert("k", obj("ns", "a", lbl("v", "1")))
	w := startWatch(t, c, WatchOptions{ResourceVersion: c.ResourceVersion()})

	read, _ := c.Get("k", "a")
	read.SetLabels(lbl("v", "1", "merged", "yes"))
	if !c.UpsertIfUnchanged("k", read, read.GetResourceVersion()) {
		t.Fatal("a change of the object as stored was refused")
	}

	stale, _ := c.Get("k", "a")
	c.Upsert("k", obj("ns", "a", lbl("v", "2")))
	stale.SetLabels(lbl("v", "1", "merged", "again"))
	if c.UpsertIfUnchanged("k", stale, stale.GetResourceVersion()) {
		t.Error("a change of an object replaced since it was read was stored")
	}
	c.Delete("k", "a")
	if c.UpsertIfUnchanged("k", stale, stale.GetResourceVersion()) {
		t.Error("a change of a deleted object was stored")
	}
	if c.UpsertIfUnchanged("other", stale, stale.GetResourceVersion()) {
		t.Error("a change in an unknown backend was stored")
	}
	equalStrings(t, nextEvents(t, w, 3), []string{"MODIFIED ns/a", "MODIFIED ns/a", "DELETED ns/a"})
	expectNoEvent(t, w)
}

// TestUpsertListed: what a read that began before a write returns does
// not undo the write: an object written meanwhile keeps its newer content
// (and is answered with it), one deleted meanwhile stays deleted (and is
// left out of the answer); the rest is stored as Upsert stores it.
func TestUpsertListed(t *testing.T) {
	c, _ := newTestCache(t, Options{})
	c.Upsert("k", obj("ns", "a", lbl("v", "1")), obj("ns", "b", nil), obj("ns", "c", lbl("v", "1")))
	w := startWatch(t, c, WatchOptions{ResourceVersion: c.ResourceVersion()})

	start := c.StartList()
	c.Upsert("k", obj("ns", "a", lbl("v", "2")))
	c.Delete("k", "b")
	got := c.UpsertListedShared("k", start, obj("ns", "a", lbl("v", "1")), obj("ns", "b", nil),
		obj("ns", "c", lbl("v", "2")), obj("ns", "d", nil))
	var answer []string
	for _, l := range got {
		answer = append(answer, l.Obj.GetName()+"="+l.Obj.GetLabels()["v"])
	}
	equalStrings(t, answer, []string{"a=2", "c=2", "d="})
	equalStrings(t, nextEvents(t, w, 4), []string{"MODIFIED ns/a", "DELETED ns/b", "MODIFIED ns/c", "ADDED ns/d"})
	expectNoEvent(t, w)
}

func TestCopiesAreIndependent(t *testing.T) {
	c, _ := newTestCache(t, Options{})
	in := obj("ns", "a", lbl("x", "1"))
	out := c.Upsert("k", in)
	out[0].SetLabels(lbl("x", "mutated"))
	got, ok := c.Get("k", "a")
	if !ok {
		t.Fatal("a not found")
	}
	got.SetLabels(lbl("x", "mutated too"))
	objs, _ := c.Snapshot(nil)
	objs[0].SetLabels(lbl("x", "and again"))
	again, _ := c.Get("k", "a")
	if again.GetLabels()["x"] != "1" {
		t.Fatalf("stored object was mutated through a copy: %v", again.GetLabels())
	}
}

func TestSnapshot(t *testing.T) {
	c, _ := newTestCache(t, Options{})
	c.Replace("b", []Object{obj("ns-b", "y", nil), obj("ns-b", "x", nil)})
	c.Replace("a", []Object{obj("ns-a", "z", nil)})
	c.Replace("c", []Object{obj("ns-c", "w", nil)})

	objs, rv := c.Snapshot(nil)
	if rv != c.ResourceVersion() {
		t.Fatalf("snapshot RV %s != %s", rv, c.ResourceVersion())
	}
	var names []string
	for _, o := range objs {
		names = append(names, o.GetNamespace()+"/"+o.GetName())
	}
	equalStrings(t, names, []string{"ns-a/z", "ns-b/x", "ns-b/y", "ns-c/w"})

	objs, _ = c.Snapshot(func(key string) bool { return key == "b" })
	if len(objs) != 2 || objs[0].GetName() != "x" {
		t.Fatalf("filtered snapshot = %v", objs)
	}
}

// Select gives the objects of one backend that its function keeps, and
// nothing for an unknown backend.
func TestSelect(t *testing.T) {
	c, _ := newTestCache(t, Options{})
	c.Replace("a", []Object{obj("ns-a", "x", lbl("busy", "yes")), obj("ns-a", "y", nil), obj("ns-a", "z", lbl("busy", "yes"))})
	c.Replace("b", []Object{obj("ns-b", "w", lbl("busy", "yes"))})
	busy := func(o Object) bool { return o.GetLabels()["busy"] == "yes" }
	var names []string
	for _, o := range c.Select("a", busy) {
		names = append(names, o.GetNamespace()+"/"+o.GetName())
	}
	slices.Sort(names)
	equalStrings(t, names, []string{"ns-a/x", "ns-a/z"})
	if got := c.Select("unknown", busy); len(got) != 0 {
		t.Fatalf("unknown backend: %v", got)
	}
}

func TestSyncedAndLastReplaced(t *testing.T) {
	c, fc := newTestCache(t, Options{})
	if c.Synced("k") || !c.LastReplaced("k").IsZero() {
		t.Fatal("unknown backend reported synced")
	}
	c.Upsert("k", obj("ns", "a", nil))
	if c.Synced("k") || !c.LastReplaced("k").IsZero() {
		t.Fatal("Upsert marked synced")
	}
	fc.Step(time.Second)
	c.Replace("k", nil)
	if !c.Synced("k") || !c.LastReplaced("k").Equal(start.Add(time.Second)) {
		t.Fatalf("after Replace: synced=%v last=%v", c.Synced("k"), c.LastReplaced("k"))
	}
	if _, ok := c.Get("k", "a"); ok {
		t.Fatal("empty Replace kept a")
	}
	c.Drop("k")
	if c.Synced("k") || !c.LastReplaced("k").IsZero() {
		t.Fatal("dropped backend still synced")
	}
}

// A list that began before a newer write must not move the object back.
func TestReplaceListedKeepsNewerWrites(t *testing.T) {
	c, _ := newTestCache(t, Options{})
	c.Replace("k", []Object{obj("ns", "a", lbl("v", "1"))})
	start := c.StartList()
	c.Upsert("k", obj("ns", "a", lbl("v", "2")))
	got := c.ReplaceListed("k", start, []Object{obj("ns", "a", lbl("v", "1"))})
	if v := got[0].GetLabels()["v"]; v != "2" {
		t.Fatalf("a list older than the last write replaced it: v=%s", v)
	}
	if o, _ := c.Get("k", "a"); o.GetLabels()["v"] != "2" {
		t.Fatalf("stored v=%s", o.GetLabels()["v"])
	}
}

// TestWithFingerprint: an object handed over with the fingerprint
// Fingerprint gave for its content is stored unwrapped (a copy: the object
// handed over is left as it was), stamped as if the cache had computed
// the fingerprint itself; the same content again
// records no event and returns the stored object's version; other
// content is a change. Each time, held is told the object the cache holds
// for that content, except when the cache keeps newer content written
// after the list began.
func TestWithFingerprint(t *testing.T) {
	var held []Object
	hold := func(stored Object) { held = append(held, stored) }
	c, _ := newTestCache(t, Options{})
	a := obj("ns", "a", lbl("k", "v"))
	fp, err := Fingerprint(a)
	if err != nil {
		t.Fatal(err)
	}
	if want := expectedFP(t, a); fp != want {
		t.Fatalf("Fingerprint = %d, want %d", fp, want)
	}
	first := c.Replace("b", []Object{WithFingerprint(a, fp, hold)})
	if len(first) != 1 {
		t.Fatalf("Replace returned %d objects", len(first))
	}
	if _, ok := first[0].(*metav1.PartialObjectMetadata); !ok {
		t.Fatalf("Replace returned a %T, want the unwrapped object", first[0])
	}
	rv := first[0].GetResourceVersion()
	if got := a.GetResourceVersion(); got != "" {
		t.Errorf("the object handed over was stamped %q: the cache must store a copy", got)
	}
	if want := fmt.Sprintf("%s.%d.%012x", c.incarnation, seqOf(t, rv), fp); rv != want {
		t.Errorf("resourceVersion %q, want %q", rv, want)
	}
	events := c.Stats().Events
	stored, _ := c.SnapshotShared(nil)
	if len(held) != 1 || held[0] != stored[0].Obj {
		t.Errorf("held was called with %v, want once with the stored object", held)
	}
	again := c.Replace("b", []Object{WithFingerprint(obj("ns", "a", lbl("k", "v")), fp, hold)})
	if got := c.Stats().Events; got != events {
		t.Errorf("the same content with its fingerprint recorded %d events", got-events)
	}
	if len(again) != 1 || again[0].GetResourceVersion() != rv {
		t.Errorf("the same content again returned %v, want version %q", again, rv)
	}
	b := obj("ns", "a", lbl("k", "w"))
	fpB, err := Fingerprint(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 2 || held[1] != stored[0].Obj {
		t.Errorf("held was called with %v, want again with the object already stored", held)
	}
	changed := c.Upsert("b", WithFingerprint(b, fpB, hold))
	if got := c.Stats().Events; got != events+1 {
		t.Errorf("changed content recorded %d events, want 1", got-events)
	}
	if len(changed) != 1 || SameContent(changed[0].GetResourceVersion(), rv) || changed[0].GetLabels()["k"] != "w" {
		t.Errorf("changed content returned %v", changed)
	}
	if len(held) != 3 || held[2].GetLabels()["k"] != "w" || held[2].GetResourceVersion() != changed[0].GetResourceVersion() || held[2] == Object(b) {
		t.Errorf("held was called with %v, want the stored copy of the changed content", held)
	}
	start := c.StartList()
	c.Upsert("b", obj("ns", "a", lbl("k", "newer")))
	c.ReplaceListed("b", start, []Object{WithFingerprint(obj("ns", "a", lbl("k", "v")), fp, hold)})
	if len(held) != 3 {
		t.Errorf("held was called with %v although the cache kept content written after the list began", held[3:])
	}
}
