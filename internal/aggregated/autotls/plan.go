package autotls

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"maps"
	"slices"
	"time"
)

// planInput is what the next content of the Secret depends on.
type planInput struct {
	// data is the Secret's current data; nil when it does not exist.
	data         map[string][]byte
	now          time.Time
	dnsNames     []string
	certValidity time.Duration
	caValidity   time.Duration
	// caName prefixes a new CA's common name.
	caName string
	// trusted reports whether kube-apiserver already trusts ca: the
	// APIService's caBundle holds it, or there is no APIService to break.
	// A serving certificate that still works is replaced by one signed by
	// a CA kube-apiserver does not trust yet only once it does.
	trusted func(ca *x509.Certificate) bool
}

// plan is the Secret's next data and why it differs.
type plan struct {
	data map[string][]byte
	// changed means data differs from the input and must be written.
	changed bool
	// reasons say what changed, for the log.
	reasons []string
	// held means the serving certificate needs replacing by one signed by
	// a CA the APIService does not trust yet; the current one still works.
	held bool
	// next is when something expires or falls due, and the plan must be
	// made again.
	next time.Time
	// ca and leaf are the CA and serving certificate data holds.
	ca, leaf *x509.Certificate
}

// makePlan decides what the Secret must hold: a valid CA that is not due
// for renewal, the CA bundle (that CA first, then earlier CAs not yet
// expired), and a serving certificate for the DNS names signed by the CA,
// not due for renewal. What is still good is kept, so every replica that
// plans from the same Secret agrees there is nothing to do.
func makePlan(in planInput) (plan, error) {
	p := plan{data: maps.Clone(in.data)}
	if p.data == nil {
		p.data = map[string][]byte{}
	}
	now := in.now

	// The CA.
	ca, err := parseKeyPair(in.data[CACertKey], in.data[CAKeyKey])
	var caWhy string
	switch {
	case err != nil:
		caWhy = fmt.Sprintf("no usable CA in %s/%s (%v)", CACertKey, CAKeyKey, err)
	case !ca.cert.IsCA:
		caWhy = CACertKey + " is not a CA certificate"
	case now.Before(ca.cert.NotBefore) || !now.Before(ca.cert.NotAfter):
		caWhy = fmt.Sprintf("CA is not valid now (%s to %s)", ca.cert.NotBefore.UTC(), ca.cert.NotAfter.UTC())
	case !now.Before(renewAt(ca.cert)):
		caWhy = fmt.Sprintf("CA is due for renewal (expires %s)", ca.cert.NotAfter.UTC())
	}
	// CA certificates that may still have signed a serving certificate in
	// use: the CA being replaced, then the old bundle.
	var earlier []*x509.Certificate
	if ca != nil {
		earlier = append(earlier, ca.cert)
	} else {
		earlier = append(earlier, parseCerts(in.data[CACertKey])...)
	}
	earlier = append(earlier, parseCerts(in.data[CABundleKey])...)
	if caWhy != "" {
		if ca, err = newCA(in.caName, now, in.caValidity); err != nil {
			return plan{}, err
		}
		p.data[CACertKey], p.data[CAKeyKey] = ca.certPEM, ca.keyPEM
		p.changed = true
		p.reasons = append(p.reasons, caWhy+": new CA")
	}
	p.ca = ca.cert

	bundle := []*x509.Certificate{ca.cert}
	for _, c := range earlier {
		if len(bundle) == maxBundle {
			break
		}
		if c.IsCA && now.Before(c.NotAfter) && !slices.ContainsFunc(bundle, c.Equal) {
			bundle = append(bundle, c)
		}
	}
	if b := encodeCerts(bundle); !bytes.Equal(b, in.data[CABundleKey]) {
		p.data[CABundleKey] = b
		p.changed = true
		p.reasons = append(p.reasons, fmt.Sprintf("CA bundle now holds %d certificate(s)", len(bundle)))
	}

	// The serving certificate.
	leaf, err := parseKeyPair(in.data[TLSCertKey], in.data[TLSKeyKey])
	usable := false
	var leafWhy string
	switch {
	case err != nil:
		leafWhy = fmt.Sprintf("no usable serving certificate in %s/%s (%v)", TLSCertKey, TLSKeyKey, err)
	case !sameNames(leaf.cert.DNSNames, in.dnsNames):
		leafWhy = fmt.Sprintf("serving certificate names %v, want %v", leaf.cert.DNSNames, in.dnsNames)
	default:
		if err := verifyServing(leaf.cert, bundle, in.dnsNames[0], now); err != nil {
			leafWhy = fmt.Sprintf("serving certificate does not verify against the CA bundle: %v", err)
			break
		}
		usable = true
		switch {
		case !now.Before(renewAt(leaf.cert)):
			leafWhy = fmt.Sprintf("serving certificate is due for renewal (expires %s)", leaf.cert.NotAfter.UTC())
		case leaf.cert.NotAfter.Sub(now) > in.certValidity+time.Minute:
			leafWhy = fmt.Sprintf("serving certificate valid until %s, longer than certValidity %s", leaf.cert.NotAfter.UTC(), in.certValidity)
		case verifyServing(leaf.cert, []*x509.Certificate{ca.cert}, in.dnsNames[0], now) != nil:
			leafWhy = "serving certificate is signed by an earlier CA"
		}
	}
	switch {
	case leafWhy == "":
	case usable && !in.trusted(ca.cert):
		p.held = true
		p.reasons = append(p.reasons, leafWhy+": kept until the APIService trusts the current CA")
	default:
		if leaf, err = ca.issueServing(in.dnsNames, now, in.certValidity); err != nil {
			return plan{}, err
		}
		p.data[TLSCertKey], p.data[TLSKeyKey] = leaf.certPEM, leaf.keyPEM
		p.changed = true
		p.reasons = append(p.reasons, leafWhy+": new serving certificate")
	}
	p.leaf = leaf.cert

	p.next = renewAt(ca.cert)
	if t := renewAt(leaf.cert); t.Before(p.next) {
		p.next = t
	}
	for _, c := range bundle[1:] { // pruned once expired
		if c.NotAfter.Before(p.next) {
			p.next = c.NotAfter
		}
	}
	return p, nil
}

func sameNames(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
