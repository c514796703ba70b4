// Package workload is what the three reconcilers (CoderControlPlane,
// CoderProvisioner, CoderWorkspaceProxy) build their children with: the
// Deployment running Coder's image from the v1alpha1.PodSpec every kind
// inlines, the restricted security contexts, the Service from
// v1alpha1.ServiceSpec, and server-side apply that writes nothing at
// steady state and never takes over an object someone else owns.
package workload

import (
	"maps"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

const (
	// TmpPath is every workload's writable scratch directory: the root
	// filesystem is read-only, so caches and HOME live on an emptyDir
	// mounted here.
	TmpPath   = "/tmp"
	tmpVolume = "tmp"
	// coderUID is the user Coder's image runs as. The restricted default
	// names it so that the kubelet can verify runAsNonRoot whatever the
	// image's USER says.
	coderUID = 1000
)

// Workload is the operator's part of a Deployment running Coder's image
// (/opt/coder with Args): what the kind sets, to which the object's
// v1alpha1.PodSpec adds.
type Workload struct {
	Name, Namespace string
	// Labels are the Deployment's.
	Labels map[string]string
	// Selector selects the pods; it never changes (the Deployment's
	// selector is immutable).
	Selector map[string]string
	// PodLabels are the operator's pod labels; they win over
	// spec.podLabels and must include Selector.
	PodLabels map[string]string
	// PodAnnotations are the operator's; they win over spec.podAnnotations.
	PodAnnotations map[string]string
	// Image is the image to run (spec.image already resolved).
	Image     string
	Container string
	// Args follow /opt/coder; spec.extraArgs follow them.
	Args []string
	// Env is the operator's; a variable of spec.env replaces the
	// operator's of the same name (MergeEnv).
	Env   []corev1.EnvVar
	Ports []corev1.ContainerPort
	// Volumes and VolumeMounts are the operator's besides the emptyDir at
	// TmpPath; spec's replace those of the same name or mount path.
	Volumes      []corev1.Volume
	VolumeMounts []corev1.VolumeMount
	// LivenessProbe and ReadinessProbe are the container's probes.
	LivenessProbe, ReadinessProbe *corev1.Probe
	// ServiceAccountName runs the pods as that service account; empty
	// means the namespace's default.
	ServiceAccountName string
	// AutomountServiceAccountToken, when set, decides whether the pods
	// get a Kubernetes token.
	AutomountServiceAccountToken *bool
	// TerminationGracePeriodSeconds, when set, is how long a stopping pod
	// may take.
	TerminationGracePeriodSeconds *int64
}

// Deployment is w's Deployment shaped by spec: its scheduling, resources
// and additions, the restricted security contexts unless spec replaces
// them, and an emptyDir at TmpPath. Service links are off: coderd and the
// coder CLI read CODER_* variables, and a Service named "coder" in the
// namespace would inject CODER_PORT and friends.
func Deployment(spec coderv1alpha1.PodSpec, w Workload) *appsv1.Deployment {
	podSC := spec.PodSecurityContext
	if podSC == nil {
		podSC = RestrictedPodSecurityContext()
	}
	containerSC := spec.SecurityContext
	if containerSC == nil {
		containerSC = RestrictedContainerSecurityContext()
	}
	volumes := dedupeLast(slices.Concat(
		[]corev1.Volume{{Name: tmpVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		w.Volumes, spec.Volumes),
		func(v corev1.Volume) string { return v.Name })
	mounts := dedupeLast(slices.Concat(
		[]corev1.VolumeMount{{Name: tmpVolume, MountPath: TmpPath}},
		w.VolumeMounts, spec.VolumeMounts),
		func(m corev1.VolumeMount) string { return m.MountPath })
	return &appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      w.Name,
			Namespace: w.Namespace,
			Labels:    w.Labels,
		},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(ptr.Deref(spec.Replicas, 1)),
			Selector: &metav1.LabelSelector{MatchLabels: w.Selector},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels:      MergeMaps(spec.PodLabels, w.PodLabels),
					Annotations: MergeMaps(spec.PodAnnotations, w.PodAnnotations),
				},
				Spec: corev1.PodSpec{
					ServiceAccountName:            w.ServiceAccountName,
					AutomountServiceAccountToken:  w.AutomountServiceAccountToken,
					TerminationGracePeriodSeconds: w.TerminationGracePeriodSeconds,
					EnableServiceLinks:            ptr.To(false),
					SecurityContext:               podSC,
					ImagePullSecrets:              spec.ImagePullSecrets,
					NodeSelector:                  MergeMaps(spec.NodeSelector, nil),
					Tolerations:                   spec.Tolerations,
					Affinity:                      spec.Affinity,
					TopologySpreadConstraints:     spec.TopologySpreadConstraints,
					PriorityClassName:             spec.PriorityClassName,
					Containers: []corev1.Container{{
						Name:            w.Container,
						Image:           w.Image,
						ImagePullPolicy: spec.ImagePullPolicy,
						Command:         []string{"/opt/coder"},
						Args:            slices.Concat(w.Args, spec.ExtraArgs),
						Ports:           w.Ports,
						Env:             MergeEnv(w.Env, spec.Env),
						EnvFrom:         spec.EnvFrom,
						Resources:       spec.Resources,
						VolumeMounts:    mounts,
						LivenessProbe:   w.LivenessProbe,
						ReadinessProbe:  w.ReadinessProbe,
						SecurityContext: containerSC,
					}},
					Volumes: volumes,
				},
			},
		},
	}
}

// RestrictedPodSecurityContext meets the "restricted" Pod Security
// Standard at the pod level; the user is set on the container
// (RestrictedContainerSecurityContext).
func RestrictedPodSecurityContext() *corev1.PodSecurityContext {
	return &corev1.PodSecurityContext{
		RunAsNonRoot:   ptr.To(true),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// RestrictedContainerSecurityContext meets the "restricted" Pod Security
// Standard with a read-only root filesystem, as Coder's user.
func RestrictedContainerSecurityContext() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		ReadOnlyRootFilesystem:   ptr.To(true),
		RunAsNonRoot:             ptr.To(true),
		RunAsUser:                ptr.To[int64](coderUID),
		RunAsGroup:               ptr.To[int64](coderUID),
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// MergeMaps returns base with over's entries winning, or nil when both
// are empty (so that an empty map claims no field when applied).
func MergeMaps(base, over map[string]string) map[string]string {
	if len(base)+len(over) == 0 {
		return nil
	}
	out := make(map[string]string, len(base)+len(over))
	maps.Copy(out, base)
	maps.Copy(out, over)
	return out
}

// MergeEnv is the operator's environment followed by the user's; a user
// variable replaces the operator's of the same name at the operator's
// position. Duplicate names collapse (the last wins, as the kubelet would
// do), because server-side apply refuses duplicate keys.
func MergeEnv(ours, user []corev1.EnvVar) []corev1.EnvVar {
	return dedupeLast(slices.Concat(ours, user), func(e corev1.EnvVar) string { return e.Name })
}

// Dedupe drops repeated strings, keeping the first position of each.
func Dedupe(items []string) []string {
	return dedupeLast(items, func(s string) string { return s })
}

// dedupeLast keeps the last item of each key, at the position of its first
// occurrence, so that an override keeps the operator's ordering.
func dedupeLast[T any](items []T, key func(T) string) []T {
	if len(items) == 0 {
		return items
	}
	last := make(map[string]int, len(items))
	for i, it := range items {
		last[key(it)] = i
	}
	out := make([]T, 0, len(last))
	placed := make(map[string]bool, len(last))
	for _, it := range items {
		k := key(it)
		if placed[k] {
			continue
		}
		placed[k] = true
		out = append(out, items[last[k]])
	}
	return out
}
