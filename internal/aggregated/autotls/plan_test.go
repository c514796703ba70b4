package autotls

import (
	"bytes"
	"crypto/x509"
	"maps"
	"testing"
	"time"
)

const (
	testCertValidity = 24 * time.Hour
	testCAValidity   = 30 * 24 * time.Hour
)

var testNames = DNSNames("svc", "ns")

// planAt plans from data at now; trusted answers whether the APIService
// trusts the current CA.
func planAt(t *testing.T, data map[string][]byte, now time.Time, trusted bool) plan {
	t.Helper()
	p, err := makePlan(planInput{
		data: data, now: now, dnsNames: testNames,
		certValidity: testCertValidity, caValidity: testCAValidity, caName: "svc-ca",
		trusted: func(*x509.Certificate) bool { return trusted },
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustParse(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	c := parseCerts(certPEM)
	if len(c) == 0 {
		t.Fatal("no certificate")
	}
	return c[0]
}

// checkConsistent checks what every plan must produce: the serving
// certificate verifies for every name against the bundle at now, and the
// bundle starts with the CA.
func checkConsistent(t *testing.T, p plan, now time.Time) {
	t.Helper()
	bundle := parseCerts(p.data[CABundleKey])
	if len(bundle) == 0 || !bundle[0].Equal(mustParse(t, p.data[CACertKey])) {
		t.Fatalf("bundle does not start with the CA")
	}
	leaf, err := parseKeyPair(p.data[TLSCertKey], p.data[TLSKeyKey])
	if err != nil {
		t.Fatalf("serving certificate: %v", err)
	}
	for _, n := range testNames {
		if err := verifyServing(leaf.cert, bundle, n, now); err != nil {
			t.Errorf("serving certificate for %s: %v", n, err)
		}
	}
}

func TestPlanCreatesEverythingForAMissingSecret(t *testing.T) {
	now := time.Now()
	p := planAt(t, nil, now, false)
	if !p.changed || p.held {
		t.Fatalf("changed=%v held=%v, want a write", p.changed, p.held)
	}
	for _, k := range []string{CACertKey, CAKeyKey, CABundleKey, TLSCertKey, TLSKeyKey} {
		if len(p.data[k]) == 0 {
			t.Errorf("%s is empty", k)
		}
	}
	checkConsistent(t, p, now)
	if got := parseCerts(p.data[CABundleKey]); len(got) != 1 {
		t.Errorf("bundle holds %d certificates, want the CA only", len(got))
	}
	// Nothing falls due before the serving certificate's renewal time.
	if want := renewAt(mustParse(t, p.data[TLSCertKey])); !p.next.Equal(want) {
		t.Errorf("next = %s, want %s", p.next, want)
	}
}

func TestPlanKeepsWhatIsGood(t *testing.T) {
	now := time.Now()
	p1 := planAt(t, nil, now, true)
	for _, later := range []time.Duration{0, time.Hour, 15 * time.Hour} {
		p2 := planAt(t, p1.data, now.Add(later), false)
		if p2.changed || p2.held {
			t.Errorf("after %s: changed=%v held=%v (%v), want nothing to do", later, p2.changed, p2.held, p2.reasons)
		}
		if !maps.EqualFunc(p1.data, p2.data, bytes.Equal) {
			t.Errorf("after %s: data changed", later)
		}
	}
}

func TestPlanRenewsTheServingCertificateWithTheSameCA(t *testing.T) {
	now := time.Now()
	p1 := planAt(t, nil, now, true)
	due := renewAt(mustParse(t, p1.data[TLSCertKey])).Add(time.Second)

	// The APIService does not hold the CA (a re-applied manifest wiped
	// it): the working certificate is kept until it does.
	held := planAt(t, p1.data, due, false)
	if !held.held || held.changed {
		t.Fatalf("held=%v changed=%v, want held without a write", held.held, held.changed)
	}

	p2 := planAt(t, p1.data, due, true)
	if !p2.changed || p2.held {
		t.Fatalf("changed=%v held=%v, want a renewal", p2.changed, p2.held)
	}
	for _, k := range []string{CACertKey, CAKeyKey, CABundleKey} {
		if !bytes.Equal(p1.data[k], p2.data[k]) {
			t.Errorf("%s changed on a serving certificate renewal", k)
		}
	}
	if bytes.Equal(p1.data[TLSCertKey], p2.data[TLSCertKey]) || bytes.Equal(p1.data[TLSKeyKey], p2.data[TLSKeyKey]) {
		t.Error("serving certificate or key not replaced")
	}
	checkConsistent(t, p2, due)
	if leaf := mustParse(t, p2.data[TLSCertKey]); leaf.NotAfter.Sub(due) > testCertValidity {
		t.Errorf("renewed certificate valid until %s, more than certValidity", leaf.NotAfter)
	}
}

func TestPlanReissuesTheServingCertificate(t *testing.T) {
	now := time.Now()
	p1 := planAt(t, nil, now, true)
	cases := map[string]func(p *planInput){
		"names changed": func(p *planInput) { p.dnsNames = DNSNames("other", "ns") },
		"certValidity shortened": func(p *planInput) {
			p.certValidity = time.Hour
		},
		"key lost": func(p *planInput) { delete(p.data, TLSKeyKey) },
		"key of another certificate": func(p *planInput) {
			p.data[TLSKeyKey] = p.data[CAKeyKey]
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			in := planInput{
				data: maps.Clone(p1.data), now: now.Add(time.Minute), dnsNames: testNames,
				certValidity: testCertValidity, caValidity: testCAValidity, caName: "svc-ca",
				trusted: func(*x509.Certificate) bool { return true },
			}
			mutate(&in)
			p, err := makePlan(in)
			if err != nil {
				t.Fatal(err)
			}
			if !p.changed || bytes.Equal(p.data[TLSCertKey], p1.data[TLSCertKey]) {
				t.Fatalf("serving certificate not reissued (%v)", p.reasons)
			}
			if !bytes.Equal(p.data[CACertKey], p1.data[CACertKey]) {
				t.Error("CA replaced")
			}
			leaf := mustParse(t, p.data[TLSCertKey])
			if !sameNames(leaf.DNSNames, in.dnsNames) {
				t.Errorf("names %v, want %v", leaf.DNSNames, in.dnsNames)
			}
			if leaf.NotAfter.Sub(in.now) > in.certValidity {
				t.Errorf("valid until %s, more than %s", leaf.NotAfter, in.certValidity)
			}
		})
	}
}

// A CA due for renewal is replaced; the old one stays in the bundle, and
// the serving certificate moves to the new CA only once the APIService
// trusts it.
func TestPlanRotatesTheCAKeepingTheOldOneTrusted(t *testing.T) {
	t0 := time.Now()
	p := planAt(t, nil, t0, true)
	oldCA := mustParse(t, p.data[CACertKey])
	caDue := renewAt(oldCA).Add(time.Second)
	// Serving certificates renewed meanwhile, up to shortly before.
	for now := t0; now.Before(caDue.Add(-testCertValidity)); now = now.Add(testCertValidity / 2) {
		q := planAt(t, p.data, now, true)
		if !bytes.Equal(q.data[CACertKey], p.data[CACertKey]) {
			t.Fatalf("CA replaced at %s, before it was due", now)
		}
		p = q
	}
	p = planAt(t, p.data, caDue.Add(-testCertValidity/2), true)
	oldLeaf := p.data[TLSCertKey]

	rotated := planAt(t, p.data, caDue, false)
	newCA := mustParse(t, rotated.data[CACertKey])
	if newCA.Equal(oldCA) || !rotated.changed {
		t.Fatal("CA not replaced")
	}
	bundle := parseCerts(rotated.data[CABundleKey])
	if len(bundle) != 2 || !bundle[0].Equal(newCA) || !bundle[1].Equal(oldCA) {
		t.Fatalf("bundle holds %d certificates, want the new CA then the old one", len(bundle))
	}
	if !rotated.held || !bytes.Equal(rotated.data[TLSCertKey], oldLeaf) {
		t.Fatal("serving certificate replaced before the APIService trusts the new CA")
	}
	checkConsistent(t, rotated, caDue)

	// Written; the APIService now holds the bundle.
	moved := planAt(t, rotated.data, caDue, true)
	if moved.held || !moved.changed {
		t.Fatalf("held=%v changed=%v (%v), want the serving certificate moved to the new CA", moved.held, moved.changed, moved.reasons)
	}
	if !bytes.Equal(moved.data[CACertKey], rotated.data[CACertKey]) || !bytes.Equal(moved.data[CABundleKey], rotated.data[CABundleKey]) {
		t.Error("CA or bundle changed again")
	}
	leaf := mustParse(t, moved.data[TLSCertKey])
	if err := verifyServing(leaf, []*x509.Certificate{newCA}, testNames[2], caDue); err != nil {
		t.Errorf("new serving certificate is not signed by the new CA: %v", err)
	}
	// Stable from here.
	if again := planAt(t, moved.data, caDue.Add(time.Minute), true); again.changed {
		t.Errorf("changed again: %v", again.reasons)
	}

	// The old CA leaves the bundle once it has expired.
	pruned := planAt(t, moved.data, oldCA.NotAfter.Add(time.Second), true)
	if b := parseCerts(pruned.data[CABundleKey]); len(b) != 1 || !b[0].Equal(newCA) {
		t.Errorf("bundle after the old CA expired holds %d certificates, want the new CA only", len(b))
	}
	checkConsistent(t, pruned, oldCA.NotAfter.Add(time.Second))
}

// With a long-lived serving certificate, the next event after a CA
// rotation is the old CA's expiry, when it leaves the bundle.
func TestPlanNextIsTheOldCAExpiry(t *testing.T) {
	plan := func(data map[string][]byte, now time.Time) plan {
		p, err := makePlan(planInput{
			data: data, now: now, dnsNames: testNames,
			certValidity: 20 * 24 * time.Hour, caValidity: testCAValidity, caName: "svc-ca",
			trusted: func(*x509.Certificate) bool { return true },
		})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := plan(nil, time.Now())
	oldCA := mustParse(t, p.data[CACertKey])
	now := renewAt(oldCA).Add(time.Second)
	p = plan(p.data, now)
	if mustParse(t, p.data[CACertKey]).Equal(oldCA) {
		t.Fatal("CA not rotated")
	}
	if !p.next.Equal(oldCA.NotAfter) {
		t.Errorf("next = %s, want the old CA's expiry %s", p.next, oldCA.NotAfter)
	}
}

func TestPlanReplacesAnUnusableCA(t *testing.T) {
	now := time.Now()
	p1 := planAt(t, nil, now, true)
	data := maps.Clone(p1.data)
	delete(data, CAKeyKey)
	p := planAt(t, data, now.Add(time.Minute), false)
	if bytes.Equal(p.data[CACertKey], p1.data[CACertKey]) || len(p.data[CAKeyKey]) == 0 {
		t.Fatal("CA without its key not replaced")
	}
	// The old CA certificate still verifies the serving certificate in
	// use, which is kept until the APIService trusts the new CA.
	if !p.held || !bytes.Equal(p.data[TLSCertKey], p1.data[TLSCertKey]) {
		t.Errorf("held=%v, want the working serving certificate kept", p.held)
	}
	checkConsistent(t, p, now.Add(time.Minute))
}
