package dependent

import (
	"context"
	"fmt"
	"maps"
	"slices"

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
	// FieldOwner is the field manager of what the reconcilers apply.
	FieldOwner = "coder-k8s"
	// TmpPath is the workload's writable directory: the root filesystem
	// is read-only, so caches and HOME live on an emptyDir mounted here.
	TmpPath   = "/tmp"
	tmpVolume = "tmp"
)

// Workload is the Deployment a dependent kind runs: one container of
// Coder's image running /opt/coder.
type Workload struct {
	Name, Namespace string
	// Labels are the Deployment's; the pods get them over spec.podLabels.
	Labels map[string]string
	// Selector selects the pods; it never changes.
	Selector map[string]string
	// PodAnnotations are the operator's; they win over spec.podAnnotations.
	PodAnnotations map[string]string
	Container      string
	Image          string
	// Args follow /opt/coder; spec.extraArgs follow them.
	Args []string
	// Env is the operator's; a variable of spec.env wins over the
	// operator's of the same name.
	Env []corev1.EnvVar
}

// Deployment is w's Deployment shaped by spec: its scheduling, resources
// and additions, the restricted security contexts unless spec replaces
// them, and an emptyDir at TmpPath before spec's volumes. Kind-specific
// settings (ports, probes) are the caller's to add.
func Deployment(spec coderv1alpha1.PodSpec, w Workload) *appsv1.Deployment {
	podSC := spec.PodSecurityContext
	if podSC == nil {
		podSC = RestrictedPodSecurityContext()
	}
	containerSC := spec.SecurityContext
	if containerSC == nil {
		containerSC = RestrictedContainerSecurityContext()
	}
	replicas := spec.Replicas
	if replicas == nil {
		replicas = ptr.To(int32(1))
	}
	return &appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      w.Name,
			Namespace: w.Namespace,
			Labels:    w.Labels,
		},
		Spec: appsv1.DeploymentSpec{
			Replicas: replicas,
			Selector: &metav1.LabelSelector{MatchLabels: w.Selector},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels:      MergeMaps(spec.PodLabels, w.Labels),
					Annotations: MergeMaps(spec.PodAnnotations, w.PodAnnotations),
				},
				Spec: corev1.PodSpec{
					SecurityContext:           podSC,
					ImagePullSecrets:          spec.ImagePullSecrets,
					NodeSelector:              spec.NodeSelector,
					Tolerations:               spec.Tolerations,
					Affinity:                  spec.Affinity,
					TopologySpreadConstraints: spec.TopologySpreadConstraints,
					PriorityClassName:         spec.PriorityClassName,
					Volumes: append([]corev1.Volume{{
						Name:         tmpVolume,
						VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}},
					}}, spec.Volumes...),
					Containers: []corev1.Container{{
						Name:            w.Container,
						Image:           w.Image,
						ImagePullPolicy: spec.ImagePullPolicy,
						Command:         []string{"/opt/coder"},
						Args:            slices.Concat(w.Args, spec.ExtraArgs),
						Env:             MergeEnv(w.Env, spec.Env),
						EnvFrom:         spec.EnvFrom,
						Resources:       spec.Resources,
						SecurityContext: containerSC,
						VolumeMounts: append([]corev1.VolumeMount{{
							Name: tmpVolume, MountPath: TmpPath,
						}}, spec.VolumeMounts...),
					}},
				},
			},
		},
	}
}

// RestrictedPodSecurityContext meets the "restricted" Pod Security
// Standard; 1000 is the coder user of Coder's image.
func RestrictedPodSecurityContext() *corev1.PodSecurityContext {
	return &corev1.PodSecurityContext{
		RunAsNonRoot:   ptr.To(true),
		RunAsUser:      ptr.To(int64(1000)),
		RunAsGroup:     ptr.To(int64(1000)),
		FSGroup:        ptr.To(int64(1000)),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// RestrictedContainerSecurityContext meets the "restricted" Pod Security
// Standard with a read-only root filesystem.
func RestrictedContainerSecurityContext() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		ReadOnlyRootFilesystem:   ptr.To(true),
		RunAsNonRoot:             ptr.To(true),
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// MergeMaps returns a copy of base with over's entries winning.
func MergeMaps(base, over map[string]string) map[string]string {
	out := make(map[string]string, len(base)+len(over))
	maps.Copy(out, base)
	maps.Copy(out, over)
	return out
}

// MergeEnv appends user variables to the operator's; a user variable
// replaces the operator's of the same name.
func MergeEnv(ours, user []corev1.EnvVar) []corev1.EnvVar {
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

// SetOwner makes owner obj's controller, so obj is garbage collected with
// it and its changes reconcile owner.
func SetOwner(owner, obj metav1.Object, scheme *runtime.Scheme) error {
	if err := controllerutil.SetControllerReference(owner, obj, scheme); err != nil {
		return fmt.Errorf("set owner of %s: %w", obj.GetName(), err)
	}
	return nil
}

// CheckOwned refuses to take over an object called key that owner (of
// ownerKind) does not control: it returns a *ConflictError with reason.
// existing is an empty object of the kind to read it into.
func CheckOwned(ctx context.Context, c client.Reader, owner metav1.Object, ownerKind string, key types.NamespacedName, existing client.Object, kind, reason string) error {
	err := c.Get(ctx, key, existing)
	switch {
	case err == nil && !metav1.IsControlledBy(existing, owner):
		return &ConflictError{Reason: reason,
			Msg: fmt.Sprintf("%s %s exists and is not owned by this %s", kind, key.Name, ownerKind)}
	case err != nil && !apierrors.IsNotFound(err):
		return fmt.Errorf("get %s %s: %w", kind, key.Name, err)
	}
	return nil
}

// Apply server-side applies desired (a typed object) and decodes the
// result into out: fields the operator no longer sets are dropped, fields
// others set (the annotation of kubectl rollout restart, for example) are
// kept, and applying an unchanged object does not write it (its
// resourceVersion stays).
func Apply[T client.Object](ctx context.Context, c client.Client, desired client.Object, out T) (T, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(desired)
	if err != nil {
		return out, fmt.Errorf("convert %s: %w", desired.GetName(), err)
	}
	delete(m, "status")
	unstructured.RemoveNestedField(m, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(m, "spec", "template", "metadata", "creationTimestamp")
	u := &unstructured.Unstructured{Object: m}
	if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return out, fmt.Errorf("apply %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
		return out, fmt.Errorf("decode applied %s: %w", u.GetName(), err)
	}
	return out, nil
}
