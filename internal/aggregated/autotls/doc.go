// Package autotls lets the aggregated API server manage its own TLS
// (aggregatedAPIServer.autoTLS): a CA and a serving certificate kept in one
// Secret, renewed before they expire, served without a restart, and the CA
// written into the server's APIService so kube-apiserver trusts it. The
// Helm chart then carries no certificate material and an APIService
// without a caBundle.
//
// The Secret (autoTLS.secretName in autoTLS.namespace, empty meaning the
// pod's namespace) holds:
//
//	ca.crt, ca.key   the CA (ECDSA P-256, valid 10 years)
//	ca-bundle.crt    the APIService's caBundle: the CA, then earlier CAs
//	                 that have not expired
//	tls.crt, tls.key the serving certificate (ECDSA P-256, valid
//	                 autoTLS.certValidity) for <service>, <service>.<ns>,
//	                 <service>.<ns>.svc and <service>.<ns>.svc.cluster.local
//
// Every replica runs a Rotator; they share the Secret. A replica creates
// it only if absent (AlreadyExists: another replica won, use its content)
// and replaces certificates with updates carrying the resourceVersion it
// read (Conflict: re-read and use the winner's), so all replicas converge
// on one CA and one serving certificate, and since every serving
// certificate a replica may still serve for a moment is signed by a CA in
// the bundle, kube-apiserver accepts each replica throughout.
//
// Renewal: each certificate is renewed when a third of its lifetime is
// left (for the defaults: the serving certificate after 8 months, the CA
// after about 6.7 years), when its names no longer match the Service, or
// when it is unreadable. A new CA is added to the bundle in front of the
// old one, which stays until it expires; the serving certificate is
// re-signed by the new CA only once the APIService's caBundle holds the
// new CA, so kube-apiserver never sees a certificate it cannot verify.
//
// The Rotator reads and writes the Secret and the APIService directly,
// and watches just those two objects (a field selector on metadata.name)
// to react within a second to changes by other replicas or by people (a
// re-applied APIService without caBundle is fixed at once); otherwise it
// wakes when a certificate falls due, and at least hourly. The
// certificate is served through ServingCert, a
// dynamiccertificates.CertKeyContentProvider: the API server's TLS
// configuration reloads when it changes.
package autotls
