package workload

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

// TestDesiredInIgnoresServerDefaults checks the no-write decision on a
// Deployment as the API server returns it: defaulted fields and
// canonicalized quantities match, changed or added values do not.
func TestDesiredInIgnoresServerDefaults(t *testing.T) {
	// As a user writes it in the CRD, which keeps the spelling.
	var spec coderv1alpha1.PodSpec
	if err := yaml.Unmarshal([]byte(`{"resources": {"limits": {"cpu": "1000m", "memory": "1024Mi"}}}`), &spec); err != nil {
		t.Fatal(err)
	}
	desired := Deployment(spec, Workload{
		Name: "coder", Namespace: "ns", Selector: map[string]string{"app": "coder"}, PodLabels: map[string]string{"app": "coder"},
		Image: coderv1alpha1.DefaultImage, Container: "coder", Args: []string{"server"},
		Env: []corev1.EnvVar{{Name: "CODER_HTTP_ADDRESS", Value: "0.0.0.0:8080"}},
	})
	want, err := toApplyMap(desired)
	if err != nil {
		t.Fatal(err)
	}

	// What the API server stores: the same plus defaults.
	live := desired.DeepCopy()
	live.Spec.RevisionHistoryLimit = new(int32)
	live.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyAlways
	live.Spec.Template.Spec.DNSPolicy = corev1.DNSClusterFirst
	c := &live.Spec.Template.Spec.Containers[0]
	c.TerminationMessagePath = "/dev/termination-log"
	c.ImagePullPolicy = corev1.PullIfNotPresent
	c.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")}
	live.Spec.Template.Spec.Volumes[0].EmptyDir.Medium = ""
	live.Status = appsv1.DeploymentStatus{Replicas: 1}
	liveMap, err := runtime.DefaultUnstructuredConverter.ToUnstructured(live)
	if err != nil {
		t.Fatal(err)
	}
	if !desiredIn(want, liveMap) {
		t.Fatal("a Deployment with only server defaults added does not match its desired state")
	}

	changed := live.DeepCopy()
	changed.Spec.Template.Spec.Containers[0].Image = "other"
	changedMap, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(changed)
	if desiredIn(want, changedMap) {
		t.Error("a changed image matches the desired state")
	}
	extraEnv := live.DeepCopy()
	extraEnv.Spec.Template.Spec.Containers[0].Env = append(extraEnv.Spec.Template.Spec.Containers[0].Env, corev1.EnvVar{Name: "X", Value: "1"})
	extraMap, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(extraEnv)
	if desiredIn(want, extraMap) {
		t.Error("an added environment variable matches the desired state")
	}
}
