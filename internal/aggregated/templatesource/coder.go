package templatesource

import (
	"bytes"
	"container/list"
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
)

// Upload archives files (see Archive) and uploads them to coderd,
// returning the file ID to build a template version from. coderd
// deduplicates by content, so uploading the same files again returns the
// same ID.
func Upload(ctx context.Context, client *codersdk.Client, files map[string]string, limits Limits) (uuid.UUID, error) {
	data, err := Archive(files, limits)
	if err != nil {
		return uuid.Nil, err
	}
	res, err := client.Upload(ctx, codersdk.ContentTypeTar, bytes.NewReader(data))
	if err != nil {
		return uuid.Nil, fmt.Errorf("upload template source (%d bytes): %w", len(data), err)
	}
	return res.ID, nil
}

// entryOverhead approximates the memory of a cached map entry beyond its
// strings, so that many tiny files still count.
const entryOverhead = 64

// SourceCache holds extracted template sources by coderd file ID. File
// IDs name immutable, content-addressed uploads, so entries never go
// stale; the least recently used are evicted to stay within a byte
// budget. Concurrent misses for one file share a single download. It is
// safe for concurrent use.
//
// The cache does not repeat coderd's authorization: a hit returns the
// files to any caller that names the same coderd. Callers name the coderd
// and the identity acting on it (for the aggregated API server: the
// backend and its URL), so that one tenant's coderd, which may claim any
// file ID, never reads another's sources.
type SourceCache struct {
	maxBytes int64

	mu       sync.Mutex
	used     int64
	lru      *list.List // of *cacheEntry; front is most recently used
	entries  map[cacheKey]*list.Element
	inflight map[cacheKey]*download
	// failed remembers sources that failed to extract (too big, bad
	// archive): file IDs are immutable, so they would fail again on every
	// poll. Bounded to maxFailed, least recently used evicted.
	failedLRU *list.List // of *failedEntry
	failed    map[cacheKey]*list.Element
}

// maxFailed bounds the negative cache: an error each, a few hundred bytes.
const maxFailed = 1024

type failedEntry struct {
	key cacheKey
	err error
}

// extractError is a source that downloaded but cannot be extracted.
type extractError struct{ err error }

func (e *extractError) Error() string { return e.err.Error() }
func (e *extractError) Unwrap() error { return e.err }

// cacheKey includes the coderd, so that one cache can serve several
// coderd deployments.
type cacheKey struct {
	coderd string
	id     uuid.UUID
}

type cacheEntry struct {
	key   cacheKey
	files map[string]string
	size  int64
}

// download is one in-flight fetch that concurrent callers wait for.
type download struct {
	done  chan struct{}
	files map[string]string
	err   error
	// abandoned means the fetching caller's context ended: the others
	// should fetch again instead of failing with that caller's error.
	abandoned bool
}

// NewSourceCache returns a cache holding at most about maxBytes of file
// paths and contents. A source larger than that is returned but not kept.
func NewSourceCache(maxBytes int64) *SourceCache {
	return &SourceCache{
		maxBytes:  maxBytes,
		lru:       list.New(),
		entries:   map[cacheKey]*list.Element{},
		inflight:  map[cacheKey]*download{},
		failedLRU: list.New(),
		failed:    map[cacheKey]*list.Element{},
	}
}

// Files returns the files of upload fileID of the coderd named coderd
// (see SourceCache), downloading them with client and extracting them
// (see Extract; limits apply) only when they are not cached.
// The map is the caller's own copy. Cached sources were checked against
// the limits of the call that downloaded them, so use the same limits for
// every call on one cache. A source that failed to extract is not
// downloaded again: its error is returned from the cache.
func (c *SourceCache) Files(ctx context.Context, coderd string, client *codersdk.Client, fileID uuid.UUID, limits Limits) (map[string]string, error) {
	if client == nil || client.URL == nil {
		return nil, errors.New("get template source: no coderd client")
	}
	key := cacheKey{coderd: coderd, id: fileID}
	for {
		c.mu.Lock()
		if el, ok := c.entries[key]; ok {
			c.lru.MoveToFront(el)
			files := maps.Clone(el.Value.(*cacheEntry).files)
			c.mu.Unlock()
			return files, nil
		}
		if el, ok := c.failed[key]; ok {
			c.failedLRU.MoveToFront(el)
			err := el.Value.(*failedEntry).err
			c.mu.Unlock()
			return nil, err
		}
		if d, ok := c.inflight[key]; ok {
			c.mu.Unlock()
			select {
			case <-d.done:
			case <-ctx.Done():
				return nil, fmt.Errorf("get template source %s: %w", fileID, ctx.Err())
			}
			if d.abandoned {
				continue
			}
			if d.err != nil {
				return nil, d.err
			}
			return maps.Clone(d.files), nil
		}
		d := &download{done: make(chan struct{})}
		c.inflight[key] = d
		c.mu.Unlock()

		files, err := fetchSource(ctx, client, fileID, limits)

		c.mu.Lock()
		delete(c.inflight, key)
		d.files, d.err = files, err
		d.abandoned = err != nil && ctx.Err() != nil
		var xerr *extractError
		switch {
		case err == nil:
			c.add(key, files)
		case errors.As(err, &xerr):
			c.addFailed(key, err)
		}
		c.mu.Unlock()
		close(d.done)
		if err != nil {
			return nil, err
		}
		return maps.Clone(files), nil
	}
}

func fetchSource(ctx context.Context, client *codersdk.Client, fileID uuid.UUID, limits Limits) (map[string]string, error) {
	data, _, err := client.Download(ctx, fileID)
	if err != nil {
		return nil, fmt.Errorf("download template source %s: %w", fileID, err)
	}
	files, err := Extract(data, limits)
	if err != nil {
		return nil, &extractError{fmt.Errorf("extract template source %s: %w", fileID, err)}
	}
	return files, nil
}

// add caches files under key, evicting the least recently used entries to
// make room. c.mu must be held.
func (c *SourceCache) add(key cacheKey, files map[string]string) {
	size := sourceSize(files)
	if _, ok := c.entries[key]; ok || size > c.maxBytes {
		return
	}
	for c.used+size > c.maxBytes {
		oldest := c.lru.Back()
		e := oldest.Value.(*cacheEntry)
		c.lru.Remove(oldest)
		delete(c.entries, e.key)
		c.used -= e.size
	}
	c.entries[key] = c.lru.PushFront(&cacheEntry{key: key, files: files, size: size})
	c.used += size
}

// addFailed remembers that key's source failed to extract. c.mu must be
// held.
func (c *SourceCache) addFailed(key cacheKey, err error) {
	if _, ok := c.failed[key]; ok {
		return
	}
	if c.failedLRU.Len() >= maxFailed {
		oldest := c.failedLRU.Back()
		c.failedLRU.Remove(oldest)
		delete(c.failed, oldest.Value.(*failedEntry).key)
	}
	c.failed[key] = c.failedLRU.PushFront(&failedEntry{key: key, err: err})
}

// sourceSize is what files count against a SourceCache's budget.
func sourceSize(files map[string]string) int64 {
	size := int64(entryOverhead)
	for p, content := range files {
		size += int64(len(p)+len(content)) + entryOverhead
	}
	return size
}
