package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// Reading every workspace of a coderd for the poller and for consistent
// lists: paged, each page scanned workspace by workspace (workspace_page.go),
// and converted only where coderd's answer changed since the last poll.

// DefaultWorkspacePageSize is how many workspaces one GET /api/v2/workspaces
// asks for. coderd v2.30 pages by offset and counts the total on every
// page, so each page costs its database about what one answer with every
// workspace costs: measured at 10,000 workspaces, ten pages of 1000 took
// 11.0 s against 2.5 s for one request. Pages of 10,000 keep a list at one
// request up to 10,000 workspaces, while still bounding one answer (about
// 25 MB of JSON) beyond that; coderd has no maximum (limit 0 means all).
const DefaultWorkspacePageSize = 10000

// listedWorkspace is one workspace of coderd's answer: the hash of its
// JSON, which keys the list memo, and either the object an earlier list
// built from the same JSON (memo) or the object converted from it as it
// was read (obj), still without the parameters of its latest build
// (build), which convertWorkspaces adds. Converting as the page arrives
// keeps one decoded codersdk.Workspace (about 8 KB) at a time instead of
// every new one of the list (some 80 MB at 10,000 on a cold start).
type listedWorkspace struct {
	hash  uint64
	memo  *memoEntry
	obj   *aggv1.CoderWorkspace
	build uuid.UUID
	// version and preset of the latest build, for the spec's preset and
	// ephemeral parameters.
	version uuid.UUID
	preset  *uuid.UUID
}

func (l listedWorkspace) id() string {
	if l.memo != nil {
		return l.memo.obj.Load().Status.ID
	}
	return l.obj.Status.ID
}

// listWorkspaces reads every workspace of one coderd, page by page.
// coderd's answer is split into each workspace's JSON; a workspace whose
// JSON is byte for byte what an earlier list returned reuses the object
// built then, so a list (and a poll) decodes and converts only what
// changed; merged with an unchanged record it is the merge built then,
// handed to the cache with its fingerprint (see mergeMemo), so nothing
// unchanged is encoded or copied either.
//
// coderd pages by offset over an order that moves a workspace when it
// starts or stops (running ones first), so a change between two pages can
// repeat a workspace or skip one. Repeats are dropped (by ID, the later
// copy wins); a list whose pages disagree on the total count, or that ends
// with a number of distinct workspaces other than that count, is read once
// more and, if still inconsistent, returned with watchcache.ErrIncomplete:
// the cache then updates what it read and deletes nothing. A page that
// fails returns the workspaces of the pages before it with the error
// (a partial list, see watchcache.Source).
func (s *WorkspaceStorage) listWorkspaces(ctx context.Context, t target) ([]watchcache.Object, error) {
	prev := s.memo.get(t)
	started := time.Now()
	listed, err := s.readWorkspacePages(ctx, t, prev)
	if errors.Is(err, watchcache.ErrIncomplete) {
		started = time.Now()
		listed, err = s.readWorkspacePages(ctx, t, prev)
	}
	if len(listed) == 0 && err != nil {
		return nil, err
	}
	out, entries, next, convErr := s.convertWorkspaces(ctx, t, listed, prev, err != nil)
	if convErr != nil {
		return nil, convErr
	}
	merge := func(i int, rec *records.Record) (watchcache.Object, string) {
		obj, e := mergeMemo(entries[i], rec)
		next[listed[i].hash] = e
		return obj, e.specHash
	}
	// A caller's list is part of coderd's workspaces: it deletes no
	// record and does not replace the memo the poller keeps.
	if mergeErr := s.mergeListed(ctx, t, out, started, err == nil && t.caller == nil, merge); mergeErr != nil {
		return nil, mergeErr
	}
	if t.caller == nil {
		s.memo.set(t, next)
	}
	return out, err
}

// mergeMemo returns the object to list for a memo entry merged with rec
// (nil: none), and the entry to remember. When the entry has already
// been merged with the same record (by its resourceVersion, which
// changes with every write of it), the object is the entry's, handed to
// the cache with its fingerprint (see memoEntry.cached); otherwise rec is
// merged into a copy and the result remembered.
func mergeMemo(e *memoEntry, rec *records.Record) (watchcache.Object, *memoEntry) {
	rv := ""
	if rec != nil {
		rv = rec.ResourceVersion
	}
	if e.merged && e.recordRV == rv {
		return e.cached(), e
	}
	obj := e.obj.Load().DeepCopy()
	var specHash string
	if mergeRecord(obj, rec) {
		specHash = specHashOf(obj)
	}
	fp, err := watchcache.Fingerprint(obj)
	if err != nil {
		// The cache logs and leaves out what it cannot encode.
		return obj, e
	}
	next := newMemoEntry(obj)
	next.merged, next.recordRV, next.fp, next.specHash = true, rv, fp, specHash
	return next.cached(), next
}

// readWorkspacePages reads coderd's workspaces page by page; see
// listWorkspaces. A workspace whose JSON hashes to an entry of prev is
// not decoded.
func (s *WorkspaceStorage) readWorkspacePages(ctx context.Context, t target, prev map[uint64]*memoEntry) ([]listedWorkspace, error) {
	size := s.pageSize
	if size <= 0 {
		size = DefaultWorkspacePageSize
	}
	var (
		listed []listedWorkspace
		index  = map[string]int{}
		count  = -1
		shift  bool
	)
	for offset := 0; ; {
		read := 0
		pageCount, err := s.readWorkspacePage(ctx, t, size, offset, func(raw []byte) error {
			read++
			l := listedWorkspace{hash: hashBytes(raw)}
			if l.memo = prev[l.hash]; l.memo == nil {
				var ws codersdk.Workspace
				if err := json.Unmarshal(raw, &ws); err != nil {
					return fmt.Errorf("decode a workspace: %w", err)
				}
				l.obj, l.build = toWorkspace(t, &ws, nil), ws.LatestBuild.ID
				l.version, l.preset = ws.LatestBuild.TemplateVersionID, ws.LatestBuild.TemplateVersionPresetID
			}
			id := l.id()
			if i, ok := index[id]; ok {
				listed[i] = l
				shift = true
				return nil
			}
			index[id] = len(listed)
			listed = append(listed, l)
			return nil
		})
		if err != nil {
			return listed, err
		}
		if count >= 0 && pageCount != count {
			shift = true
		}
		count = pageCount
		offset += read
		if read < size || offset >= pageCount {
			break
		}
	}
	if shift || len(listed) != count {
		return listed, fmt.Errorf("list workspaces: coderd's workspaces changed between pages (%d distinct read, %d counted): %w", len(listed), count, watchcache.ErrIncomplete)
	}
	return listed, nil
}

// readWorkspacePage reads one page as it arrives, calling each with every
// workspace's JSON (see scanWorkspacesPage), and returns coderd's total
// count.
func (s *WorkspaceStorage) readWorkspacePage(ctx context.Context, t target, limit, offset int, each func(raw []byte) error) (int, error) {
	path := "/api/v2/workspaces?limit=" + strconv.Itoa(limit) + "&offset=" + strconv.Itoa(offset)
	res, err := t.Client.Request(ctx, http.MethodGet, path, nil)
	if err != nil {
		return 0, fmt.Errorf("list workspaces (offset %d): %w", offset, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("list workspaces (offset %d): %w", offset, coderapi.ReadResponseError(res, time.Now()))
	}
	count, err := scanWorkspacesPage(res.Body, each)
	if err != nil {
		return 0, fmt.Errorf("list workspaces (offset %d): %w", offset, err)
	}
	return count, nil
}

// convertWorkspaces turns coderd's workspaces into objects: the memo's
// for unchanged JSON (shared: mergeListed replaces each with mergeMemo's
// result before anything else sees it), otherwise the object converted
// as it was read, completed with its build's parameters. It
// returns each object's memo entry and the memo to keep. A partial list
// adds to the memo instead of replacing it, since the workspaces it did
// not read may come back unchanged.
func (s *WorkspaceStorage) convertWorkspaces(ctx context.Context, t target, listed []listedWorkspace, prev map[uint64]*memoEntry, partial bool) ([]watchcache.Object, []*memoEntry, map[uint64]*memoEntry, error) {
	next := make(map[uint64]*memoEntry, len(listed))
	if partial {
		maps.Copy(next, prev)
	}
	out := make([]watchcache.Object, len(listed))
	entries := make([]*memoEntry, len(listed))
	var ids []uuid.UUID
	for _, l := range listed {
		if l.memo == nil {
			ids = append(ids, l.build)
		}
	}
	params, err := s.params.fill(ctx, t, ids)
	if err != nil {
		return nil, nil, nil, err
	}
	for i, l := range listed {
		e := l.memo
		if e == nil {
			l.obj.Spec.Parameters = params[l.build]
			v, err := s.versions.get(ctx, t, l.version)
			if err != nil {
				return nil, nil, nil, err
			}
			v.specView(&l.obj.Spec, l.preset)
			e = newMemoEntry(l.obj)
		}
		entries[i] = e
		next[l.hash] = e
		out[i] = e.obj.Load()
	}
	return out, entries, next, nil
}
