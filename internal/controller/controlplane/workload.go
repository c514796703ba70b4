package controlplane

import (
	"fmt"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/workload"
)

// This file builds the desired children of a deployed control plane from
// its spec. The builders are pure: they read the spec and return objects,
// and the reconciler decides whether the live objects need a write.

// DefaultImage is the Coder release this operator is built and tested
// against.
const DefaultImage = coderv1alpha1.DefaultImage

// Ports and paths inside the coderd container.
const (
	httpPort      = 8080
	httpsPort     = 8443
	httpPortName  = "http"
	httpsPortName = "https"
	// tlsServicePort is the Service port for HTTPS; spec.service.port is
	// the HTTP one.
	tlsServicePort = 443

	containerName = "coder"
	cacheDir      = "/var/cache/coder"
	// tlsDir holds one directory per TLS Secret. It is a subdirectory of
	// /etc/ssl/certs, which Go scans (not recursively) for CA files, so
	// the serving keys never end up read as CAs.
	tlsDir = "/etc/ssl/certs/coder"
	// caDir is where Go's crypto/x509 reads extra system roots from.
	caDir = "/etc/ssl/certs"
)

// Labels of coderd's pods, part of its Deployment's immutable selector.
const (
	labelName      = "app.kubernetes.io/name"
	labelInstance  = "app.kubernetes.io/instance"
	labelComponent = "app.kubernetes.io/component"
	componentValue = "coderd"
)

// httpRouteGVK is the Gateway API route; it is handled as unstructured so
// that the operator does not depend on the Gateway API module and keeps
// working where its CRDs are not installed.
var httpRouteGVK = schema.GroupVersionKind{Group: "gateway.networking.k8s.io", Version: "v1", Kind: "HTTPRoute"}

// selectorLabels select coderd's pods. They are part of the Deployment's
// immutable selector: never change them.
func selectorLabels(ccp *coderv1alpha1.CoderControlPlane) map[string]string {
	return map[string]string{
		labelName:      "coder",
		labelInstance:  ccp.Name,
		labelComponent: componentValue,
	}
}

// childLabels are the labels of every child object: the pods' and
// ownedSelector's.
func childLabels(ccp *coderv1alpha1.CoderControlPlane) map[string]string {
	return workload.MergeMaps(selectorLabels(ccp), ownedSelector(ccp))
}

// ownedSelector selects the children of ccp in any namespace; in other
// namespaces than its own they cannot carry an owner reference.
func ownedSelector(ccp *coderv1alpha1.CoderControlPlane) map[string]string {
	return map[string]string{
		coderv1alpha1.LabelManagedBy:             coderv1alpha1.ManagedByValue,
		coderv1alpha1.LabelControlPlane:          ccp.Name,
		coderv1alpha1.LabelControlPlaneNamespace: ccp.Namespace,
	}
}

// owner is ccp as the owner of its children.
func owner(ccp *coderv1alpha1.CoderControlPlane) workload.Owner {
	return workload.Owner{Object: ccp, Kind: "CoderControlPlane", Labels: ownedSelector(ccp)}
}

// serviceAccountName is the service account coderd runs as.
func serviceAccountName(ccp *coderv1alpha1.CoderControlPlane) string {
	if ccp.Spec.ServiceAccount.Name != "" {
		return ccp.Spec.ServiceAccount.Name
	}
	return ccp.Name
}

// createServiceAccount reports whether the operator creates the service
// account; the CRD defaults spec.serviceAccount.create to true.
func createServiceAccount(ccp *coderv1alpha1.CoderControlPlane) bool {
	return ptr.Deref(ccp.Spec.ServiceAccount.Create, true)
}

func tlsEnabled(ccp *coderv1alpha1.CoderControlPlane) bool {
	return ccp.Spec.TLS != nil && len(ccp.Spec.TLS.SecretNames) > 0
}

// servicePort is the Service's HTTP port.
func servicePort(ccp *coderv1alpha1.CoderControlPlane) int32 {
	return workload.ServicePort(ccp.Spec.Service)
}

// inClusterURL is where the operator, and by default users and
// workspaces, reach a deployed coderd: its Service's cluster DNS name,
// over HTTPS when TLS is on.
func inClusterURL(ccp *coderv1alpha1.CoderControlPlane, clusterDomain string) string {
	host := fmt.Sprintf("%s.%s.svc.%s", ccp.Name, ccp.Namespace, clusterDomain)
	if tlsEnabled(ccp) {
		return "https://" + host
	}
	if p := servicePort(ccp); p != 80 {
		return "http://" + host + ":" + strconv.Itoa(int(p))
	}
	return "http://" + host
}

// secretVolumeName names the volume of the i-th Secret of a kind. Secret
// names may be longer than a volume name may be, so the index is used.
func secretVolumeName(prefix string, i int) string { return prefix + "-" + strconv.Itoa(i) }

// desiredDeployment is coderd's Deployment.
func desiredDeployment(ccp *coderv1alpha1.CoderControlPlane, image, clusterDomain string) *appsv1.Deployment {
	spec := &ccp.Spec
	if spec.Image != "" {
		image = spec.Image
	}
	ports := []corev1.ContainerPort{{Name: httpPortName, ContainerPort: httpPort, Protocol: corev1.ProtocolTCP}}
	if tlsEnabled(ccp) {
		ports = append(ports, corev1.ContainerPort{Name: httpsPortName, ContainerPort: httpsPort, Protocol: corev1.ProtocolTCP})
	}
	liveness, readiness := spec.LivenessProbe, spec.ReadinessProbe
	if liveness == nil {
		// coderd runs database migrations before it listens; the
		// initial delay and threshold leave it two to three minutes so
		// that a long migration is not killed half-way.
		liveness = healthzProbe(60, 6)
	}
	if readiness == nil {
		readiness = healthzProbe(0, 3)
	}
	volumes, mounts := podVolumes(ccp)
	return workload.Deployment(spec.PodSpec, workload.Workload{
		Name:      ccp.Name,
		Namespace: ccp.Namespace,
		Labels:    childLabels(ccp),
		Selector:  selectorLabels(ccp),
		// The selector labels win over user pod labels, or the
		// Deployment would not select its own pods.
		PodLabels:          selectorLabels(ccp),
		ServiceAccountName: serviceAccountName(ccp),
		Image:              image,
		Container:          containerName,
		Args:               []string{"server"},
		Env:                containerEnv(ccp, clusterDomain),
		Ports:              ports,
		Volumes:            volumes,
		VolumeMounts:       mounts,
		LivenessProbe:      liveness,
		ReadinessProbe:     readiness,
	})
}

func healthzProbe(initialDelay, failureThreshold int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path:   "/healthz",
			Port:   intstr.FromString(httpPortName),
			Scheme: corev1.URISchemeHTTP,
		}},
		InitialDelaySeconds: initialDelay,
		TimeoutSeconds:      1,
		PeriodSeconds:       10,
		SuccessThreshold:    1,
		FailureThreshold:    failureThreshold,
	}
}

// containerEnv is the operator's environment; spec.env follows it
// (workload.MergeEnv).
func containerEnv(ccp *coderv1alpha1.CoderControlPlane, clusterDomain string) []corev1.EnvVar {
	accessURL := ccp.Spec.AccessURL
	if accessURL == "" {
		accessURL = inClusterURL(ccp, clusterDomain)
	}
	env := []corev1.EnvVar{
		{Name: "CODER_HTTP_ADDRESS", Value: "0.0.0.0:" + strconv.Itoa(httpPort)},
		{Name: "CODER_ACCESS_URL", Value: accessURL},
	}
	if ccp.Spec.WildcardAccessURL != "" {
		env = append(env, corev1.EnvVar{Name: "CODER_WILDCARD_ACCESS_URL", Value: ccp.Spec.WildcardAccessURL})
	}
	env = append(env,
		corev1.EnvVar{Name: "CODER_CACHE_DIRECTORY", Value: cacheDir},
		// Replicas relay DERP traffic to one another at their pod IPs
		// (coderd high availability).
		corev1.EnvVar{Name: "KUBE_POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "status.podIP"}}},
		corev1.EnvVar{Name: "CODER_DERP_SERVER_RELAY_URL", Value: "http://$(KUBE_POD_IP):" + strconv.Itoa(httpPort)},
	)
	if tlsEnabled(ccp) {
		var certs, keys []string
		for _, name := range ccp.Spec.TLS.SecretNames {
			certs = append(certs, tlsDir+"/"+name+"/tls.crt")
			keys = append(keys, tlsDir+"/"+name+"/tls.key")
		}
		env = append(env,
			corev1.EnvVar{Name: "CODER_TLS_ENABLE", Value: "true"},
			corev1.EnvVar{Name: "CODER_TLS_ADDRESS", Value: "0.0.0.0:" + strconv.Itoa(httpsPort)},
			corev1.EnvVar{Name: "CODER_TLS_CERT_FILE", Value: strings.Join(certs, ",")},
			corev1.EnvVar{Name: "CODER_TLS_KEY_FILE", Value: strings.Join(keys, ",")},
		)
	}
	return env
}

// podVolumes are the operator's volumes and mounts besides the scratch
// space (workload.TmpPath): the cache and the TLS and CA Secrets.
func podVolumes(ccp *coderv1alpha1.CoderControlPlane) ([]corev1.Volume, []corev1.VolumeMount) {
	volumes := []corev1.Volume{
		{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	mounts := []corev1.VolumeMount{
		{Name: "cache", MountPath: cacheDir},
	}
	if tlsEnabled(ccp) {
		for i, name := range ccp.Spec.TLS.SecretNames {
			v := secretVolumeName("tls", i)
			volumes = append(volumes, corev1.Volume{Name: v, VolumeSource: corev1.VolumeSource{
				Secret: &corev1.SecretVolumeSource{SecretName: name},
			}})
			mounts = append(mounts, corev1.VolumeMount{Name: v, MountPath: tlsDir + "/" + name, ReadOnly: true})
		}
	}
	for i, ref := range ccp.Spec.CACerts {
		v := secretVolumeName("ca", i)
		volumes = append(volumes, corev1.Volume{Name: v, VolumeSource: corev1.VolumeSource{
			Secret: &corev1.SecretVolumeSource{
				SecretName: ref.Name,
				Items:      []corev1.KeyToPath{{Key: ref.Key, Path: "ca.crt"}},
			},
		}})
		// One file per certificate directly in /etc/ssl/certs, where
		// Go's crypto/x509 picks it up next to the image's bundle.
		mounts = append(mounts, corev1.VolumeMount{
			Name:      v,
			MountPath: fmt.Sprintf("%s/%s-%s.crt", caDir, ref.Name, ref.Key),
			SubPath:   "ca.crt",
			ReadOnly:  true,
		})
	}
	return volumes, mounts
}

// referencedSecrets are the Secrets the pod cannot start without. Secrets
// in env valueFrom and envFrom are left to the kubelet, which reports them
// on the pod; the license and owner Secrets are the access manager's.
func referencedSecrets(ccp *coderv1alpha1.CoderControlPlane) []string {
	if ccp.Spec.ExternalURL != "" {
		return nil
	}
	var names []string
	if tlsEnabled(ccp) {
		names = append(names, ccp.Spec.TLS.SecretNames...)
	}
	for _, ref := range ccp.Spec.CACerts {
		names = append(names, ref.Name)
	}
	return workload.Dedupe(names)
}

// watchedSecrets are all Secrets whose appearance or change should
// reconcile ccp: the pod's and the access manager's, including the
// operator's own token Secret, so that deleting it gets a new token at
// once rather than at the next periodic check. Only Secrets labelled as
// coder-k8s's reach the watch (package kubecache): users' Secrets are
// noticed at the next reconcile (missingSecretRecheck while one the pods
// mount is missing).
func watchedSecrets(ccp *coderv1alpha1.CoderControlPlane) []string {
	names := referencedSecrets(ccp)
	names = append(names, coderapi.TokenSecretName(ccp.Name))
	if ref := ccp.Status.OperatorTokenSecretRef; ref != nil {
		names = append(names, ref.Name)
	}
	oa := ccp.Spec.OperatorAccess
	if oa.OwnerTokenSecretRef != nil {
		names = append(names, oa.OwnerTokenSecretRef.Name)
	}
	if oa.OwnerCredentialsSecretRef != nil {
		names = append(names, oa.OwnerCredentialsSecretRef.Name)
	}
	if ccp.Spec.License != nil {
		names = append(names, ccp.Spec.License.SecretRef.Name)
	}
	return workload.Dedupe(names)
}

// desiredService is the Service in front of coderd.
func desiredService(ccp *coderv1alpha1.CoderControlPlane) *corev1.Service {
	ports := []corev1.ServicePort{{
		Name:       httpPortName,
		Port:       servicePort(ccp),
		TargetPort: intstr.FromString(httpPortName),
		Protocol:   corev1.ProtocolTCP,
	}}
	if tlsEnabled(ccp) {
		ports = append(ports, corev1.ServicePort{
			Name:       httpsPortName,
			Port:       tlsServicePort,
			TargetPort: intstr.FromString(httpsPortName),
			Protocol:   corev1.ProtocolTCP,
		})
	}
	return workload.Service(ccp.Spec.Service, ccp.Name, ccp.Namespace, childLabels(ccp), selectorLabels(ccp), ports)
}

// desiredServiceAccount is coderd's service account when the operator
// creates it.
func desiredServiceAccount(ccp *coderv1alpha1.CoderControlPlane) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        serviceAccountName(ccp),
			Namespace:   ccp.Namespace,
			Labels:      childLabels(ccp),
			Annotations: workload.MergeMaps(ccp.Spec.ServiceAccount.Annotations, nil),
		},
	}
}

// desiredIngress routes the access host, and the wildcard host for
// workspace applications, to the Service's HTTP port.
func desiredIngress(ccp *coderv1alpha1.CoderControlPlane) *networkingv1.Ingress {
	spec := ccp.Spec.Expose.Ingress
	pathType := networkingv1.PathTypePrefix
	backend := networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{
		Name: ccp.Name,
		Port: networkingv1.ServiceBackendPort{Name: httpPortName},
	}}
	rule := func(host string) networkingv1.IngressRule {
		return networkingv1.IngressRule{
			Host: host,
			IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
				Paths: []networkingv1.HTTPIngressPath{{Path: "/", PathType: &pathType, Backend: backend}},
			}},
		}
	}
	hosts := []string{spec.Host}
	if spec.WildcardHost != "" {
		hosts = append(hosts, spec.WildcardHost)
	}
	ing := &networkingv1.Ingress{
		TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "Ingress"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        ccp.Name,
			Namespace:   ccp.Namespace,
			Labels:      childLabels(ccp),
			Annotations: workload.MergeMaps(spec.Annotations, nil),
		},
	}
	if spec.ClassName != "" {
		ing.Spec.IngressClassName = ptr.To(spec.ClassName)
	}
	for _, h := range hosts {
		ing.Spec.Rules = append(ing.Spec.Rules, rule(h))
	}
	if spec.TLSSecretName != "" {
		ing.Spec.TLS = []networkingv1.IngressTLS{{Hosts: hosts, SecretName: spec.TLSSecretName}}
	}
	return ing
}

// desiredHTTPRoute attaches coderd's Service to the given Gateways.
func desiredHTTPRoute(ccp *coderv1alpha1.CoderControlPlane) *unstructured.Unstructured {
	spec := ccp.Spec.Expose.HTTPRoute
	parents := make([]any, 0, len(spec.ParentRefs))
	for _, p := range spec.ParentRefs {
		ref := map[string]any{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": p.Name}
		if p.Namespace != "" {
			ref["namespace"] = p.Namespace
		}
		if p.SectionName != "" {
			ref["sectionName"] = p.SectionName
		}
		parents = append(parents, ref)
	}
	routeSpec := map[string]any{
		"parentRefs": parents,
		"rules": []any{map[string]any{
			"backendRefs": []any{map[string]any{
				"group": "", "kind": "Service",
				"name": ccp.Name,
				"port": int64(servicePort(ccp)),
			}},
		}},
	}
	if len(spec.Hostnames) > 0 {
		hosts := make([]any, len(spec.Hostnames))
		for i, h := range spec.Hostnames {
			hosts[i] = h
		}
		routeSpec["hostnames"] = hosts
	}
	u := &unstructured.Unstructured{Object: map[string]any{"spec": routeSpec}}
	u.SetGroupVersionKind(httpRouteGVK)
	u.SetName(ccp.Name)
	u.SetNamespace(ccp.Namespace)
	u.SetLabels(childLabels(ccp))
	if len(spec.Annotations) > 0 {
		u.SetAnnotations(workload.MergeMaps(spec.Annotations, nil))
	}
	return u
}
