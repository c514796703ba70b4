package watchcache

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// resourceVersions; the package doc says what they are and why.

const (
	// incarnationBytes of randomness name a cache: 12 hex digits, so two
	// caches (replicas, or one replica before and after a restart) share
	// a name with probability 2^-48.
	incarnationBytes = 6
	incarnationLen   = 2 * incarnationBytes
	// fpBits of the FNV-1a hash are the content fingerprint: a change
	// goes unnoticed, or a stale precondition passes, with probability
	// 2^-48.
	fpBits = 48
	fpMask = 1<<fpBits - 1
	// fpLen is the fingerprint's width in hex digits.
	fpLen = fpBits / 4
)

// newIncarnation names a new cache.
func newIncarnation() string {
	var b [incarnationBytes]byte
	// crypto/rand.Read never fails (it crashes the program instead).
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// version is a parsed resourceVersion.
type version struct {
	incarnation string
	seq         uint64
	// fp is an object version's content fingerprint; hasFP is false for
	// list and bookmark versions, which describe no one object.
	fp    uint64
	hasFP bool
}

// String is the resourceVersion: "<incarnation>.<seq>" for lists and
// bookmarks, "<incarnation>.<seq>.<fingerprint>" for objects.
func (v version) String() string {
	s := v.incarnation + "." + strconv.FormatUint(v.seq, 10)
	if v.hasFP {
		s += fmt.Sprintf(".%0*x", fpLen, v.fp)
	}
	return s
}

// parseVersion is the one parser of resourceVersions. It accepts exactly
// what version.String produces, of any incarnation; everything else
// (decimals of the previous format, "", "0", anything made up) fails;
// callers tell the previous format (410, a relist) from garbage (400).
func parseVersion(rv string) (version, error) {
	bad := fmt.Errorf("%q is not a resourceVersion of this API server (<incarnation>.<sequence>[.<fingerprint>])", rv)
	parts := strings.Split(rv, ".")
	if len(parts) != 2 && len(parts) != 3 {
		return version{}, bad
	}
	v := version{incarnation: parts[0]}
	if len(v.incarnation) != incarnationLen || strings.Trim(v.incarnation, "0123456789abcdef") != "" {
		return version{}, bad
	}
	seq, err := strconv.ParseUint(parts[1], 10, 64)
	if err != nil {
		return version{}, bad
	}
	v.seq = seq
	if len(parts) == 3 {
		fp, err := strconv.ParseUint(parts[2], 16, fpBits)
		if err != nil {
			return version{}, bad
		}
		v.fp, v.hasFP = fp, true
	}
	// One string per version: no leading zeros, no upper-case digits, a
	// fingerprint of full width.
	if v.String() != rv {
		return version{}, bad
	}
	return v, nil
}

// objectRV is the resourceVersion of an object stored at seq with
// fingerprint fp.
func (c *Cache) objectRV(seq, fp uint64) string {
	return version{incarnation: c.incarnation, seq: seq, fp: fp, hasFP: true}.String()
}

// listRV is the resourceVersion of a list or bookmark as of seq.
func (c *Cache) listRV(seq uint64) string {
	return version{incarnation: c.incarnation, seq: seq}.String()
}

// ownSeqLocked returns the seq of rv, a resourceVersion that a request
// continues from, or the 410 Expired error on which clients list again:
// rv is not this cache's (another replica's, an earlier process's or the
// previous, decimal format's), or it is this cache's but newer than
// anything it issued, so it cannot say what happened after rv. A string
// of neither format is a 400.
func (c *Cache) ownSeqLocked(rv string) (uint64, error) {
	v, err := parseVersion(rv)
	if _, decimal := strconv.ParseUint(rv, 10, 64); err != nil && decimal != nil {
		// No API server ever issued it: a client's bug, not a reason to
		// list again.
		return 0, apierrors.NewBadRequest(fmt.Sprintf("invalid resourceVersion: %v", err))
	}
	if err != nil || v.incarnation != c.incarnation {
		return 0, apierrors.NewResourceExpired(fmt.Sprintf(
			"resourceVersion %q was issued by another replica or another instance of this API server (this one's begin with %q); list again to get a current resourceVersion",
			rv, c.incarnation+"."))
	}
	if v.seq > c.lastSeq {
		return 0, apierrors.NewResourceExpired(fmt.Sprintf(
			"resourceVersion %q is newer than any this instance of the API server issued (its latest is %q); list again to get a current resourceVersion",
			rv, c.listRV(c.lastSeq)))
	}
	return v.seq, nil
}

// Issued reports whether rv is a resourceVersion this cache issued, so
// that it holds everything rv describes: a LIST "not older than" rv may
// be answered from it. A version of another replica or process says
// nothing about this cache's state; such a list must read coderd.
func (c *Cache) Issued(rv string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, err := c.ownSeqLocked(rv)
	return err == nil
}

// CheckExact returns nil when a LIST with resourceVersionMatch=Exact at
// rv can be answered from the cache: rv is of its latest change, so the
// cache holds that state. Otherwise it returns 410 Expired (the client
// lists again without Exact): the cache keeps no earlier states, and a
// version of another replica or process is unknown here.
func (c *Cache) CheckExact(rv string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	seq, err := c.ownSeqLocked(rv)
	if err != nil {
		return err
	}
	if seq != c.lastSeq {
		return apierrors.NewResourceExpired(fmt.Sprintf(
			"too old resource version: %s (this API server answers resourceVersionMatch=Exact only at its latest, %s)", rv, c.listRV(c.lastSeq)))
	}
	return nil
}

// SameContent reports whether two object resourceVersions carry the same
// content fingerprint. Unlike comparing the strings it also holds across
// server replicas and restarts, whose incarnations and sequences differ;
// use it for optimistic-concurrency preconditions. A list or bookmark
// version, one of the previous (decimal) format or anything else that is
// not an object version matches nothing, so such a precondition
// conflicts and the client reads the object again.
func SameContent(rvA, rvB string) bool {
	a, errA := parseVersion(rvA)
	b, errB := parseVersion(rvB)
	return errA == nil && errB == nil && a.hasFP && b.hasFP && a.fp == b.fp
}
