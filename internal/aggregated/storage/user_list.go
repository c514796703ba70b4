package storage

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/jsonskim"
)

// Listing every user of a coderd: GET /api/v2/users and the
// organizations' member lists (for the organization roles), each read
// element by element. A user whose JSON and memberships are byte for byte
// what the last list read reuses the object built then (merged with an
// unchanged record, the merge built then, handed to the cache with its
// fingerprint), so a list decodes, converts and encodes only the users
// that changed.
//
// The member lists cost coderd about half what the users list costs, on
// the same cores, so a list reuses the last read of them while it is
// younger than the poll interval, as the versions list reuses the
// templates list. The users list says which organizations each user
// belongs to (organization_ids): a membership added or removed anywhere
// (or an organization made or deleted) no longer matches the members
// read, which are then read again, so memberships show at once; only an
// organization role changed, or an organization renamed, outside this
// replica shows within the poll interval. A poll of the watch cache and a
// write of memberships or organization roles through this replica read
// them again.

// userPageSize is how many users one list request asks coderd for
// (coderd v2.30 has no maximum; limit 0 would mean all).
const userPageSize = 5000

// userMemo is what a list built from one user's JSON and memberships.
// Lists running at once share it: a list that merges another record
// makes a new entry; only obj changes in place, to the watch cache's
// object of the same content.
type userMemo struct {
	// obj is Coder's view without the record until merged is set, then
	// merged with the record at recordRV ("" none).
	obj      *aggv1.CoderUser
	stored   *aggv1.CoderUser
	mu       sync.Mutex
	merged   bool
	recordRV string
	fp       uint64
	specHash string
	// orgIDs are the user's organization_ids in its JSON.
	orgIDs []uuid.UUID
}

// current is the entry's object: the cache's copy once it holds one.
func (e *userMemo) current() *aggv1.CoderUser {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stored != nil {
		return e.stored
	}
	return e.obj
}

// cached hands the entry's object to the watch cache with its
// fingerprint, and takes the cache's object of the same content from
// then on, so that the users are held once.
func (e *userMemo) cached() watchcache.Object {
	return watchcache.WithFingerprint(e.current(), e.fp, func(stored watchcache.Object) {
		if u, ok := stored.(*aggv1.CoderUser); ok {
			e.mu.Lock()
			e.stored = u
			e.mu.Unlock()
		}
	})
}

// mergeUserMemo returns the object to list for e merged with rec (nil:
// none) and the entry to remember: e's own when it was merged with the
// same record version, otherwise a new entry with the merge of a copy.
func mergeUserMemo(e *userMemo, rec *records.Record) (watchcache.Object, *userMemo) {
	rv := ""
	if rec != nil {
		rv = rec.ResourceVersion
	}
	if e.merged && e.recordRV == rv {
		return e.cached(), e
	}
	obj := e.obj.DeepCopy()
	showPassword(obj, rec)
	var specHash string
	if mergeRecord(obj, rec) {
		specHash = specHashOf(obj)
	}
	fp, err := watchcache.Fingerprint(obj)
	if err != nil {
		// The cache logs and leaves out what it cannot encode.
		return obj, e
	}
	next := &userMemo{obj: obj, merged: true, recordRV: rv, fp: fp, specHash: specHash, orgIDs: e.orgIDs}
	return next.cached(), next
}

// orgMembers is one read of a coderd's organizations and their members:
// each user's memberships, when the read started and how many writes of
// memberships this replica had made then.
type orgMembers struct {
	byUser map[uuid.UUID][]listedMember
	at     time.Time
	writes uint64
}

// errMembersStale says the users list names memberships the members read
// reused does not hold.
var errMembersStale = errors.New("memberships changed since the organization members were read")

// memberEntry is one organization member as a list needs it.
type memberEntry struct {
	user  uuid.UUID
	roles []string
}

// listedMember is a membership of one user: the organization (its ID and
// the membership as shown) and the hash of the member's JSON.
type listedMember struct {
	orgID uuid.UUID
	org   aggv1.CoderUserOrganization
	hash  uint64
}

// listUsers reads every user of one coderd, the organizations and their
// members (one request per organization, or the last read of them, see
// the top of this file), converting only what changed since the last
// list.
func (s *UserStorage) listUsers(ctx context.Context, t target) ([]watchcache.Object, error) {
	started := time.Now()
	prev := s.memo.get(t)
	known, reuse := s.knownMembers(ctx, t)
	var raws [][]byte
	if reuse {
		var err error
		if raws, err = readUsers(ctx, t.Client); err != nil {
			return nil, err
		}
	} else {
		g, gctx := errgroup.WithContext(ctx)
		g.Go(func() error {
			var err error
			raws, err = readUsers(gctx, t.Client)
			return err
		})
		g.Go(func() error {
			var err error
			known, err = s.readMembers(gctx, t)
			return err
		})
		if err := g.Wait(); err != nil {
			return nil, err
		}
	}
	out, next, err := s.usersOf(t, raws, known.byUser, prev, reuse)
	if errors.Is(err, errMembersStale) {
		if known, err = s.readMembers(ctx, t); err != nil {
			return nil, err
		}
		out, next, err = s.usersOf(t, raws, known.byUser, prev, false)
	}
	if err != nil {
		return nil, err
	}
	if err := s.mergeListed(ctx, t, out.objs, started, true, out.merge(next)); err != nil {
		return nil, err
	}
	if t.caller == nil {
		s.memo.set(t, next)
	}
	return out.objs, nil
}

// listedUsers are the objects a list serves, each with its memo entry and
// the entry's key.
type listedUsers struct {
	objs    []watchcache.Object
	entries []*userMemo
	keys    []uint64
}

// merge merges the record of each object into it, remembering the merged
// entry in next.
func (l *listedUsers) merge(next map[uint64]*userMemo) func(i int, rec *records.Record) (watchcache.Object, string) {
	return func(i int, rec *records.Record) (watchcache.Object, string) {
		obj, e := mergeUserMemo(l.entries[i], rec)
		next[l.keys[i]] = e
		return obj, e.specHash
	}
}

// usersOf builds the users of raws (each user's JSON) with the
// memberships byUser, from prev's entries where the JSON and memberships
// are the same, and returns them with the memo to keep. With check it
// returns errMembersStale when a user's organizations are not those
// byUser holds.
func (s *UserStorage) usersOf(t target, raws [][]byte, byUser map[uuid.UUID][]listedMember, prev map[uint64]*userMemo, check bool) (listedUsers, map[uint64]*userMemo, error) {
	seen := make(map[uuid.UUID]bool, len(raws))
	next := make(map[uint64]*userMemo, len(raws))
	out := listedUsers{
		objs:    make([]watchcache.Object, 0, len(raws)),
		entries: make([]*userMemo, 0, len(raws)),
		keys:    make([]uint64, 0, len(raws)),
	}
	var h maphash.Hash
	h.SetSeed(memoSeed)
	for _, raw := range raws {
		id, err := userIDOf(raw)
		if err != nil {
			return out, nil, fmt.Errorf("list users: %w", err)
		}
		ms := byUser[id]
		key := userKey(&h, raw, ms)
		e := prev[key]
		if e == nil {
			var u codersdk.User
			if err := json.Unmarshal(raw, &u); err != nil {
				return out, nil, fmt.Errorf("list users: decode a user: %w", err)
			}
			if checkCoderName("user", u.Username, coderName, maxCoderName, "") != nil {
				s.log.V(1).Info("user not served: its name cannot be an object name", "user", u.Username)
				continue
			}
			e = &userMemo{obj: toUser(t, &u, organizationsOf(ms)), orgIDs: u.OrganizationIDs}
		}
		if check && !sameOrganizations(e.orgIDs, ms) {
			return out, nil, errMembersStale
		}
		if seen[id] {
			continue // moved between pages
		}
		seen[id] = true
		next[key] = e
		out.keys = append(out.keys, key)
		out.entries = append(out.entries, e)
		out.objs = append(out.objs, e.current())
	}
	return out, next, nil
}

// sameOrganizations reports whether ids (a user's organization_ids) are
// the organizations of ms.
func sameOrganizations(ids []uuid.UUID, ms []listedMember) bool {
	if len(ids) != len(ms) {
		return false
	}
	for _, m := range ms {
		if !slices.Contains(ids, m.orgID) {
			return false
		}
	}
	return true
}

// knownMembers returns the last read of t's organization members, and
// whether a list may use it instead of reading them: read within the poll
// interval, with no membership written through this replica since, and
// the list is not the watch cache's poll.
func (s *UserStorage) knownMembers(ctx context.Context, t target) (orgMembers, bool) {
	if t.caller != nil || polling(ctx) {
		return orgMembers{}, false
	}
	v, _ := s.orgMembers.Load(t.coderdKey())
	k, ok := v.(orgMembers)
	if !ok {
		return orgMembers{}, false
	}
	return k, time.Since(k.at) < s.interval && k.writes == s.memberWrites.Load()
}

// readMembers reads t's organizations and their members, and keeps the
// read for the lists that follow (knownMembers).
func (s *UserStorage) readMembers(ctx context.Context, t target) (orgMembers, error) {
	read := orgMembers{at: time.Now(), writes: s.memberWrites.Load()}
	orgs, err := t.Client.Organizations(ctx)
	if err != nil {
		return orgMembers{}, fmt.Errorf("list organizations: %w", err)
	}
	next := map[uint64]memberEntry{}
	if read.byUser, err = membersRaw(ctx, t.Client, orgs, s.members.get(t), next); err != nil {
		return orgMembers{}, err
	}
	if t.caller == nil {
		s.members.set(t, next)
		s.orgMembers.Store(t.coderdKey(), read)
	}
	return read, nil
}

// memberWritten marks the members read so far as stale: call it after a
// write of memberships or organization roles, done or failed.
func (s *UserStorage) memberWritten() { s.memberWrites.Add(1) }

// retainMembers drops the members reads of coderds other than those of
// ts.
func (s *UserStorage) retainMembers(ts []target) {
	keep := make(map[string]bool, len(ts))
	for _, t := range ts {
		keep[t.coderdKey()] = true
	}
	s.orgMembers.Range(func(k, _ any) bool {
		if !keep[k.(string)] {
			s.orgMembers.Delete(k)
		}
		return true
	})
}

// userKey is what a user's memo entry is remembered by: a hash of its
// JSON raw and its memberships ms.
func userKey(h *maphash.Hash, raw []byte, ms []listedMember) uint64 {
	h.Reset()
	_, _ = h.Write(raw)
	var b [8]byte
	for _, m := range ms {
		_, _ = h.WriteString(m.org.Name)
		binary.LittleEndian.PutUint64(b[:], m.hash)
		_, _ = h.Write(b[:])
	}
	return h.Sum64()
}

// userIDOf reads the "id" member of a user's JSON object.
func userIDOf(raw []byte) (uuid.UUID, error) {
	s := jsonskim.NewBytes(raw)
	if !s.Consume('{') {
		return uuid.Nil, malformed(s.Errorf("expected a user object"))
	}
	for !s.Consume('}') {
		key, err := memberName(s)
		if err != nil {
			return uuid.Nil, err
		}
		v, err := s.Value()
		if err != nil {
			return uuid.Nil, malformed(err)
		}
		if key == "id" {
			// A UUID needs no unescaping: parsed between its quotes.
			if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
				return uuid.Nil, malformed(fmt.Errorf("user id %.40s is not a string", v))
			}
			id, err := uuid.ParseBytes(v[1 : len(v)-1])
			if err != nil {
				return uuid.Nil, fmt.Errorf("decode coderd's answer: user id: %w", err)
			}
			return id, nil
		}
		s.Consume(',')
	}
	return uuid.Nil, malformed(fmt.Errorf("a user without an id"))
}

// organizationsOf are a user's memberships, sorted by organization.
func organizationsOf(ms []listedMember) []aggv1.CoderUserOrganization {
	if len(ms) == 0 {
		return nil
	}
	out := make([]aggv1.CoderUserOrganization, len(ms))
	for i, m := range ms {
		out[i] = m.org
	}
	return out
}

// readUsers reads every user's JSON, page by page.
func readUsers(ctx context.Context, c *codersdk.Client) ([][]byte, error) {
	var raws [][]byte
	for offset := 0; ; {
		read := 0
		count, err := readUsersPage(ctx, c, offset, func(raw []byte) error {
			read++
			// raw is the scanner's buffer, valid only during the call.
			raws = append(raws, bytes.Clone(raw))
			return nil
		})
		if err != nil {
			return nil, err
		}
		offset += read
		if read < userPageSize || offset >= count {
			return raws, nil
		}
	}
}

// readUsersPage reads one page of GET /api/v2/users, calling each with
// every user's JSON, and returns coderd's total count.
func readUsersPage(ctx context.Context, c *codersdk.Client, offset int, each func(raw []byte) error) (int, error) {
	path := "/api/v2/users?limit=" + strconv.Itoa(userPageSize) + "&offset=" + strconv.Itoa(offset)
	res, err := c.Request(ctx, http.MethodGet, path, nil)
	if err != nil {
		return 0, fmt.Errorf("list users: %w", err)
	}
	defer func() { _ = res.Body.Close() }()
	if res.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("list users: %w", coderapi.ReadResponseError(res, time.Now()))
	}
	count, err := scanObjectList(res.Body, "users", each)
	if err != nil {
		return 0, fmt.Errorf("list users: %w", err)
	}
	return count, nil
}

// scanObjectList scans coderd's {"<field>": [...], "count": n}, calling
// each with every element's JSON, and returns the count. A failed read is
// told apart from a malformed answer.
func scanObjectList(r io.Reader, field string, each func(raw []byte) error) (count int, err error) {
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
	if s.Consume('}') {
		return 0, nil
	}
	for {
		key, err := memberName(s)
		if err != nil {
			return 0, err
		}
		switch key {
		case field:
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
	if !s.End() {
		return 0, malformed(s.Errorf("unexpected data after the object"))
	}
	return count, nil
}

// membersRaw reads the members of every organization of orgs, each
// member decoded only when its JSON is not one prev holds (what the last
// list decoded); next gets every member read. It returns each user's
// memberships, sorted by organization.
func membersRaw(ctx context.Context, c *codersdk.Client, orgs []codersdk.Organization, prev, next map[uint64]memberEntry) (map[uuid.UUID][]listedMember, error) {
	var mu sync.Mutex
	out := map[uuid.UUID][]listedMember{}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(coderapi.MaxParallel)
	for _, org := range orgs {
		g.Go(func() error {
			res, err := c.Request(gctx, http.MethodGet, fmt.Sprintf("/api/v2/organizations/%s/members", org.ID), nil)
			if err != nil {
				return fmt.Errorf("list members of organization %s: %w", org.Name, err)
			}
			defer func() { _ = res.Body.Close() }()
			if res.StatusCode == http.StatusNotFound {
				return nil // deleted meanwhile
			}
			if res.StatusCode != http.StatusOK {
				return fmt.Errorf("list members of organization %s: %w", org.Name, coderapi.ReadResponseError(res, time.Now()))
			}
			var local []listedMember
			var users []uuid.UUID
			err = elements(jsonskim.NewReader(res.Body), func(raw []byte) error {
				h := hashBytes(raw)
				mu.Lock()
				e, ok := prev[h]
				mu.Unlock()
				if !ok {
					var m codersdk.OrganizationMemberWithUserData
					if err := json.Unmarshal(raw, &m); err != nil {
						return fmt.Errorf("decode coderd's answer: %w", err)
					}
					e = memberEntry{user: m.UserID, roles: roleNames(m.Roles)}
				}
				mu.Lock()
				next[h] = e
				mu.Unlock()
				local = append(local, listedMember{orgID: org.ID, org: aggv1.CoderUserOrganization{Name: org.Name, Roles: e.roles}, hash: h})
				users = append(users, e.user)
				return nil
			})
			if err != nil {
				return fmt.Errorf("list members of organization %s: %w", org.Name, err)
			}
			mu.Lock()
			defer mu.Unlock()
			for i, u := range users {
				out[u] = append(out[u], local[i])
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for id := range out {
		slices.SortFunc(out[id], func(a, b listedMember) int { return compareStrings(a.org.Name, b.org.Name) })
	}
	return out, nil
}
