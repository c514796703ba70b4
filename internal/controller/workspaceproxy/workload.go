package workspaceproxy

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/dependent"
)

const (
	containerName = "wsproxy"
	httpPort      = int32(8080)
	httpPortName  = "http"
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

// desiredDeployment is the proxy's Deployment: `coder wsproxy server`
// with coderd's access URL as primary access URL and the token from a
// secretKeyRef; the pod template carries only a hash of the token's
// identity.
func (r *Reconciler) desiredDeployment(obj *coderv1alpha1.CoderWorkspaceProxy, ccp *coderv1alpha1.CoderControlPlane, cred credentials) (*appsv1.Deployment, error) {
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
		corev1.EnvVar{Name: "CODER_CACHE_DIRECTORY", Value: dependent.TmpPath + "/coder-cache"},
		corev1.EnvVar{Name: "HOME", Value: dependent.TmpPath},
	)
	dep := dependent.Deployment(obj.Spec.PodSpec, dependent.Workload{
		Name:           workloadName(obj),
		Namespace:      obj.Namespace,
		Labels:         commonLabels(obj),
		Selector:       selectorLabels(obj),
		PodAnnotations: map[string]string{AnnotationTokenHash: cred.hash()},
		Container:      containerName,
		Image:          r.Image(obj.Spec.Image),
		Args:           []string{"wsproxy", "server"},
		Env:            env,
	})
	pod := &dep.Spec.Template.Spec
	// The proxy talks to coderd only; it needs no Kubernetes credentials.
	pod.AutomountServiceAccountToken = ptr.To(false)
	pod.Containers[0].Ports = []corev1.ContainerPort{{
		Name: httpPortName, ContainerPort: httpPort, Protocol: corev1.ProtocolTCP,
	}}
	pod.Containers[0].ReadinessProbe = &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: "/healthz", Port: intstr.FromString(httpPortName),
		}},
	}
	if err := dependent.SetOwner(obj, dep, r.Scheme); err != nil {
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
	if err := dependent.SetOwner(obj, svc, r.Scheme); err != nil {
		return nil, err
	}
	return svc, nil
}

// applyWorkload server-side applies the Deployment and the Service
// (dependent.Apply), refusing to take over either when this object does
// not own it.
func (r *Reconciler) applyWorkload(ctx context.Context, obj *coderv1alpha1.CoderWorkspaceProxy, ccp *coderv1alpha1.CoderControlPlane, cred credentials) (*appsv1.Deployment, error) {
	name := types.NamespacedName{Namespace: obj.Namespace, Name: workloadName(obj)}
	if err := dependent.CheckOwned(ctx, r.Client, obj, "CoderWorkspaceProxy", name, &appsv1.Deployment{}, "Deployment", coderv1alpha1.ReasonDeploymentConflict); err != nil {
		return nil, err
	}
	if err := dependent.CheckOwned(ctx, r.Client, obj, "CoderWorkspaceProxy", name, &corev1.Service{}, "Service", coderv1alpha1.ReasonServiceConflict); err != nil {
		return nil, err
	}
	dep, err := r.desiredDeployment(obj, ccp, cred)
	if err != nil {
		return nil, err
	}
	applied, err := dependent.Apply(ctx, r.Client, dep, &appsv1.Deployment{})
	if err != nil {
		return nil, err
	}
	svc, err := r.desiredService(obj)
	if err != nil {
		return nil, err
	}
	if _, err := dependent.Apply(ctx, r.Client, svc, &corev1.Service{}); err != nil {
		return nil, err
	}
	return applied, nil
}
