package identity

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"

	"github.com/coder/coder-k8s/internal/coderapi"
)

// checkTTL is how long coderd's answer to an authorization check is
// reused: a role or ACL changed in Coder shows within this time in lists
// and watches (writes always ask coderd).
const checkTTL = 10 * time.Second

// maxChecks bounds the answers remembered (about 100 bytes each); the
// least recently used go first.
const maxChecks = 100_000

// coderd answers at most 10 checks naming a resource ID per request;
// checks of a set (an owner's workspaces in an organization) are cheap
// and batched more widely.
const (
	maxIDChecks  = 10
	maxSetChecks = 100
)

// Check is one question to coderd's authorization: may the caller do
// Action on the object (a single resource when ResourceID is set, else
// the set of resources of that type the owner and organization name).
type Check struct {
	Resource       codersdk.RBACResource
	Action         codersdk.RBACAction
	OrganizationID uuid.UUID
	OwnerID        uuid.UUID
	ResourceID     uuid.UUID
}

type checkKey struct {
	coderd string
	user   uuid.UUID
	check  Check
}

// checkEntry is coderd's answer to a check, fresh until expires and kept
// keepStale longer to stand in while coderd cannot answer (lastAnswers).
type checkEntry struct {
	allowed bool
	expires time.Time
	// asked is when the question was sent: coderd's answer holds for
	// every object that existed then.
	asked time.Time
}

// cachedCheck is the remembered answer to ch for the caller, fresh or not.
func (c *Caller) cachedCheck(ch Check) (checkEntry, bool) {
	v, ok := c.svc.checks.Get(checkKey{c.token.key.coderd, c.UserID, ch})
	if !ok {
		return checkEntry{}, false
	}
	return v.(checkEntry), true
}

// AllowedAt returns when coderd was last asked whether the caller may do
// ch, if it answered yes, from the service's memory (kept keepStale past
// its time) without asking again; false when no answer is remembered or
// the last one was a refusal. A watch resumed from an earlier list uses it
// to tell whether the caller was shown an object it may no longer read.
func (c *Caller) AllowedAt(ch Check) (time.Time, bool) {
	if c.token == nil {
		return time.Time{}, false
	}
	e, ok := c.cachedCheck(ch)
	if !ok || !e.allowed {
		return time.Time{}, false
	}
	return e.asked, true
}

// Allowed answers checks for the caller, from the service's memory where
// it can and otherwise from coderd's authorization check, sent with the
// caller's own token. out[i] answers checks[i].
func (c *Caller) Allowed(ctx context.Context, checks []Check) ([]bool, error) {
	if c.token == nil {
		// A cluster controller has no Coder user of its own to ask about.
		return nil, fmt.Errorf("the Kubernetes user %q acts with the operator's session, not as a Coder user: coderd's authorization check does not answer for it", c.KubernetesUser)
	}
	s := c.svc
	out := make([]bool, len(checks))
	now := s.now()
	var ask []int
	// A list asks the same check for many objects in a row (a user's read
	// and update are one site-wide check): looked up once.
	var last Check
	var lastEntry checkEntry
	var lastOK bool
	for i, ch := range checks {
		if i == 0 || ch != last {
			last = ch
			lastEntry, lastOK = c.cachedCheck(ch)
		}
		if e, ok := lastEntry, lastOK; ok && now.Before(e.expires) {
			out[i] = e.allowed
			continue
		}
		ask = append(ask, i)
	}
	if len(ask) == 0 {
		return out, nil
	}

	// Each distinct check once, in batches coderd accepts.
	first := map[Check]int{}
	var ids, sets [][]Check
	var curIDs, curSets []Check
	for _, i := range ask {
		ch := checks[i]
		if _, ok := first[ch]; ok {
			continue
		}
		first[ch] = i
		if ch.ResourceID != uuid.Nil {
			if curIDs = append(curIDs, ch); len(curIDs) == maxIDChecks {
				ids, curIDs = append(ids, curIDs), nil
			}
		} else if curSets = append(curSets, ch); len(curSets) == maxSetChecks {
			sets, curSets = append(sets, curSets), nil
		}
	}
	if len(curIDs) > 0 {
		ids = append(ids, curIDs)
	}
	if len(curSets) > 0 {
		sets = append(sets, curSets)
	}
	answers := map[Check]bool{}
	asked := s.now()
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(coderapi.MaxParallel)
	for _, batch := range append(ids, sets...) {
		g.Go(func() error {
			got, err := c.authCheck(gctx, batch)
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			for ch, ok := range got {
				answers[ch] = ok
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		if stale, ok := c.lastAnswers(checks, ask); ok {
			return mergeAnswers(out, ask, stale), nil
		}
		return nil, err
	}
	expires := s.now().Add(checkTTL)
	for ch, ok := range answers {
		s.checks.Add(checkKey{c.token.key.coderd, c.UserID, ch}, checkEntry{allowed: ok, expires: expires, asked: asked}, checkTTL+keepStale)
	}
	for _, i := range ask {
		out[i] = answers[checks[i]]
	}
	return out, nil
}

// lastAnswers returns coderd's last answers to checks[ask], however old
// (up to keepStale), when it has one for each: what a caller sees of a
// coderd that cannot answer now (down, hanging, or known to be failing),
// so that its objects do not vanish from their lists and informers. Writes
// never rely on them: coderd decides those when it answers.
func (c *Caller) lastAnswers(checks []Check, ask []int) ([]bool, bool) {
	out := make([]bool, len(ask))
	for j, i := range ask {
		e, ok := c.cachedCheck(checks[i])
		if !ok {
			return nil, false
		}
		out[j] = e.allowed
	}
	return out, true
}

// mergeAnswers sets out[ask[j]] to answers[j].
func mergeAnswers(out []bool, ask []int, answers []bool) []bool {
	for j, i := range ask {
		out[i] = answers[j]
	}
	return out
}

// authCheck sends one batch to coderd's POST /api/v2/authcheck.
func (c *Caller) authCheck(ctx context.Context, batch []Check) (map[Check]bool, error) {
	req := codersdk.AuthorizationRequest{Checks: make(map[string]codersdk.AuthorizationCheck, len(batch))}
	for i, ch := range batch {
		obj := codersdk.AuthorizationObject{ResourceType: ch.Resource}
		if ch.OrganizationID != uuid.Nil {
			obj.OrganizationID = ch.OrganizationID.String()
		}
		if ch.OwnerID != uuid.Nil {
			obj.OwnerID = ch.OwnerID.String()
		}
		if ch.ResourceID != uuid.Nil {
			obj.ResourceID = ch.ResourceID.String()
		}
		req.Checks[strconv.Itoa(i)] = codersdk.AuthorizationCheck{Object: obj, Action: ch.Action}
	}
	res, err := c.Client.AuthCheck(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("ask coderd what Coder user %s may do: %w", c.Username, err)
	}
	out := make(map[Check]bool, len(batch))
	for i, ch := range batch {
		out[ch] = res[strconv.Itoa(i)]
	}
	return out, nil
}
