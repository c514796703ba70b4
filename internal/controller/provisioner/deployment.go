package provisioner

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/workload"
)

const (
	containerName = "provisioner"
	// terminationGracePeriod lets a daemon finish its running job (as
	// Coder's own provisioner chart does).
	terminationGracePeriod = int64(600)
)

func deploymentName(obj *coderv1alpha1.CoderProvisioner) string {
	return obj.Name + "-provisioner"
}

// selectorLabels select the daemons' pods; they never change.
func selectorLabels(obj *coderv1alpha1.CoderProvisioner) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":     "coder-provisioner",
		"app.kubernetes.io/instance": obj.Name,
	}
}

func commonLabels(obj *coderv1alpha1.CoderProvisioner) map[string]string {
	l := selectorLabels(obj)
	l["app.kubernetes.io/component"] = "provisionerd"
	l[coderv1alpha1.LabelManagedBy] = coderv1alpha1.ManagedByValue
	return l
}

// desiredDeployment is the daemons' Deployment. The key reaches the
// container through a secretKeyRef; the pod template carries only a hash
// of the key's identity.
func (r *Reconciler) desiredDeployment(obj *coderv1alpha1.CoderProvisioner, ccp *coderv1alpha1.CoderControlPlane, id keyIdentity) *appsv1.Deployment {
	return workload.Deployment(obj.Spec.PodSpec, workload.Workload{
		Name:           deploymentName(obj),
		Namespace:      obj.Namespace,
		Labels:         commonLabels(obj),
		Selector:       selectorLabels(obj),
		PodLabels:      commonLabels(obj),
		PodAnnotations: map[string]string{AnnotationKeyHash: id.hash()},
		Container:      containerName,
		Image:          r.Image(obj.Spec.Image),
		Args:           []string{"provisioner", "start"},
		Env: []corev1.EnvVar{
			{Name: "CODER_URL", Value: ccp.Status.URL},
			{Name: "CODER_PROVISIONER_DAEMON_KEY", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: keySecretName(obj)},
				Key:                  KeySecretKey,
			}}},
			// The root filesystem is read-only: caches, Terraform's working
			// directories and HOME live on an emptyDir.
			{Name: "CODER_CACHE_DIRECTORY", Value: workload.TmpPath + "/coder-cache"},
			{Name: "HOME", Value: workload.TmpPath},
		},
		TerminationGracePeriodSeconds: ptr.To(terminationGracePeriod),
	})
}

// applyDeployment applies the Deployment (workload.Applier), refusing to
// take over one this object does not own, and returns the live one.
func (r *Reconciler) applyDeployment(ctx context.Context, obj *coderv1alpha1.CoderProvisioner, ccp *coderv1alpha1.CoderControlPlane, id keyIdentity) (*appsv1.Deployment, error) {
	var live appsv1.Deployment
	applier := workload.Applier{Client: r.Client, Scheme: r.Scheme, Uncached: r.APIReader}
	if _, err := applier.Apply(ctx, r.Client, owner(obj), r.desiredDeployment(obj, ccp, id), &live); err != nil {
		return nil, fmt.Errorf("apply Deployment: %w", err)
	}
	return &live, nil
}

// owner is obj as the owner of its Secret and Deployment.
func owner(obj *coderv1alpha1.CoderProvisioner) workload.Owner {
	return workload.Owner{Object: obj, Kind: "CoderProvisioner"}
}
