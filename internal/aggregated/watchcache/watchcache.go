// Package watchcache holds the latest objects of one resource kind for every
// backend (one coderd each), stamps resourceVersions, keeps a bounded history
// of change events, fans watch events out to any number of watchers, and runs
// the single shared poller for the kind.
//
// coderd has no watch API and no resourceVersions, so the aggregated API
// server synthesizes both here: one poll per interval serves every watcher,
// which keeps coderd load independent of the number of watchers.
//
// # resourceVersions
//
// Each replica of the API server polls coderd on its own, so replicas see
// the same change at different moments and in different polls: nothing
// orders one replica's changes against another's, and a shared order
// would need state shared between replicas, which coderd cannot hold. A
// resourceVersion therefore names the cache that issued it. Every Cache
// draws a random incarnation when it is created (once per process and
// kind: a restarted replica is a new incarnation) and numbers its change
// events 1, 2, 3, ... (seq). Its resourceVersions are
//
//	<incarnation>.<seq>                list and bookmark versions
//	<incarnation>.<seq>.<fingerprint>  object versions
//
// with the incarnation as 12 lower-case hex digits, seq in decimal and the
// fingerprint as 12 hex digits: the low 48 bits of FNV-1a 64 of the
// object's JSON without its resourceVersion. Kubernetes clients treat
// resourceVersions as opaque strings, so the format is this package's
// business; parseVersion is its only parser.
//
// A request that continues from a resourceVersion (a watch from it, a LIST
// with resourceVersionMatch=Exact) is served only from one this cache
// issued and still covers. A version of another incarnation (the other
// replica behind the Service, a process before a restart, the decimal
// format of earlier releases, or anything unparseable), or one of this
// incarnation newer than anything it issued, answers 410 Gone with reason
// Expired, as kube-apiserver answers a compacted one: client-go's
// reflector then lists again and watches from the new list's version.
// Treating such a version as "now", or comparing it with this cache's
// numbers, would silently drop changes the other replica had already
// counted in and this one had not, or the reverse. The price is a relist
// whenever a client's WATCH reaches another replica than its LIST did;
// no event is lost. A LIST "not older than" a foreign version reads
// coderd (a consistent read; see the storage package), so a client never
// sees older data than it already had.
//
// The fingerprint identifies content, and every replica computes it the
// same way from the same content: optimistic-concurrency preconditions
// compare fingerprints (SameContent), so an update with a resourceVersion
// another replica handed out succeeds when the object is unchanged and
// conflicts when it changed.
package watchcache

import (
	"context"
	"errors"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/clock"
)

// Object is what the cache stores: any Kubernetes object with metadata.
type Object interface {
	runtime.Object
	metav1.Object
}

// Source is one backend the poller lists.
type Source interface {
	// Key identifies the backend, for example "namespace/controlplane".
	Key() string
	// List returns the complete current set of the backend's objects. The
	// cache stores copies of them (see Cache.Replace).
	//
	// When it fails after reading part of the set (one page of several),
	// it returns what it read with the error: the cache updates those
	// objects and keeps the others as they were (no DELETED events). An
	// error wrapping ErrIncomplete says the set may lack objects without
	// anything having failed (for example the backend changed between
	// pages): it is applied the same way but is no failure (no backoff).
	List(ctx context.Context) ([]Object, error)
}

// ErrIncomplete marks a list that read without failing but may lack
// objects; see Source.List.
var ErrIncomplete = errors.New("the list may be incomplete")

const (
	defaultInterval         = 5 * time.Second
	defaultHistorySize      = 10_000
	defaultBookmarkInterval = time.Minute
	defaultWatcherBuffer    = 1000
	defaultListConcurrency  = 8
	defaultMaxBackoff       = 5 * time.Minute
)

// Options configures a Cache. Zero values get the documented defaults.
type Options struct {
	// NewObject returns an empty object of the kind; bookmarks carry one.
	// Required.
	NewObject func() Object
	// Sources lists the current backends for the poller. When nil, the
	// cache is fed only through Replace/Upsert/Delete/Drop, Run only waits
	// for its context and Refresh fails.
	Sources func(ctx context.Context) ([]Source, error)
	// Interval between polls while at least one watcher is active.
	// Default 5s.
	Interval time.Duration
	// HistorySize is how many change events are kept for watch resumption.
	// Default 10000.
	HistorySize int
	// BookmarkInterval is how often watchers that allow bookmarks get one.
	// Default 1m.
	BookmarkInterval time.Duration
	// WatcherBuffer bounds the undelivered live events of one watcher; see
	// Cache.Watch. Default 1000.
	WatcherBuffer int
	// ListConcurrency bounds how many backends are listed at once during a
	// poll. Default 8.
	ListConcurrency int
	// MaxBackoff caps the wait after repeated failed Lists of one backend
	// (a Retry-After from coderd may ask for longer). Default 5m.
	MaxBackoff time.Duration
	// Clock is used for timers, backoffs and LastReplaced. Default the
	// real clock.
	Clock clock.WithTicker
	// Logger receives poll failures. Default discards.
	Logger logr.Logger
}

// Stats is a point-in-time summary for metrics and benchmarks.
type Stats struct {
	// Watchers is the number of active watchers.
	Watchers int
	// Polls is the number of polls completed since creation.
	Polls uint64
	// Objects is the number of objects currently stored.
	Objects int
	// Events is the number of change events recorded since creation.
	Events uint64
}

// BackendErrors reports the backends whose List failed during a poll; their
// previous state was kept.
type BackendErrors struct {
	// Errs maps backend key to its List error (which names the backend).
	Errs map[string]error
}

func (e *BackendErrors) Error() string {
	keys := make([]string, 0, len(e.Errs))
	for k := range e.Errs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, e.Errs[k].Error())
	}
	return strings.Join(parts, "; ")
}

// Unwrap exposes the individual errors to errors.Is/As.
func (e *BackendErrors) Unwrap() []error {
	out := make([]error, 0, len(e.Errs))
	for _, err := range e.Errs {
		out = append(out, err)
	}
	return out
}

// Cache is the per-kind store, event history, watch fan-out and poller.
// All methods are safe for concurrent use.
type Cache struct {
	newObject        func() Object
	sources          func(ctx context.Context) ([]Source, error)
	interval         time.Duration
	bookmarkInterval time.Duration
	watcherBuffer    int
	listConcurrency  int
	maxBackoff       time.Duration
	clock            clock.WithTicker
	log              logr.Logger
	// kind labels the cache's metrics: the Go type name of its objects.
	kind string
	// incarnation names this cache in its resourceVersions (version.go).
	incarnation string

	// mu guards the snapshot, the history and the watcher set together so
	// that a watcher's initial state and its event stream are consistent.
	mu       sync.Mutex
	backends map[string]*backend
	// lastSeq is the seq of the latest change event, 0 before the first.
	lastSeq uint64
	history ring
	// droppedSeq is the seq of the newest event evicted from history (0 if
	// none); resuming from an older seq would miss it.
	droppedSeq uint64
	events     uint64
	watchers   map[*watcher]struct{}
	// polledKeys are the backends the last poll listed; pollingSince is
	// when the poller last started polling, zero while it is idle. Both
	// feed the lag gauge.
	polledKeys   map[string]bool
	pollingSince time.Time

	// wake tells Run that the first watcher arrived.
	wake chan struct{}

	pollMu     sync.Mutex
	pollFlight *flight
	pollGen    uint64
	polls      atomic.Uint64

	// listMu guards the per-backend Lists in flight and the backoffs.
	listMu   sync.Mutex
	lists    map[string]*backendList
	listSeq  uint64
	backoffs map[string]*backoffState
	lastErrs map[string]error
	// listSem bounds the Lists running at once (ListConcurrency).
	listSem chan struct{}
}

type backend struct {
	objs         map[string]*entry
	synced       bool
	lastReplaced time.Time
	// deleted remembers Delete calls (name -> seq) so that a poll whose
	// List started before the deletion does not resurrect the object.
	deleted map[string]uint64
}

type entry struct {
	// obj is immutable once stored; it is handed out as a deep copy, or
	// shared with lists that only read it (Listed).
	obj Object
	fp  uint64
	seq uint64
	// json is obj's encoding once a list asked for it (Listed.JSON).
	json atomic.Pointer[[]byte]
}

// New validates opts and returns a Cache. Start the poller with Run.
func New(opts Options) (*Cache, error) {
	if opts.NewObject == nil {
		return nil, errors.New("watchcache: Options.NewObject is required")
	}
	if opts.Interval < 0 || opts.BookmarkInterval < 0 || opts.HistorySize < 0 ||
		opts.WatcherBuffer < 0 || opts.ListConcurrency < 0 || opts.MaxBackoff < 0 {
		return nil, errors.New("watchcache: Options must not hold negative values")
	}
	c := &Cache{
		newObject:        opts.NewObject,
		sources:          opts.Sources,
		interval:         orDefault(opts.Interval, defaultInterval),
		bookmarkInterval: orDefault(opts.BookmarkInterval, defaultBookmarkInterval),
		watcherBuffer:    orDefault(opts.WatcherBuffer, defaultWatcherBuffer),
		listConcurrency:  orDefault(opts.ListConcurrency, defaultListConcurrency),
		maxBackoff:       orDefault(opts.MaxBackoff, defaultMaxBackoff),
		clock:            opts.Clock,
		log:              opts.Logger,
		kind:             kindOf(opts.NewObject()),
		incarnation:      newIncarnation(),
		backends:         map[string]*backend{},
		watchers:         map[*watcher]struct{}{},
		wake:             make(chan struct{}, 1),
		lists:            map[string]*backendList{},
		backoffs:         map[string]*backoffState{},
		lastErrs:         map[string]error{},
	}
	c.listSem = make(chan struct{}, c.listConcurrency)
	if c.clock == nil {
		c.clock = clock.RealClock{}
	}
	if c.log.GetSink() == nil {
		c.log = logr.Discard()
	}
	c.history = newRing(orDefault(opts.HistorySize, defaultHistorySize))
	return c, nil
}

// kindOf is the Go type name of obj, for example CoderWorkspace.
func kindOf(obj Object) string {
	t := reflect.TypeOf(obj)
	if t == nil {
		return "unknown"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Name()
}

func orDefault[T int | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// nextSeqLocked allocates the seq of a new change event.
func (c *Cache) nextSeqLocked() uint64 {
	c.lastSeq++
	return c.lastSeq
}

// ResourceVersion is the current list resourceVersion: the point a
// watcher resumes from after a LIST.
func (c *Cache) ResourceVersion() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.listRV(c.lastSeq)
}

// Stats returns current counters.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, b := range c.backends {
		n += len(b.objs)
	}
	return Stats{
		Watchers: len(c.watchers),
		Polls:    c.polls.Load(),
		Objects:  n,
		Events:   c.events,
	}
}
