package controlplane

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// fakePodIP is the pod IP of coderd pods in tests whose access manager is
// a fake, which dials nothing.
const fakePodIP = "10.244.0.10"

// runPod stands in for the ReplicaSet controller and the kubelet, which
// the test API server does not run: it creates a pod from the
// Deployment's pod template, as the ReplicaSet would, and writes the
// status a kubelet writes once the pod runs and passes its readiness
// probe, at pod IP ip, and counts it in the Deployment's status, as the
// Deployment controller does.
func runPod(t *testing.T, c client.Client, ns, deployment, ip string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	var dep appsv1.Deployment
	eventually(t, 30*time.Second, "Deployment "+deployment, func() error {
		return c.Get(ctx, types.NamespacedName{Namespace: ns, Name: deployment}, &dep)
	})
	tmpl := dep.Spec.Template
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    ns,
			GenerateName: deployment + "-",
			Labels:       tmpl.Labels,
			Annotations:  tmpl.Annotations,
		},
		Spec: tmpl.Spec,
	}
	// The ServiceAccount admission plugin wants the service account the
	// operator creates; wait for it like a ReplicaSet's retries would.
	eventually(t, 30*time.Second, "create pod", func() error {
		return c.Create(ctx, pod)
	})
	now := metav1.Now()
	pod.Status = corev1.PodStatus{
		Phase:     corev1.PodRunning,
		PodIP:     ip,
		PodIPs:    []corev1.PodIP{{IP: ip}},
		HostIP:    "127.0.0.1",
		HostIPs:   []corev1.HostIP{{IP: "127.0.0.1"}},
		StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
	}
	for _, ctr := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: ctr.Name, Image: ctr.Image, ImageID: ctr.Image, Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	if err := c.Status().Update(ctx, pod); err != nil {
		t.Fatalf("write pod %s status: %v", pod.Name, err)
	}
	// The Deployment controller counts the ready pod.
	eventually(t, 10*time.Second, "count the ready pod in the Deployment's status", func() error {
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: deployment}, &dep); err != nil {
			return err
		}
		dep.Status.ObservedGeneration = dep.Generation
		dep.Status.Replicas++
		dep.Status.UpdatedReplicas++
		dep.Status.ReadyReplicas++
		return c.Status().Update(ctx, &dep)
	})
	return pod
}
