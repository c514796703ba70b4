package identity

// One file (over 500 lines) for the Kubernetes-to-Coder user mapping and the
// tokens minted for it: the user and token caches, minting, revocation and
// eviction share one lock.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/go-logr/logr"
	"github.com/google/uuid"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/coder/coder-k8s/internal/coderapi"
)

// Token lifetimes. coderd extends a token used after more than an hour
// of its life has passed only when its lifetime exceeds an hour, so an
// hour is the longest lifetime that really ends. A token is replaced once
// less than renewBefore is left, so that no request starts with a token
// about to expire: in steady use a user costs 60/45 tokens an hour.
const (
	TokenLifetime = time.Hour
	renewBefore   = 15 * time.Minute
	// idleAfter is how long a token unused is kept before it is revoked.
	idleAfter = 15 * time.Minute
	// userTTL is how long a Kubernetes user's Coder user is remembered:
	// a user renamed in Coder is seen within this time. (coderd refuses
	// a suspended user's token at once; that refusal also makes the
	// mapping be looked up again.) User lookups share coderd's rate
	// limit of GET /api/v2/users with every other caller.
	userTTL = 2 * time.Minute
	// refusedTTL is how long a refusal is remembered, so that a caller
	// who is not mapped does not cost a user lookup per request, while a
	// user just created in Coder is found quickly.
	refusedTTL = 5 * time.Second
	// keepStale is how long past their time coderd's last answers (who a
	// Kubernetes user is, what they may read) are kept to stand in while
	// coderd cannot answer.
	keepStale = time.Hour
	// maxTokens bounds the tokens held, and the users remembered; the
	// least recently used go first.
	maxTokens = 10000
	// revokeGrace lets requests already sent with a replaced token finish
	// before it is revoked.
	revokeGrace = 30 * time.Second
	// revokeTimeout bounds each revocation.
	revokeTimeout = 10 * time.Second
)

// Coderd is one coderd as the service sees it.
type Coderd struct {
	// Key identifies the coderd and the operator session calling it; it
	// keys every cache.
	Key string
	// Name says, in messages, which control plane this is.
	Name string
	// Tag names the control plane in token names ("<namespace>_<name>",
	// or "static").
	Tag string
	// Owner calls coderd as the operator's owner user. It changes when
	// the operator's token rotates: the service mints and revokes every
	// caller's token with the Owner of the latest Caller call.
	Owner *codersdk.Client
	Rules Rules
	// Reserved are the Coder usernames coder-k8s uses for itself in this
	// coderd (its operator user, the first user it created): no
	// Kubernetes user is mapped onto them.
	Reserved []string
}

// reserves reports whether username is one cd keeps for coder-k8s.
func (cd Coderd) reserves(username string) bool {
	for _, r := range cd.Reserved {
		if strings.EqualFold(r, username) {
			return true
		}
	}
	return false
}

// Refused is why a caller may not act in a coderd; the aggregated API
// answers it with 403 Forbidden.
type Refused struct{ Reason string }

func (e *Refused) Error() string { return e.Reason }

// IsRefused reports whether err is a refusal.
func IsRefused(err error) bool {
	var r *Refused
	return errors.As(err, &r)
}

// Caller is a Kubernetes user acting as their Coder user in one coderd,
// or a cluster controller acting with the operator's session.
type Caller struct {
	// KubernetesUser is the authenticated Kubernetes username.
	KubernetesUser string
	// ClusterController says KubernetesUser is one of the cluster's own
	// controllers (Options.ClusterControllers): Client is the operator's
	// owner session, UserID is uuid.Nil and Username "", and what it may
	// do is for the caller of Caller to restrict (Allowed does not answer
	// for it).
	ClusterController bool
	UserID            uuid.UUID
	Username          string
	// Client calls coderd as the Coder user, with a token the service
	// keeps fresh: it is re-minted once when coderd answers 401.
	Client *codersdk.Client

	svc   *Service
	token *tokenEntry
}

// Service maps callers and holds their tokens. Run must run for tokens to
// be revoked when idle and at shutdown.
type Service struct {
	log logr.Logger
	now func() time.Time
	// clusterControllers are Options.ClusterControllers.
	clusterControllers map[string]bool

	// users are the Coder users of Kubernetes users (*userEntry), at
	// most maxTokens, and checks coderd's answers to authorization checks
	// (checkEntry), at most maxChecks; each cache has its own lock.
	users, checks *cache.LRUExpireCache

	mu     sync.Mutex
	tokens map[tokenKey]*tokenEntry
	// owners is the Coderd.Owner of the latest Caller call per coderd
	// key, for the token entries of that coderd.
	owners map[string]*codersdk.Client
	// revoking tracks revocations so that shutdown waits for them.
	revoking sync.WaitGroup
	stopped  bool
	// stop ends the grace periods of pending revocations at shutdown.
	stop chan struct{}
	// minted counts tokens minted, for benchmarks and metrics.
	minted uint64
	// grace is revokeGrace (shorter in tests).
	grace time.Duration
	// lifetime and renew are TokenLifetime and renewBefore: the tokens
	// per hour benchmark runs them scaled down, in real time.
	lifetime, renew time.Duration
}

type userKey struct{ coderd, kubernetesUser string }

type userEntry struct {
	user    codersdk.User
	refused error
	expires time.Time
}

type tokenKey struct {
	coderd string
	user   uuid.UUID
}

// tokenEntry is one Coder user's token in one coderd. mu serialises
// minting, so concurrent requests share one new token. Lock order: an
// entry's mu before the service's.
type tokenEntry struct {
	key tokenKey
	// name and tag are the coderd's Coderd.Name and Coderd.Tag.
	name, tag string
	userID    uuid.UUID
	client    *codersdk.Client
	// owner is the Coderd.Owner of the latest Caller call for this
	// coderd (any user's): tokens are minted and revoked with it, so that
	// an operator token rotated (and revoked) is not used again. It is
	// swapped without mu, so that a Caller call never waits for a mint;
	// a mint reads it once.
	owner atomic.Pointer[codersdk.Client]
	// lastUsed is in Unix nanoseconds.
	lastUsed atomic.Int64

	mu      sync.Mutex
	token   string
	keyID   string
	expires time.Time
	// evicted says the entry left the service's map; a caller still
	// holding it puts it back when it mints again.
	evicted bool
}

// Options tune a Service.
type Options struct {
	// ClusterControllers are exact Kubernetes usernames of the cluster's
	// own controllers (kube-controller-manager's garbage collector and
	// namespace controller): in Mapped mode they act with the operator's
	// owner session instead of being mapped onto a Coder user.
	ClusterControllers []string
}

// New returns a service logging to log.
func New(log logr.Logger, o Options) *Service {
	cc := make(map[string]bool, len(o.ClusterControllers))
	for _, name := range o.ClusterControllers {
		cc[name] = true
	}
	s := &Service{log: log.WithName("identity"), now: time.Now, clusterControllers: cc,
		tokens: map[tokenKey]*tokenEntry{},
		owners: map[string]*codersdk.Client{}, stop: make(chan struct{}), grace: revokeGrace,
		lifetime: TokenLifetime, renew: renewBefore}
	s.users = cache.NewLRUExpireCacheWithClock(maxTokens, serviceClock{s})
	s.checks = cache.NewLRUExpireCacheWithClock(maxChecks, serviceClock{s})
	return s
}

// serviceClock is the service's clock (s.now, which tests set) for its
// caches.
type serviceClock struct{ s *Service }

func (c serviceClock) Now() time.Time { return c.s.now() }

// Run revokes idle tokens until ctx ends, then revokes every token it
// holds and waits (bounded) for the revocations.
func (s *Service) Run(ctx context.Context) error {
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			s.shutdown()
			return nil
		case <-tick.C:
			s.evictIdle()
		}
	}
}

// NeedLeaderElection is false: every replica serves requests.
func (s *Service) NeedLeaderElection() bool { return false }

// Minted returns how many tokens the service has minted.
func (s *Service) Minted() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.minted
}

// Caller maps u onto its Coder user in cd and returns a client acting as
// that user; a cluster controller (Options.ClusterControllers) gets the
// operator's session when cd maps identities, without a call to coderd.
// A *Refused error says why u may not act there; any other error is
// coderd failing to answer.
func (s *Service) Caller(ctx context.Context, cd Coderd, u user.Info) (*Caller, error) {
	return s.caller(ctx, cd, u, false)
}

// CallerToWrite is Caller for a request that writes: a refusal remembered
// from an earlier request (refusedTTL) is looked up again, so that a
// Coder user created a moment ago may write at once, whatever the same
// Kubernetes user read before (a garbage collector's or Argo CD's lists
// share the user of kubectl in many clusters).
func (s *Service) CallerToWrite(ctx context.Context, cd Coderd, u user.Info) (*Caller, error) {
	return s.caller(ctx, cd, u, true)
}

func (s *Service) caller(ctx context.Context, cd Coderd, u user.Info, write bool) (*Caller, error) {
	name := ""
	if u != nil {
		name = u.GetName()
	}
	if cd.Rules.Mapped() && s.clusterControllers[name] {
		return &Caller{KubernetesUser: name, ClusterController: true, Client: cd.Owner, svc: s}, nil
	}
	cu, err := s.coderUser(ctx, cd, name, write)
	if err != nil {
		return nil, err
	}
	e := s.tokenFor(cd, cu.ID)
	return &Caller{KubernetesUser: name, UserID: cu.ID, Username: cu.Username, Client: e.client, svc: s, token: e}, nil
}

// coderUser finds (or remembers) the Coder user of Kubernetes user name;
// for a write, a remembered refusal is not trusted.
func (s *Service) coderUser(ctx context.Context, cd Coderd, name string, write bool) (codersdk.User, error) {
	key := userKey{cd.Key, name}
	now := s.now()
	// A user remembered before it became reserved (the first user's
	// Secret appeared) is looked up again, and refused.
	if e, ok := s.cachedUser(key); ok && now.Before(e.expires) {
		if e.refused == nil && !cd.reserves(e.user.Username) {
			return e.user, nil
		}
		if e.refused != nil && !write {
			return e.user, e.refused
		}
	}

	u, err := s.lookup(ctx, cd, name)
	var refused *Refused
	switch {
	case err == nil:
		s.rememberUser(key, &userEntry{user: u, expires: now.Add(userTTL)})
	case errors.As(err, &refused):
		s.rememberUser(key, &userEntry{refused: err, expires: now.Add(refusedTTL)})
	default:
		// coderd did not answer: the user it last named, if any, so that
		// reads of what the cache last saw go on (writes need coderd).
		if e, ok := s.cachedUser(key); ok && e.refused == nil && !cd.reserves(e.user.Username) {
			return e.user, nil
		}
	}
	return u, err
}

// cachedUser is what is remembered of key, fresh or not.
func (s *Service) cachedUser(key userKey) (*userEntry, bool) {
	v, ok := s.users.Get(key)
	if !ok {
		return nil, false
	}
	return v.(*userEntry), true
}

// rememberUser keeps e for keepStale past its time: it stands in when
// coderd cannot answer (coderUser).
func (s *Service) rememberUser(key userKey, e *userEntry) {
	s.users.Add(key, e, e.expires.Sub(s.now())+keepStale)
}

// lookup asks coderd, as the operator, for the Coder user name maps to.
func (s *Service) lookup(ctx context.Context, cd Coderd, name string) (codersdk.User, error) {
	c, err := cd.Rules.lookupFor(name)
	if err != nil {
		return codersdk.User{}, err
	}
	what := fmt.Sprintf("Kubernetes user %q", name)
	if c.explicit {
		what += fmt.Sprintf(" (mapped explicitly to %q)", c.value)
	}
	var matches []codersdk.User
	if c.field == MatchUsername {
		u, err := cd.Owner.User(ctx, c.value)
		switch {
		case coderapi.IsNotFound(err) || coderapi.StatusCode(err) == http.StatusBadRequest:
		case err != nil:
			return codersdk.User{}, fmt.Errorf("look up Coder user %q in %s: %w", c.value, cd.Name, err)
		case strings.EqualFold(u.Username, c.value):
			matches = append(matches, u)
		}
	} else if strings.Contains(c.value, "@") {
		// The search matches a substring of the email or the username;
		// only exact (case-insensitive) email matches count. Something
		// without an @ is no email and is not searched for; a search
		// coderd refuses as a query (a "key:value" filter it does not
		// know, as in an OIDC "issuer#subject" username) matches no one.
		for offset := 0; ; {
			res, err := cd.Owner.Users(ctx, codersdk.UsersRequest{Search: c.value, Pagination: codersdk.Pagination{Limit: 100, Offset: offset}})
			if coderapi.StatusCode(err) == http.StatusBadRequest {
				break
			}
			if err != nil {
				return codersdk.User{}, fmt.Errorf("look up Coder users by email %q in %s: %w", c.value, cd.Name, err)
			}
			for _, u := range res.Users {
				if strings.EqualFold(u.Email, c.value) {
					matches = append(matches, u)
				}
			}
			offset += len(res.Users)
			if len(res.Users) < 100 || offset >= res.Count {
				break
			}
		}
	}
	field := "username"
	if c.field == MatchEmail {
		field = "email"
	}
	switch {
	case len(matches) == 0:
		return codersdk.User{}, &Refused{Reason: fmt.Sprintf("%s has no Coder user in %s: no user's %s is %q", what, cd.Name, field, c.value)}
	case len(matches) > 1:
		names := make([]string, len(matches))
		for i, m := range matches {
			names[i] = m.Username
		}
		return codersdk.User{}, &Refused{Reason: fmt.Sprintf("%s matches several Coder users in %s (%s whose %s is %q): map it explicitly", what, cd.Name, strings.Join(names, ", "), field, c.value)}
	case cd.reserves(matches[0].Username):
		return codersdk.User{}, &Refused{Reason: fmt.Sprintf("%s maps to Coder user %q in %s, which coder-k8s uses for itself: map it to a Coder user of its own", what, matches[0].Username, cd.Name)}
	case matches[0].Status == codersdk.UserStatusSuspended:
		return codersdk.User{}, &Refused{Reason: fmt.Sprintf("%s maps to Coder user %q in %s, which is suspended", what, matches[0].Username, cd.Name)}
	}
	return matches[0], nil
}

// tokenFor returns the token entry of a Coder user, creating it (without
// a token yet: the first request mints one), and makes cd's owner session
// the one every token of cd is minted and revoked with from now on.
func (s *Service) tokenFor(cd Coderd, userID uuid.UUID) *tokenEntry {
	key := tokenKey{cd.Key, userID}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.owners[cd.Key] != cd.Owner {
		// The operator token changed (the backend built a new client):
		// every user of this coderd moves to it, including those who
		// make no request until their token is revoked.
		s.owners[cd.Key] = cd.Owner
		for k, e := range s.tokens {
			if k.coderd == cd.Key {
				e.owner.Store(cd.Owner)
			}
		}
	}
	if e, ok := s.tokens[key]; ok {
		return e
	}
	if len(s.tokens) >= maxTokens {
		s.evictLRULocked()
	}
	e := &tokenEntry{key: key, name: cd.Name, tag: cd.Tag, userID: userID}
	e.owner.Store(cd.Owner)
	e.lastUsed.Store(s.now().UnixNano())
	e.client = codersdk.New(cd.Owner.URL, codersdk.WithHTTPClient(&http.Client{
		Transport: &userTransport{svc: s, e: e},
	}))
	s.tokens[key] = e
	return e
}

// current returns a token of e with at least renewBefore left, minting
// one when needed; stale, when not "", is a token coderd refused, which
// must be replaced even if it looks fresh.
func (s *Service) current(ctx context.Context, e *tokenEntry, stale string) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := s.now()
	e.lastUsed.Store(now.UnixNano())
	if e.token != "" && e.token != stale && now.Add(s.renew).Before(e.expires) {
		return e.token, nil
	}
	s.mu.Lock()
	stopped := s.stopped
	if e.evicted && !stopped {
		if _, ok := s.tokens[e.key]; !ok {
			s.tokens[e.key] = e
		}
		e.evicted = false
	}
	owner := s.ownerLocked(e)
	s.mu.Unlock()
	if stopped {
		return "", errors.New("coder-k8s is shutting down: no new Coder tokens are minted")
	}
	if err := ctx.Err(); err != nil {
		// The request has ended, or is one that must not wait for a
		// coderd known to be failing: no mint on its behalf.
		return "", fmt.Errorf("mint a token for Coder user %s: %w", e.userID, err)
	}
	name, err := tokenName(e.tag, now)
	if err != nil {
		return "", err
	}
	// Minted as the operator, detached from the request: other requests
	// wait for this token too.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), revokeTimeout)
	defer cancel()
	res, err := owner.CreateToken(mctx, e.userID.String(), codersdk.CreateTokenRequest{Lifetime: s.lifetime, TokenName: name})
	if err != nil {
		return "", fmt.Errorf("mint a token for Coder user %s in %s with the operator's session: %w", e.userID, e.name, err)
	}
	old, oldID := e.token, e.keyID
	e.token, e.keyID, e.expires = res.Key, keyID(res.Key), now.Add(s.lifetime)
	s.mu.Lock()
	s.minted++
	s.mu.Unlock()
	if old != "" {
		s.revokeLater(e, oldID, s.grace)
	}
	return e.token, nil
}

// ownerLocked returns the owner session to mint and revoke e's tokens
// with: the latest Caller call's for e's coderd, which an entry out of
// the map (evicted) missed, or, once the service forgot that coderd, the
// last one e saw. s.mu is held.
func (s *Service) ownerLocked(e *tokenEntry) *codersdk.Client {
	if o := s.owners[e.key.coderd]; o != nil {
		e.owner.Store(o)
		return o
	}
	return e.owner.Load()
}

// tokenName names a token so that an administrator listing a user's
// tokens sees it came from coder-k8s and for which control plane; names
// are unique per user.
func tokenName(tag string, now time.Time) (string, error) {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("token name: %w", err)
	}
	return fmt.Sprintf("coder-k8s_%s_%s_%s", tag, now.UTC().Format("20060102T150405Z"), hex.EncodeToString(b)), nil
}

// keyID is the public half of a Coder API key ("<id>-<secret>"), which
// names it in the revoke request.
func keyID(token string) string {
	id, _, _ := strings.Cut(token, "-")
	return id
}

// revokeLater revokes a token of e's user after delay, unless the service
// is stopping (shutdown revokes what is left at once).
func (s *Service) revokeLater(e *tokenEntry, id string, delay time.Duration) {
	if id == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	s.revoking.Add(1)
	go func() {
		defer s.revoking.Done()
		if delay > 0 {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-s.stop:
				t.Stop()
			}
		}
		s.revoke(e, id)
	}()
}

// revoke deletes a token of e's user with the owner session current now,
// which after a delay may not be the one that minted it.
func (s *Service) revoke(e *tokenEntry, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), revokeTimeout)
	defer cancel()
	s.mu.Lock()
	owner := s.ownerLocked(e)
	s.mu.Unlock()
	err := owner.DeleteAPIKey(ctx, e.userID.String(), id)
	if err != nil && !coderapi.IsNotFound(err) {
		s.log.Info("could not revoke a caller's token; it expires within an hour", "coderd", e.name, "user", e.userID, "keyID", id, "error", err.Error())
	}
}

// evictIdle drops and revokes tokens nobody used for idleAfter.
func (s *Service) evictIdle() {
	now := s.now()
	s.mu.Lock()
	var idle []*tokenEntry
	// used are the coderds someone still holds a token for; the owner
	// sessions of the others (a control plane deleted, or its URL
	// changed) are dropped.
	used := map[string]bool{}
	for k, e := range s.tokens {
		if now.Sub(time.Unix(0, e.lastUsed.Load())) > idleAfter {
			idle = append(idle, e)
		} else {
			used[k.coderd] = true
		}
	}
	for k := range s.owners {
		if !used[k] {
			delete(s.owners, k)
		}
	}
	s.mu.Unlock()
	for _, e := range idle {
		s.evict(e, 0)
	}
}

// evict takes e out of the map and revokes its token after delay.
func (s *Service) evict(e *tokenEntry, delay time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s.mu.Lock()
	if s.tokens[e.key] == e {
		delete(s.tokens, e.key)
	}
	s.mu.Unlock()
	e.evicted = true
	if e.token != "" && s.now().Before(e.expires) {
		s.revokeLater(e, e.keyID, delay)
	}
	e.token, e.keyID = "", ""
}

// evictLRULocked drops the least recently used tenth of the tokens; s.mu
// is held, so the revocations run on their own.
func (s *Service) evictLRULocked() {
	n := len(s.tokens) / 10
	for ; n > 0; n-- {
		var oldest *tokenEntry
		for _, e := range s.tokens {
			if oldest == nil || e.lastUsed.Load() < oldest.lastUsed.Load() {
				oldest = e
			}
		}
		delete(s.tokens, oldest.key)
		go s.evict(oldest, s.grace)
	}
}

// shutdown revokes every token held and waits for the revocations.
func (s *Service) shutdown() {
	s.mu.Lock()
	if !s.stopped {
		close(s.stop)
	}
	s.stopped = true
	tokens := s.tokens
	s.tokens = map[tokenKey]*tokenEntry{}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, e := range tokens {
		e.mu.Lock()
		id, live := e.keyID, e.token != "" && s.now().Before(e.expires)
		e.token = ""
		e.mu.Unlock()
		if live {
			wg.Go(func() { s.revoke(e, id) })
		}
	}
	wg.Wait()
	s.revoking.Wait()
}
