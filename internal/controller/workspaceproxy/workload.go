package workspaceproxy

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/workload"
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
	l[coderv1alpha1.LabelManagedBy] = coderv1alpha1.ManagedByValue
	return l
}

// desiredDeployment is the proxy's Deployment: `coder wsproxy server`
// with coderd's access URL as primary access URL and the token from a
// secretKeyRef; the pod template carries only a hash of the token's
// identity.
func (r *Reconciler) desiredDeployment(obj *coderv1alpha1.CoderWorkspaceProxy, ccp *coderv1alpha1.CoderControlPlane, cred credentials) *appsv1.Deployment {
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
		corev1.EnvVar{Name: "CODER_CACHE_DIRECTORY", Value: workload.TmpPath + "/coder-cache"},
		corev1.EnvVar{Name: "HOME", Value: workload.TmpPath},
	)
	return workload.Deployment(obj.Spec.PodSpec, workload.Workload{
		Name:           workloadName(obj),
		Namespace:      obj.Namespace,
		Labels:         commonLabels(obj),
		Selector:       selectorLabels(obj),
		PodLabels:      commonLabels(obj),
		PodAnnotations: map[string]string{AnnotationTokenHash: cred.hash()},
		Container:      containerName,
		Image:          r.Image(obj.Spec.Image),
		Args:           []string{"wsproxy", "server"},
		Env:            env,
		Ports:          []corev1.ContainerPort{{Name: httpPortName, ContainerPort: httpPort, Protocol: corev1.ProtocolTCP}},
		ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: "/healthz", Port: intstr.FromString(httpPortName),
		}}},
		// The proxy talks to coderd only; it needs no Kubernetes credentials.
		AutomountServiceAccountToken: ptr.To(false),
	})
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
func desiredService(obj *coderv1alpha1.CoderWorkspaceProxy) *corev1.Service {
	return workload.Service(obj.Spec.Service, workloadName(obj), obj.Namespace, commonLabels(obj), selectorLabels(obj),
		[]corev1.ServicePort{{
			Name: httpPortName, Port: workload.ServicePort(obj.Spec.Service), TargetPort: intstr.FromString(httpPortName), Protocol: corev1.ProtocolTCP,
		}})
}

// applyWorkload applies the Deployment and the Service
// (workload.Applier), refusing to take over either when this object does
// not own it, and returns the live Deployment.
func (r *Reconciler) applyWorkload(ctx context.Context, obj *coderv1alpha1.CoderWorkspaceProxy, ccp *coderv1alpha1.CoderControlPlane, cred credentials) (*appsv1.Deployment, error) {
	applier := workload.Applier{Client: r.Client, Scheme: r.Scheme, Uncached: r.APIReader}
	var live appsv1.Deployment
	if _, err := applier.Apply(ctx, r.Client, owner(obj), r.desiredDeployment(obj, ccp, cred), &live); err != nil {
		return nil, err
	}
	if _, err := applier.Apply(ctx, r.Client, owner(obj), desiredService(obj), nil); err != nil {
		return nil, err
	}
	return &live, nil
}

// owner is obj as the owner of its Secret, Deployment and Service.
func owner(obj *coderv1alpha1.CoderWorkspaceProxy) workload.Owner {
	return workload.Owner{Object: obj, Kind: "CoderWorkspaceProxy"}
}
