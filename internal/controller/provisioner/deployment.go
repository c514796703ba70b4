package provisioner

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
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

const (
	containerName = "provisioner"
	// terminationGracePeriod lets a daemon finish its running job (as
	// Coder's own provisioner chart does).
	terminationGracePeriod = int64(600)
	tmpVolume              = "tmp"
	tmpPath                = "/tmp"
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

func setOwner(owner *coderv1alpha1.CoderProvisioner, obj metav1.Object, scheme *runtime.Scheme) error {
	if err := controllerutil.SetControllerReference(owner, obj, scheme); err != nil {
		return fmt.Errorf("set owner of %s: %w", obj.GetName(), err)
	}
	return nil
}

// desiredDeployment is the daemons' Deployment. The key reaches the
// container through a secretKeyRef; the pod template carries only a hash
// of the key's identity.
func (r *Reconciler) desiredDeployment(obj *coderv1alpha1.CoderProvisioner, ccp *coderv1alpha1.CoderControlPlane, id keyIdentity) (*appsv1.Deployment, error) {
	spec := obj.Spec.PodSpec
	env := []corev1.EnvVar{
		{Name: "CODER_URL", Value: ccp.Status.URL},
		{Name: "CODER_PROVISIONER_DAEMON_KEY", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: keySecretName(obj)},
			Key:                  KeySecretKey,
		}}},
		// The root filesystem is read-only: caches, Terraform's working
		// directories and HOME live on an emptyDir.
		{Name: "CODER_CACHE_DIRECTORY", Value: tmpPath + "/coder-cache"},
		{Name: "HOME", Value: tmpPath},
	}
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
	podAnnotations := mergeMaps(spec.PodAnnotations, map[string]string{AnnotationKeyHash: id.hash()})

	dep := &appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      deploymentName(obj),
			Namespace: obj.Namespace,
			Labels:    commonLabels(obj),
		},
		Spec: appsv1.DeploymentSpec{
			Replicas: replicas,
			Selector: &metav1.LabelSelector{MatchLabels: selectorLabels(obj)},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: podAnnotations},
				Spec: corev1.PodSpec{
					SecurityContext:               podSC,
					ImagePullSecrets:              spec.ImagePullSecrets,
					TerminationGracePeriodSeconds: ptr.To(terminationGracePeriod),
					NodeSelector:                  spec.NodeSelector,
					Tolerations:                   spec.Tolerations,
					Affinity:                      spec.Affinity,
					TopologySpreadConstraints:     spec.TopologySpreadConstraints,
					PriorityClassName:             spec.PriorityClassName,
					Volumes: append([]corev1.Volume{{
						Name:         tmpVolume,
						VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}},
					}}, spec.Volumes...),
					Containers: []corev1.Container{{
						Name:            containerName,
						Image:           r.image(obj),
						ImagePullPolicy: spec.ImagePullPolicy,
						Command:         []string{"/opt/coder"},
						Args:            append([]string{"provisioner", "start"}, spec.ExtraArgs...),
						Env:             mergeEnv(env, spec.Env),
						EnvFrom:         spec.EnvFrom,
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

// applyDeployment server-side applies the Deployment: fields the operator
// no longer sets are dropped, fields others set (the annotation of
// kubectl rollout restart, for example) are kept, and applying an
// unchanged Deployment does not write it (its resourceVersion stays).
func (r *Reconciler) applyDeployment(ctx context.Context, obj *coderv1alpha1.CoderProvisioner, ccp *coderv1alpha1.CoderControlPlane, id keyIdentity) (*appsv1.Deployment, error) {
	var existing appsv1.Deployment
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: obj.Namespace, Name: deploymentName(obj)}, &existing)
	switch {
	case err == nil && !metav1.IsControlledBy(&existing, obj):
		return nil, &conflictError{reason: ReasonDeploymentConflict,
			msg: fmt.Sprintf("Deployment %s exists and is not owned by this CoderProvisioner", existing.Name)}
	case err != nil && !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("get Deployment %s: %w", deploymentName(obj), err)
	}
	desired, err := r.desiredDeployment(obj, ccp, id)
	if err != nil {
		return nil, err
	}
	return applyTyped(ctx, r.Client, desired, &appsv1.Deployment{})
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
