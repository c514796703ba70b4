package workspaceproxy

import (
	"context"
	"fmt"
	"maps"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

const (
	containerName = "wsproxy"
	httpPort      = int32(8080)
	httpPortName  = "http"
	tmpVolume     = "tmp"
	tmpPath       = "/tmp"
)

// workloadName names the proxy's Deployment and Service.
func workloadName(obj *coderv1alpha1.CoderWorkspaceProxy) string {
	return obj.Name + "-wsproxy"
}

// selectorLabels select the proxy's pods; they never change.
func selectorLabels(obj *coderv1alpha1.CoderWorkspaceProxy) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":     "coder-workspace-proxy",
		"app.kubernetes.io/instance": obj.Name,
	}
}

func commonLabels(obj *coderv1alpha1.CoderWorkspaceProxy) map[string]string {
	l := selectorLabels(obj)
	l["app.kubernetes.io/component"] = "wsproxy"
	l["app.kubernetes.io/managed-by"] = "coder-k8s"
	return l
}

// mergeMaps returns a copy of base with over's entries winning.
func mergeMaps(base, over map[string]string) map[string]string {
	out := make(map[string]string, len(base)+len(over))
	maps.Copy(out, base)
	maps.Copy(out, over)
	return out
}

func setOwner(owner *coderv1alpha1.CoderWorkspaceProxy, obj metav1.Object, scheme *runtime.Scheme) error {
	if err := controllerutil.SetControllerReference(owner, obj, scheme); err != nil {
		return fmt.Errorf("set owner of %s: %w", obj.GetName(), err)
	}
	return nil
}

// desiredDeployment is the proxy's Deployment: `coder wsproxy server`
// with coderd's access URL as primary access URL and the token from a
// secretKeyRef; the pod template carries only a hash of the token's
// identity.
func (r *Reconciler) desiredDeployment(obj *coderv1alpha1.CoderWorkspaceProxy, ccp *coderv1alpha1.CoderControlPlane, cred credentials) (*appsv1.Deployment, error) {
	spec := obj.Spec.PodSpec
	env := []corev1.EnvVar{
		{Name: "CODER_HTTP_ADDRESS", Value: fmt.Sprintf("0.0.0.0:%d", httpPort)},
		{Name: "CODER_PRIMARY_ACCESS_URL", Value: primaryAccessURL(ccp)},
		{Name: "CODER_PROXY_SESSION_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: cred.ref.Name},
			Key:                  cred.ref.Key,
		}}},
		{Name: "CODER_ACCESS_URL", Value: obj.Spec.AccessURL},
	}
	if obj.Spec.WildcardAccessURL != "" {
		env = append(env, corev1.EnvVar{Name: "CODER_WILDCARD_ACCESS_URL", Value: obj.Spec.WildcardAccessURL})
	}
	env = append(env,
		// Replicas relay DERP traffic to each other (as Coder's chart sets).
		corev1.EnvVar{Name: "KUBE_POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		corev1.EnvVar{Name: "CODER_DERP_SERVER_RELAY_URL", Value: fmt.Sprintf("http://$(KUBE_POD_IP):%d", httpPort)},
		// The root filesystem is read-only.
		corev1.EnvVar{Name: "CODER_CACHE_DIRECTORY", Value: tmpPath + "/coder-cache"},
		corev1.EnvVar{Name: "HOME", Value: tmpPath},
	)
	podSC := spec.PodSecurityContext
	if podSC == nil {
		podSC = restrictedPodSecurityContext()
	}
	containerSC := spec.SecurityContext
	if containerSC == nil {
		containerSC = restrictedContainerSecurityContext()
	}
	replicas := spec.Replicas
	if replicas == nil {
		replicas = ptr.To(int32(1))
	}
	podLabels := mergeMaps(spec.PodLabels, commonLabels(obj))
	podAnnotations := mergeMaps(spec.PodAnnotations, map[string]string{AnnotationTokenHash: cred.hash()})

	dep := &appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      workloadName(obj),
			Namespace: obj.Namespace,
			Labels:    commonLabels(obj),
		},
		Spec: appsv1.DeploymentSpec{
			Replicas: replicas,
			Selector: &metav1.LabelSelector{MatchLabels: selectorLabels(obj)},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: podAnnotations},
				Spec: corev1.PodSpec{
					// The proxy talks to coderd only; it needs no
					// Kubernetes credentials.
					AutomountServiceAccountToken: ptr.To(false),
					SecurityContext:              podSC,
					ImagePullSecrets:             spec.ImagePullSecrets,
					NodeSelector:                 spec.NodeSelector,
					Tolerations:                  spec.Tolerations,
					Affinity:                     spec.Affinity,
					TopologySpreadConstraints:    spec.TopologySpreadConstraints,
					PriorityClassName:            spec.PriorityClassName,
					Volumes: append([]corev1.Volume{{
						Name:         tmpVolume,
						VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}},
					}}, spec.Volumes...),
					Containers: []corev1.Container{{
						Name:            containerName,
						Image:           r.image(obj),
						ImagePullPolicy: spec.ImagePullPolicy,
						Command:         []string{"/opt/coder"},
						Args:            append([]string{"wsproxy", "server"}, spec.ExtraArgs...),
						Env:             mergeEnv(env, spec.Env),
						EnvFrom:         spec.EnvFrom,
						Ports: []corev1.ContainerPort{{
							Name: httpPortName, ContainerPort: httpPort, Protocol: corev1.ProtocolTCP,
						}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
								Path: "/healthz", Port: intstr.FromString(httpPortName),
							}},
						},
						Resources:       spec.Resources,
						SecurityContext: containerSC,
						VolumeMounts: append([]corev1.VolumeMount{{
							Name: tmpVolume, MountPath: tmpPath,
						}}, spec.VolumeMounts...),
					}},
				},
			},
		},
	}
	if err := setOwner(obj, dep, r.Scheme); err != nil {
		return nil, err
	}
	return dep, nil
}

// primaryAccessURL is coderd's access URL, which `coder wsproxy server`
// wants as --primary-access-url (it also sends users to that dashboard):
// the control plane's spec.accessURL when set, otherwise the URL the
// operator reaches coderd at (the in-cluster Service URL for a control
// plane the operator deploys, the external URL for an adopted one).
func primaryAccessURL(ccp *coderv1alpha1.CoderControlPlane) string {
	if ccp.Spec.AccessURL != "" {
		return ccp.Spec.AccessURL
	}
	return ccp.Status.URL
}

// desiredService fronts the proxy as spec.service says.
func (r *Reconciler) desiredService(obj *coderv1alpha1.CoderWorkspaceProxy) (*corev1.Service, error) {
	s := obj.Spec.Service
	svcType := s.Type
	if svcType == "" {
		svcType = corev1.ServiceTypeClusterIP
	}
	port := s.Port
	if port == 0 {
		port = 80
	}
	svc := &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        workloadName(obj),
			Namespace:   obj.Namespace,
			Labels:      commonLabels(obj),
			Annotations: s.Annotations,
		},
		Spec: corev1.ServiceSpec{
			Type:     svcType,
			Selector: selectorLabels(obj),
			Ports: []corev1.ServicePort{{
				Name: httpPortName, Port: port, TargetPort: intstr.FromString(httpPortName), Protocol: corev1.ProtocolTCP,
			}},
		},
	}
	if svcType == corev1.ServiceTypeLoadBalancer {
		svc.Spec.LoadBalancerIP = s.LoadBalancerIP
	}
	if svcType == corev1.ServiceTypeLoadBalancer || svcType == corev1.ServiceTypeNodePort {
		svc.Spec.ExternalTrafficPolicy = s.ExternalTrafficPolicy
	}
	if err := setOwner(obj, svc, r.Scheme); err != nil {
		return nil, err
	}
	return svc, nil
}

// applyWorkload server-side applies the Deployment and the Service: fields
// the operator no longer sets are dropped, fields others set are kept, and
// applying unchanged objects does not write them (their resourceVersion
// stays).
func (r *Reconciler) applyWorkload(ctx context.Context, obj *coderv1alpha1.CoderWorkspaceProxy, ccp *coderv1alpha1.CoderControlPlane, cred credentials) (*appsv1.Deployment, error) {
	name := types.NamespacedName{Namespace: obj.Namespace, Name: workloadName(obj)}
	if err := r.checkOwned(ctx, obj, name, &appsv1.Deployment{}, "Deployment", ReasonDeploymentConflict); err != nil {
		return nil, err
	}
	if err := r.checkOwned(ctx, obj, name, &corev1.Service{}, "Service", ReasonServiceConflict); err != nil {
		return nil, err
	}
	dep, err := r.desiredDeployment(obj, ccp, cred)
	if err != nil {
		return nil, err
	}
	applied, err := applyTyped(ctx, r.Client, dep, &appsv1.Deployment{})
	if err != nil {
		return nil, err
	}
	svc, err := r.desiredService(obj)
	if err != nil {
		return nil, err
	}
	if _, err := applyTyped(ctx, r.Client, svc, &corev1.Service{}); err != nil {
		return nil, err
	}
	return applied, nil
}

// checkOwned refuses to take over an object of that name that this
// object does not control.
func (r *Reconciler) checkOwned(ctx context.Context, obj *coderv1alpha1.CoderWorkspaceProxy, name types.NamespacedName, existing client.Object, kind, reason string) error {
	err := r.Client.Get(ctx, name, existing)
	switch {
	case err == nil && !metav1.IsControlledBy(existing, obj):
		return &conflictError{reason: reason,
			msg: fmt.Sprintf("%s %s exists and is not owned by this CoderWorkspaceProxy", kind, name.Name)}
	case err != nil && !apierrors.IsNotFound(err):
		return fmt.Errorf("get %s %s: %w", kind, name.Name, err)
	}
	return nil
}

// applyTyped server-side applies a typed object and decodes the result
// into out.
func applyTyped[T client.Object](ctx context.Context, c client.Client, desired client.Object, out T) (T, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(desired)
	if err != nil {
		return out, fmt.Errorf("convert %s: %w", desired.GetName(), err)
	}
	delete(m, "status")
	unstructured.RemoveNestedField(m, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(m, "spec", "template", "metadata", "creationTimestamp")
	u := &unstructured.Unstructured{Object: m}
	if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(fieldOwner), client.ForceOwnership); err != nil {
		return out, fmt.Errorf("apply %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
		return out, fmt.Errorf("decode applied %s: %w", u.GetName(), err)
	}
	return out, nil
}

// mergeEnv appends user variables to the operator's; a user variable
// replaces the operator's of the same name.
func mergeEnv(ours, user []corev1.EnvVar) []corev1.EnvVar {
	overridden := make(map[string]bool, len(user))
	for _, e := range user {
		overridden[e.Name] = true
	}
	out := make([]corev1.EnvVar, 0, len(ours)+len(user))
	for _, e := range ours {
		if !overridden[e.Name] {
			out = append(out, e)
		}
	}
	return append(out, user...)
}

// restrictedPodSecurityContext meets the "restricted" Pod Security
// Standard; 1000 is the coder user of Coder's image.
func restrictedPodSecurityContext() *corev1.PodSecurityContext {
	return &corev1.PodSecurityContext{
		RunAsNonRoot:   ptr.To(true),
		RunAsUser:      ptr.To(int64(1000)),
		RunAsGroup:     ptr.To(int64(1000)),
		FSGroup:        ptr.To(int64(1000)),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

func restrictedContainerSecurityContext() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		ReadOnlyRootFilesystem:   ptr.To(true),
		RunAsNonRoot:             ptr.To(true),
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}
