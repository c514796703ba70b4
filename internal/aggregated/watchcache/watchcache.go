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
// Every change event gets a cache-global sequence number
// seq = max(last+1, now in Unix milliseconds), so versions stay monotonic
// across process restarts. An object's resourceVersion is the decimal of
// seq*1_000_000 + fp, where fp is a fingerprint of the object's content
// (FNV-1a 64 of its JSON without resourceVersion, modulo
// 1_000_000). The list resourceVersion is lastSeq*1_000_000 + 999_999, so it
// is at least every object's resourceVersion. The low six digits identify
// content, which lets optimistic-concurrency checks work across replicas
// (see SameContent).
package watchcache

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strconv"
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
	rvFactor = 1_000_000
	// listSuffix makes a list resourceVersion >= every object version of
	// the same seq.
	listSuffix = rvFactor - 1

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
	// Clock is used for sequence numbers, timers and LastReplaced. Default
	// the real clock.
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

	// mu guards the snapshot, the history and the watcher set together so
	// that a watcher's initial state and its event stream are consistent.
	mu         sync.Mutex
	backends   map[string]*backend
	lastSeq    uint64
	createdSeq uint64
	history    ring
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
	// Versions handed out by an earlier process are older than this, so
	// they cannot be resumed here (see Watch).
	c.createdSeq = c.nowSeq()
	c.lastSeq = c.createdSeq
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

// nowSeq is the clock in Unix milliseconds, clamped at 0 for clocks before
// 1970 (fake clocks at the zero time).
func (c *Cache) nowSeq() uint64 {
	ms := c.clock.Now().UnixMilli()
	if ms < 0 {
		return 0
	}
	return uint64(ms)
}

// nextSeqLocked allocates the seq of a new change event.
func (c *Cache) nextSeqLocked() uint64 {
	s := c.lastSeq + 1
	if now := c.nowSeq(); now > s {
		s = now
	}
	c.lastSeq = s
	return s
}

func formatRV(seq, fp uint64) string {
	return strconv.FormatUint(seq*rvFactor+fp, 10)
}

func listRV(seq uint64) string {
	return formatRV(seq, listSuffix)
}

func parseRV(rv string) (uint64, error) {
	v, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("resourceVersion %q is not a non-negative integer", rv)
	}
	return v, nil
}

// ParseResourceVersion returns the sequence part of a resourceVersion issued
// by a Cache (rv / 1_000_000). It fails for anything that is not a decimal
// unsigned integer, including "".
func ParseResourceVersion(rv string) (uint64, error) {
	v, err := parseRV(rv)
	if err != nil {
		return 0, err
	}
	return v / rvFactor, nil
}

// SameContent reports whether two resourceVersions carry the same content
// fingerprint. Unlike comparing the strings it also holds across server
// replicas and restarts, whose sequence parts differ; use it for
// optimistic-concurrency preconditions. The fingerprint has 10^6 values, so
// an unrelated change matches with probability 1e-6.
func SameContent(rvA, rvB string) bool {
	a, errA := parseRV(rvA)
	b, errB := parseRV(rvB)
	if errA != nil || errB != nil {
		return false
	}
	return a%rvFactor == b%rvFactor
}

// ResourceVersion is the current list resourceVersion: at least every stored
// object's version, and the point a watcher resumes from after a LIST.
func (c *Cache) ResourceVersion() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return listRV(c.lastSeq)
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
