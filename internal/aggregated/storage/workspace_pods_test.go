package storage

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/coder/coder-k8s/internal/testenv"
)

// TestPodDiagnosis runs against a real kube-apiserver: a workspace's pod
// whose container waits on an image pull (its status and Warning event in
// the shape the kubelet writes them; this test plane has no node) is
// described for a caller whom RBAC lets list pods and events, without
// its event for one who may list only pods, and not at all for one who
// may list neither; pods of other workspaces and namespaces the caller
// may not read are left out.
func TestPodDiagnosis(t *testing.T) {
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	ctx := context.Background()
	kube, err := client.New(k.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const ns, other, id = "ws", "ws-extra", "0d3c0a9e-55a2-4c37-9d0b-2b0d0f4f6a11"
	for _, n := range []string{ns, other} {
		if err := k.EnsureNamespace(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	pod := func(namespace, name, workspace string) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: map[string]string{LabelWorkspaceID: workspace}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "dev", Image: "127.0.0.1:5000/nope:1"}}},
		}
		if err := kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "dev", Image: "127.0.0.1:5000/nope:1",
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: `Back-off pulling image "127.0.0.1:5000/nope:1"`}},
		}}}
		if err := kube.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := pod(ns, "coder-alice-dev", id)
	pod(ns, "coder-bob-other", "7a0b2c3d-0000-4000-8000-000000000000")
	pod(other, "coder-alice-dev-extra", id)
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	for i, msg := range []string{`Failed to pull image "127.0.0.1:5000/nope:1": not found`, `Error: ErrImagePull`} {
		ev := &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Namespace: ns, Name: p.Name + ".failed" + string(rune('a'+i))},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: p.Name, UID: p.UID, APIVersion: "v1"},
			Type:           corev1.EventTypeWarning, Reason: "Failed", Message: msg,
			FirstTimestamp: now, LastTimestamp: metav1.NewTime(now.Add(time.Duration(i) * time.Second)), Count: 1,
			Source: corev1.EventSource{Component: "kubelet"},
		}
		if err := kube.Create(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	grant := func(who, namespace string, resources ...string) {
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: who},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: resources, Verbs: []string{"list"}}}}
		binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: who},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: who},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: who}}}
		for _, o := range []client.Object{role, binding} {
			if err := kube.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	grant("reader", ns, "pods", "events")
	grant("podsonly", ns, "pods")
	as := func(name string) context.Context {
		return genericapirequest.WithUser(ctx, &user.DefaultInfo{Name: name, Groups: []string{user.AllAuthenticated}})
	}
	const podPart = `pod ws/coder-alice-dev (Pending): container dev waiting: ImagePullBackOff: Back-off pulling image "127.0.0.1:5000/nope:1"`
	for _, tc := range []struct {
		who, want string
	}{
		{"reader", podPart + `, latest warning event Failed: Error: ErrImagePull`},
		{"podsonly", podPart},
		{"nobody", ""},
	} {
		// RBAC takes effect in kube-apiserver's authorizer within moments.
		var got string
		deadline := time.Now().Add(10 * time.Second)
		for {
			got, err = podDiagnosis(as(tc.who), kube, []string{ns, other}, id)
			if err != nil {
				t.Fatalf("%s: %v", tc.who, err)
			}
			if got == tc.want || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if got != tc.want {
			t.Errorf("as %s:\n got %q\nwant %q", tc.who, got, tc.want)
		}
		if strings.Contains(got, "coder-bob-other") || strings.Contains(got, other) {
			t.Errorf("as %s: %q shows another workspace's pod or a namespace the caller may not read", tc.who, got)
		}
	}
}
