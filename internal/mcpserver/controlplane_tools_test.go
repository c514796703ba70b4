package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

// operatorTokenValue is the content of the operator token Secret; no tool
// output may contain it.
const operatorTokenValue = "operator-token-7c1e9a0b5d2f-SECRET"

// controlPlaneReadRules are what the control plane tools need; reading
// namespaces lets them tell a misspelt namespace from an empty one.
var controlPlaneReadRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"coder.com"}, Resources: []string{"codercontrolplanes"}, Verbs: []string{"get", "list"}},
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}},
	{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"get"}},
	{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get"}},
	{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get"}},
}

// recorder calls tools and keeps everything they returned, to check later
// that no output leaked a secret.
type recorder struct {
	s   *mcp.ClientSession
	out strings.Builder
}

func (r *recorder) call(t *testing.T, name string, args map[string]any, out any) *mcp.CallToolResult {
	t.Helper()
	res := callTool(t, r.s, name, args, out)
	r.out.WriteString(resultText(res))
	raw, _ := json.Marshal(res.StructuredContent)
	r.out.Write(raw)
	return res
}

// mustFail asserts an isError result whose text contains every want.
func mustFail(t *testing.T, res *mcp.CallToolResult, want ...string) {
	t.Helper()
	text := resultText(res)
	if !res.IsError {
		t.Fatalf("want an error result, got: %s", text)
	}
	for _, w := range want {
		if !strings.Contains(text, w) {
			t.Errorf("error %q does not say %q", text, w)
		}
	}
}

func mustSucceed(t *testing.T, res *mcp.CallToolResult) {
	t.Helper()
	if res.IsError {
		t.Fatalf("unexpected error result: %s", resultText(res))
	}
}

func readyCondition(typ string, status metav1.ConditionStatus, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: 1,
		LastTransitionTime: metav1.NewTime(time.Now().Add(-time.Minute).Truncate(time.Second))}
}

// createControlPlane creates a CoderControlPlane and, when status is not
// nil, writes its status through the status subresource as the operator
// would.
func createControlPlane(t *testing.T, h *harness, namespace, name string, spec coderv1alpha1.CoderControlPlaneSpec, status *coderv1alpha1.CoderControlPlaneStatus) *coderv1alpha1.CoderControlPlane {
	t.Helper()
	ctx := context.Background()
	if err := h.k.EnsureNamespace(ctx, namespace); err != nil {
		t.Fatal(err)
	}
	cp := &coderv1alpha1.CoderControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, Spec: spec}
	if err := h.c.Create(ctx, cp); err != nil {
		t.Fatalf("create control plane %s/%s: %v", namespace, name, err)
	}
	if status != nil {
		cp.Status = *status
		if cp.Status.ObservedGeneration == 0 {
			cp.Status.ObservedGeneration = cp.Generation
		}
		if err := h.c.Status().Update(ctx, cp); err != nil {
			t.Fatalf("status of control plane %s/%s: %v", namespace, name, err)
		}
	}
	return cp
}

// coderdLabels are the labels internal/controller/controlplane selects
// coderd's pods with.
func coderdLabels(name string) map[string]string {
	return map[string]string{"app.kubernetes.io/name": "coder", "app.kubernetes.io/instance": name, "app.kubernetes.io/component": "coderd"}
}

func createCoderdDeployment(t *testing.T, h *harness, namespace, name string, replicas int32) *appsv1.Deployment {
	t.Helper()
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: coderdLabels(name)},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: coderdLabels(name)},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: coderdLabels(name)},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "coder", Image: coderv1alpha1.DefaultImage}}},
			},
		},
	}
	if err := h.c.Create(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	return d
}

// setDeploymentStatus writes d's status as the Deployment controller
// would (no controller runs here).
func setDeploymentStatus(t *testing.T, h *harness, d *appsv1.Deployment, st appsv1.DeploymentStatus) {
	t.Helper()
	d.Status = st
	if err := h.c.Status().Update(context.Background(), d); err != nil {
		t.Fatal(err)
	}
}

// createCoderdPod creates a pod and writes its status as a kubelet would.
func createCoderdPod(t *testing.T, h *harness, namespace, name string, labels map[string]string, node string, st corev1.PodStatus) {
	t.Helper()
	ctx := context.Background()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "coder", Image: coderv1alpha1.DefaultImage}}},
	}
	if err := h.c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p.Status = st
	if err := h.c.Status().Update(ctx, p); err != nil {
		t.Fatalf("status of pod %s: %v", name, err)
	}
}

func podCondition(t corev1.PodConditionType, s corev1.ConditionStatus, reason, msg string) corev1.PodCondition {
	return corev1.PodCondition{Type: t, Status: s, Reason: reason, Message: msg, LastTransitionTime: metav1.Now()}
}

func TestControlPlaneTools(t *testing.T) {
	h := newHarness(t, nil, nil)
	ctx := t.Context()
	const ns, otherNS = "coder", "team-b"

	// alpha: a deployed control plane, Ready, with operator access and a
	// rollout in progress.
	for _, n := range []string{ns, otherNS} {
		if err := h.k.EnsureNamespace(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "alpha-operator-token"},
		Data: map[string][]byte{"token": []byte(operatorTokenValue)}}); err != nil {
		t.Fatal(err)
	}
	createControlPlane(t, h, ns, "alpha", coderv1alpha1.CoderControlPlaneSpec{PodSpec: coderv1alpha1.PodSpec{Replicas: ptr(int32(2))}},
		&coderv1alpha1.CoderControlPlaneStatus{
			Phase: coderv1alpha1.PhaseReady, URL: "http://alpha.coder.svc:80", Replicas: 2, ReadyReplicas: 1,
			CoderVersion: "v2.30.0", OperatorUser: "coder-k8s-operator",
			OperatorTokenSecretRef: &coderv1alpha1.SecretKeyReference{Name: "alpha-operator-token", Key: "token"},
			Conditions: []metav1.Condition{
				readyCondition(coderv1alpha1.ConditionAvailable, metav1.ConditionTrue, "MinimumReplicasAvailable", "coderd serves requests"),
				readyCondition(coderv1alpha1.ConditionOperatorAccessReady, metav1.ConditionTrue, "TokenValid", "the operator token works"),
				readyCondition(coderv1alpha1.ConditionReconciled, metav1.ConditionTrue, "Applied", "all children applied"),
			},
		})
	// beta: an adopted coderd whose operator access is broken.
	createControlPlane(t, h, ns, "beta", coderv1alpha1.CoderControlPlaneSpec{ExternalURL: "https://coder.example.com"},
		&coderv1alpha1.CoderControlPlaneStatus{
			Phase: coderv1alpha1.PhaseDegraded, URL: "https://coder.example.com",
			Conditions: []metav1.Condition{
				readyCondition(coderv1alpha1.ConditionOperatorAccessReady, metav1.ConditionFalse, "CoderdUnreachable", "coderd at https://coder.example.com is unreachable"),
			},
		})
	// gamma: just created, never reconciled: no status, no children.
	createControlPlane(t, h, ns, "gamma", coderv1alpha1.CoderControlPlaneSpec{}, nil)
	// delta: in another namespace.
	createControlPlane(t, h, otherNS, "delta", coderv1alpha1.CoderControlPlaneSpec{},
		&coderv1alpha1.CoderControlPlaneStatus{Phase: coderv1alpha1.PhaseProvisioning, URL: "http://delta.team-b.svc:80"})

	dep := createCoderdDeployment(t, h, ns, "alpha", 2)
	setDeploymentStatus(t, h, dep, appsv1.DeploymentStatus{
		ObservedGeneration: dep.Generation, Replicas: 2, UpdatedReplicas: 2, ReadyReplicas: 1, AvailableReplicas: 1, UnavailableReplicas: 1,
		Conditions: []appsv1.DeploymentCondition{
			{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionFalse, Reason: "MinimumReplicasUnavailable", Message: "Deployment does not have minimum availability."},
			{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: "ReplicaSetUpdated", Message: `ReplicaSet "alpha-5d8f" is progressing.`},
		},
	})

	running := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	createCoderdPod(t, h, ns, "alpha-a", coderdLabels("alpha"), "node-1", corev1.PodStatus{
		Phase:      corev1.PodRunning,
		Conditions: []corev1.PodCondition{podCondition(corev1.PodScheduled, corev1.ConditionTrue, "", ""), podCondition(corev1.PodReady, corev1.ConditionTrue, "", "")},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "coder", Image: coderv1alpha1.DefaultImage, Ready: true, RestartCount: 2,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: running}}}},
	})
	createCoderdPod(t, h, ns, "alpha-b", coderdLabels("alpha"), "node-2", corev1.PodStatus{
		Phase: corev1.PodRunning,
		Conditions: []corev1.PodCondition{podCondition(corev1.PodScheduled, corev1.ConditionTrue, "", ""),
			podCondition(corev1.PodReady, corev1.ConditionFalse, "ContainersNotReady", "containers with unready status: [coder]")},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "coder", Image: coderv1alpha1.DefaultImage, RestartCount: 5,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 5m0s restarting failed container=coder"}}}},
	})
	createCoderdPod(t, h, ns, "alpha-c", coderdLabels("alpha"), "", corev1.PodStatus{
		Phase:      corev1.PodPending,
		Conditions: []corev1.PodCondition{podCondition(corev1.PodScheduled, corev1.ConditionFalse, "Unschedulable", "0/3 nodes are available: 3 Insufficient cpu.")},
	})
	// Not a pod of alpha: another instance's.
	createCoderdPod(t, h, ns, "gamma-x", coderdLabels("gamma"), "node-1", corev1.PodStatus{Phase: corev1.PodRunning})

	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "alpha", Labels: coderdLabels("alpha")},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: coderdLabels("alpha"),
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP}}},
	}
	if err := h.c.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.10"}}
	if err := h.c.Status().Update(ctx, svc); err != nil {
		t.Fatal(err)
	}

	token := h.serviceAccountToken(t, "agents", "operator-reader")
	h.grant(t, "agents", "operator-reader", "", controlPlaneReadRules...)
	r := &recorder{s: h.connect(t, token)}

	t.Run("tools describe themselves", func(t *testing.T) {
		res, err := r.s.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]bool{"list_control_planes": false, "get_control_plane": false, "list_control_plane_pods": false,
			"get_control_plane_rollout": false, "get_control_plane_service": false, "health": true}
		seen := 0
		for _, tl := range res.Tools {
			openWorld, ok := want[tl.Name]
			if !ok {
				continue
			}
			seen++
			a := tl.Annotations
			if tl.Title == "" || len(tl.Description) < 60 || a == nil {
				t.Errorf("%s: title %q, description %q, annotations %v", tl.Name, tl.Title, tl.Description, a)
				continue
			}
			if !a.ReadOnlyHint || !a.IdempotentHint || a.DestructiveHint == nil || *a.DestructiveHint || a.OpenWorldHint == nil || *a.OpenWorldHint != openWorld {
				t.Errorf("%s: hints readOnly=%v idempotent=%v destructive=%v openWorld=%v, want read-only, idempotent, not destructive, openWorld=%v",
					tl.Name, a.ReadOnlyHint, a.IdempotentHint, a.DestructiveHint, a.OpenWorldHint, openWorld)
			}
		}
		if seen != len(want) {
			t.Errorf("found %d of the %d tools", seen, len(want))
		}
	})

	t.Run("list_control_planes pages through every namespace", func(t *testing.T) {
		var first, second ControlPlaneList
		mustSucceed(t, r.call(t, "list_control_planes", map[string]any{"limit": 2}, &first))
		if got := rowNames(first.Items); got != "coder/alpha coder/beta" || first.Continue == "" {
			t.Fatalf("first page %s, continue %q", got, first.Continue)
		}
		a, b := first.Items[0], first.Items[1]
		if a.Phase != "Ready" || a.URL != "http://alpha.coder.svc:80" || !a.AccessReady || a.Adopted || a.Age == "" {
			t.Errorf("alpha row: %+v", a)
		}
		if b.Phase != "Degraded" || b.AccessReady || !b.Adopted {
			t.Errorf("beta row: %+v", b)
		}
		mustSucceed(t, r.call(t, "list_control_planes", map[string]any{"limit": 2, "continue": first.Continue}, &second))
		if got := rowNames(second.Items); got != "coder/gamma team-b/delta" || second.Continue != "" {
			t.Fatalf("second page %s, continue %q", got, second.Continue)
		}
		if g := second.Items[0]; g.Phase != "" || g.AccessReady {
			t.Errorf("an unreconciled control plane: %+v", g)
		}
	})

	t.Run("list_control_planes in one namespace", func(t *testing.T) {
		var l ControlPlaneList
		mustSucceed(t, r.call(t, "list_control_planes", map[string]any{"namespace": otherNS}, &l))
		if got := rowNames(l.Items); got != "team-b/delta" || l.Continue != "" {
			t.Fatalf("rows %s, continue %q", got, l.Continue)
		}
	})

	t.Run("list_control_planes in an unknown namespace says so", func(t *testing.T) {
		mustFail(t, r.call(t, "list_control_planes", map[string]any{"namespace": "no-such-ns"}, nil),
			`namespace "no-such-ns" does not exist`, "without a namespace")
	})

	t.Run("a bad continue token is explained", func(t *testing.T) {
		mustFail(t, r.call(t, "list_control_planes", map[string]any{"continue": "garbage"}, nil), "call it again without continue")
	})

	t.Run("get_control_plane shows status, conditions and operator access", func(t *testing.T) {
		var d ControlPlaneDetail
		mustSucceed(t, r.call(t, "get_control_plane", map[string]any{"namespace": ns, "name": "alpha"}, &d))
		if d.Phase != "Ready" || d.URL != "http://alpha.coder.svc:80" || d.Adopted || d.CoderVersion != "v2.30.0" {
			t.Errorf("detail: %+v", d)
		}
		if d.Generation == 0 || d.ObservedGeneration != d.Generation || !d.StatusCurrent {
			t.Errorf("generation %d, observed %d, current %v", d.Generation, d.ObservedGeneration, d.StatusCurrent)
		}
		if d.DesiredReplicas == nil || *d.DesiredReplicas != 2 || d.Replicas != 2 || d.ReadyReplicas != 1 {
			t.Errorf("replicas: desired %v, %d, ready %d", d.DesiredReplicas, d.Replicas, d.ReadyReplicas)
		}
		var types []string
		for _, c := range d.Conditions {
			types = append(types, c.Type+"="+c.Status+"/"+c.Reason)
			if c.LastTransition == "" || c.Message == "" {
				t.Errorf("condition without time or message: %+v", c)
			}
		}
		if got := strings.Join(types, " "); got != "Available=True/MinimumReplicasAvailable OperatorAccessReady=True/TokenValid Reconciled=True/Applied" {
			t.Errorf("conditions: %s", got)
		}
		oa := d.OperatorAccess
		if !oa.Ready || oa.User != "coder-k8s-operator" || oa.TokenSecretName != "alpha-operator-token" || oa.Reason != "TokenValid" {
			t.Errorf("operator access: %+v", oa)
		}
	})

	t.Run("get_control_plane of an adopted coderd and of an unreconciled one", func(t *testing.T) {
		var beta, gamma ControlPlaneDetail
		mustSucceed(t, r.call(t, "get_control_plane", map[string]any{"namespace": ns, "name": "beta"}, &beta))
		if !beta.Adopted || beta.ExternalURL != "https://coder.example.com" || beta.OperatorAccess.Ready ||
			beta.OperatorAccess.Reason != "CoderdUnreachable" || !strings.Contains(beta.OperatorAccess.Message, "unreachable") {
			t.Errorf("beta: %+v", beta)
		}
		mustSucceed(t, r.call(t, "get_control_plane", map[string]any{"namespace": ns, "name": "gamma"}, &gamma))
		if gamma.StatusCurrent || gamma.ObservedGeneration != 0 || gamma.Generation != 1 || len(gamma.Conditions) != 0 {
			t.Errorf("gamma: %+v", gamma)
		}
	})

	t.Run("get_control_plane of an unknown object is an actionable error", func(t *testing.T) {
		mustFail(t, r.call(t, "get_control_plane", map[string]any{"namespace": ns, "name": "nope"}, nil),
			`no CoderControlPlane "nope" in namespace "coder"`, "list_control_planes")
		mustFail(t, r.call(t, "get_control_plane", map[string]any{"namespace": "no-such-ns", "name": "alpha"}, nil),
			`namespace "no-such-ns" does not exist`)
		mustFail(t, r.call(t, "get_control_plane", map[string]any{"namespace": ns}, nil), "name")
	})

	t.Run("list_control_plane_pods pages through the Deployment's pods", func(t *testing.T) {
		var first, second ControlPlanePods
		mustSucceed(t, r.call(t, "list_control_plane_pods", map[string]any{"namespace": ns, "name": "alpha", "limit": 2}, &first))
		if first.Total != 3 || len(first.Items) != 2 || first.Continue == "" || first.Deployment != "alpha" ||
			!strings.Contains(first.Selector, "app.kubernetes.io/instance=alpha") {
			t.Fatalf("first page: %+v", first)
		}
		a, b := first.Items[0], first.Items[1]
		if a.Name != "alpha-a" || a.Phase != "Running" || a.Ready != "1/1" || a.Restarts != 2 || a.Node != "node-1" || a.Reason != "" || a.Age == "" {
			t.Errorf("ready pod: %+v", a)
		}
		if b.Name != "alpha-b" || b.Ready != "0/1" || b.Restarts != 5 || !strings.HasPrefix(b.Reason, "CrashLoopBackOff") {
			t.Errorf("crashing pod: %+v", b)
		}
		mustSucceed(t, r.call(t, "list_control_plane_pods", map[string]any{"namespace": ns, "name": "alpha", "limit": 2, "continue": first.Continue}, &second))
		if len(second.Items) != 1 || second.Continue != "" {
			t.Fatalf("second page: %+v", second)
		}
		if c := second.Items[0]; c.Name != "alpha-c" || c.Phase != "Pending" || c.Node != "" || !strings.Contains(c.Reason, "Unschedulable: 0/3 nodes are available") {
			t.Errorf("unschedulable pod: %+v", c)
		}
	})

	t.Run("children of an adopted control plane are explained, not failed", func(t *testing.T) {
		var pods ControlPlanePods
		mustSucceed(t, r.call(t, "list_control_plane_pods", map[string]any{"namespace": ns, "name": "beta"}, &pods))
		if !pods.Adopted || len(pods.Items) != 0 || !strings.Contains(pods.Message, "spec.externalURL") {
			t.Errorf("pods: %+v", pods)
		}
		var ro ControlPlaneRollout
		mustSucceed(t, r.call(t, "get_control_plane_rollout", map[string]any{"namespace": ns, "name": "beta"}, &ro))
		if !ro.Adopted || ro.Complete || !strings.Contains(ro.Status, "no rollout") {
			t.Errorf("rollout: %+v", ro)
		}
		var s ControlPlaneService
		mustSucceed(t, r.call(t, "get_control_plane_service", map[string]any{"namespace": ns, "name": "beta"}, &s))
		if !s.Adopted || s.Service != "" || !strings.Contains(s.Message, "creates no Service") {
			t.Errorf("service: %+v", s)
		}
	})

	t.Run("children not created yet are explained", func(t *testing.T) {
		for _, tc := range []struct{ tool, kind string }{
			{"list_control_plane_pods", "Deployment"}, {"get_control_plane_rollout", "Deployment"}, {"get_control_plane_service", "Service"},
		} {
			mustFail(t, r.call(t, tc.tool, map[string]any{"namespace": ns, "name": "gamma"}, nil),
				`coder/gamma has no `+tc.kind+` "gamma"`, "get_control_plane")
			mustFail(t, r.call(t, tc.tool, map[string]any{"namespace": ns, "name": "nope"}, nil), `no CoderControlPlane "nope"`)
		}
	})

	t.Run("get_control_plane_rollout judges like kubectl rollout status", func(t *testing.T) {
		var ro ControlPlaneRollout
		mustSucceed(t, r.call(t, "get_control_plane_rollout", map[string]any{"namespace": ns, "name": "alpha"}, &ro))
		if ro.Complete || ro.Status != `Waiting for deployment "alpha" rollout to finish: 1 of 2 updated replicas are available...` ||
			ro.DesiredReplicas != 2 || ro.UpdatedReplicas != 2 || ro.ReadyReplicas != 1 || ro.AvailableReplicas != 1 || ro.UnavailableReplicas != 1 ||
			ro.ObservedGeneration != ro.Generation || len(ro.Conditions) != 2 {
			t.Fatalf("in progress: %+v", ro)
		}

		setDeploymentStatus(t, h, dep, appsv1.DeploymentStatus{
			ObservedGeneration: dep.Generation, Replicas: 2, UpdatedReplicas: 1, ReadyReplicas: 2, AvailableReplicas: 2,
			Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse,
				Reason: "ProgressDeadlineExceeded", Message: `ReplicaSet "alpha-6c9d" has timed out progressing.`}},
		})
		mustSucceed(t, r.call(t, "get_control_plane_rollout", map[string]any{"namespace": ns, "name": "alpha"}, &ro))
		if ro.Complete || ro.Status != `deployment "alpha" exceeded its progress deadline` {
			t.Fatalf("timed out: %+v", ro)
		}

		setDeploymentStatus(t, h, dep, appsv1.DeploymentStatus{
			ObservedGeneration: dep.Generation, Replicas: 2, UpdatedReplicas: 2, ReadyReplicas: 2, AvailableReplicas: 2,
			Conditions: []appsv1.DeploymentCondition{
				{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable"},
				{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: "NewReplicaSetAvailable"},
			},
		})
		mustSucceed(t, r.call(t, "get_control_plane_rollout", map[string]any{"namespace": ns, "name": "alpha"}, &ro))
		if !ro.Complete || ro.Status != `deployment "alpha" successfully rolled out` {
			t.Fatalf("done: %+v", ro)
		}

		// A spec change the Deployment controller has not seen yet.
		dep.Spec.Replicas = ptr(int32(3))
		if err := h.c.Update(ctx, dep); err != nil {
			t.Fatal(err)
		}
		mustSucceed(t, r.call(t, "get_control_plane_rollout", map[string]any{"namespace": ns, "name": "alpha"}, &ro))
		if ro.Complete || ro.Generation <= ro.ObservedGeneration || ro.Status != "Waiting for deployment spec update to be observed..." {
			t.Fatalf("unobserved: %+v", ro)
		}
	})

	t.Run("get_control_plane_service shows ports and external addresses", func(t *testing.T) {
		var s ControlPlaneService
		mustSucceed(t, r.call(t, "get_control_plane_service", map[string]any{"namespace": ns, "name": "alpha"}, &s))
		if s.Service != "alpha" || s.Type != "LoadBalancer" || net.ParseIP(s.ClusterIP) == nil || s.Pending ||
			s.InClusterURL != "http://alpha.coder.svc:80" || strings.Join(s.ExternalAddresses, ",") != "203.0.113.10" {
			t.Errorf("service: %+v", s)
		}
		if len(s.Ports) != 1 || s.Ports[0].Name != "http" || s.Ports[0].Port != 80 || s.Ports[0].TargetPort != "http" ||
			s.Ports[0].NodePort == 0 || s.Ports[0].Protocol != "TCP" {
			t.Errorf("ports: %+v", s.Ports)
		}
	})

	t.Run("without RBAC every tool names the missing permission", func(t *testing.T) {
		nobody := &recorder{s: h.connect(t, h.serviceAccountToken(t, "agents", "nobody"))}
		// kube-apiserver's refusal, as kubectl would show it.
		who := `User "system:serviceaccount:agents:nobody" cannot `
		for tool, want := range map[string]string{
			"list_control_planes":       `list resource "codercontrolplanes" in API group "coder.com" at the cluster scope`,
			"get_control_plane":         `get resource "codercontrolplanes" in API group "coder.com" in the namespace "coder"`,
			"list_control_plane_pods":   `get resource "codercontrolplanes" in API group "coder.com" in the namespace "coder"`,
			"get_control_plane_rollout": `get resource "codercontrolplanes" in API group "coder.com" in the namespace "coder"`,
			"get_control_plane_service": `get resource "codercontrolplanes" in API group "coder.com" in the namespace "coder"`,
			"health":                    `list resource "codercontrolplanes" in API group "coder.com" at the cluster scope`,
		} {
			args := map[string]any{}
			if strings.HasPrefix(tool, "get_") || tool == "list_control_plane_pods" {
				args = map[string]any{"namespace": ns, "name": "alpha"}
			}
			mustFail(t, nobody.call(t, tool, args, nil), who+want, "Role")
		}

		// Allowed to read control planes, not their children.
		h.grant(t, "agents", "cp-only", ns, rbacv1.PolicyRule{APIGroups: []string{"coder.com"}, Resources: []string{"codercontrolplanes"}, Verbs: []string{"get", "list"}})
		cpOnly := &recorder{s: h.connect(t, h.serviceAccountToken(t, "agents", "cp-only"))}
		who = `User "system:serviceaccount:agents:cp-only" cannot `
		for tool, want := range map[string]string{
			// The pods' selector comes from the Deployment.
			"list_control_plane_pods":   `get resource "deployments" in API group "apps" in the namespace "coder"`,
			"get_control_plane_rollout": `get resource "deployments" in API group "apps" in the namespace "coder"`,
			"get_control_plane_service": `get resource "services" in API group "" in the namespace "coder"`,
		} {
			mustFail(t, cpOnly.call(t, tool, map[string]any{"namespace": ns, "name": "alpha"}, nil), who+want)
		}
		// A Role in one namespace allows that namespace, not all of them.
		var l ControlPlaneList
		mustSucceed(t, cpOnly.call(t, "list_control_planes", map[string]any{"namespace": ns}, &l))
		if len(l.Items) != 3 {
			t.Errorf("rows: %s", rowNames(l.Items))
		}
		mustFail(t, cpOnly.call(t, "list_control_planes", nil, nil), who+`list resource "codercontrolplanes" in API group "coder.com" at the cluster scope`)
		mustFail(t, cpOnly.call(t, "get_control_plane", map[string]any{"namespace": otherNS, "name": "delta"}, nil),
			who+`get resource "codercontrolplanes" in API group "coder.com" in the namespace "team-b"`)
		// With deployments but not pods, the pods list is refused.
		h.grant(t, "agents", "cp-only", ns, rbacv1.PolicyRule{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"get"}})
		mustFail(t, cpOnly.call(t, "list_control_plane_pods", map[string]any{"namespace": ns, "name": "alpha"}, nil),
			who+`list resource "pods" in API group "" in the namespace "coder"`)
		r.out.WriteString(nobody.out.String() + cpOnly.out.String())
	})

	t.Run("no output holds the operator token", func(t *testing.T) {
		all := r.out.String()
		if len(all) < 1000 {
			t.Fatalf("recorded only %d bytes of output", len(all))
		}
		for _, leak := range []string{operatorTokenValue, base64.StdEncoding.EncodeToString([]byte(operatorTokenValue))} {
			if strings.Contains(all, leak) {
				t.Errorf("tool output contains the operator token Secret's data (%q)", leak)
			}
		}
		if !strings.Contains(all, "alpha-operator-token") {
			t.Error("the token Secret's name is not shown")
		}
	})
}

func TestHealthTool(t *testing.T) {
	h := newHarness(t, nil, nil)
	coder := testenv.NewCoder(t, testenv.CoderOptions{})
	ctx := t.Context()
	info, err := coder.Client.BuildInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A port nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedURL := "http://" + ln.Addr().String()
	ln.Close()

	const ns = "health"
	createControlPlane(t, h, ns, "down", coderv1alpha1.CoderControlPlaneSpec{ExternalURL: closedURL},
		&coderv1alpha1.CoderControlPlaneStatus{Phase: coderv1alpha1.PhaseDegraded, URL: closedURL})
	createControlPlane(t, h, ns, "fresh", coderv1alpha1.CoderControlPlaneSpec{}, nil)
	createControlPlane(t, h, ns, "up", coderv1alpha1.CoderControlPlaneSpec{ExternalURL: coder.URL.String()},
		&coderv1alpha1.CoderControlPlaneStatus{Phase: coderv1alpha1.PhaseReady, URL: coder.URL.String()})
	createControlPlane(t, h, "healthy", "up", coderv1alpha1.CoderControlPlaneSpec{ExternalURL: coder.URL.String()},
		&coderv1alpha1.CoderControlPlaneStatus{Phase: coderv1alpha1.PhaseReady, URL: coder.URL.String()})

	token := h.serviceAccountToken(t, "agents", "watcher")
	h.grant(t, "agents", "watcher", "", rbacv1.PolicyRule{APIGroups: []string{"coder.com"}, Resources: []string{"codercontrolplanes"}, Verbs: []string{"list"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get"}})
	s := h.connect(t, token)

	t.Run("reports Kubernetes and each coderd", func(t *testing.T) {
		var rep HealthReport
		mustSucceed(t, callTool(t, s, "health", map[string]any{"namespace": ns}, &rep))
		if !rep.Kubernetes.Reachable || !strings.HasPrefix(rep.Kubernetes.Version, "v") || rep.Kubernetes.Error != "" {
			t.Errorf("kubernetes: %+v", rep.Kubernetes)
		}
		if rep.Healthy || len(rep.ControlPlanes) != 3 || rep.Continue != "" {
			t.Fatalf("report: %+v", rep)
		}
		down, fresh, up := rep.ControlPlanes[0], rep.ControlPlanes[1], rep.ControlPlanes[2]
		if down.Name != "down" || down.Reachable || !strings.Contains(down.Error, "connection refused") || down.URL != closedURL {
			t.Errorf("unreachable coderd: %+v", down)
		}
		if fresh.Name != "fresh" || fresh.Reachable || !strings.Contains(fresh.Error, "no status.url") {
			t.Errorf("unreconciled control plane: %+v", fresh)
		}
		if up.Name != "up" || !up.Reachable || up.Version != info.Version || up.Error != "" || up.Phase != "Ready" {
			t.Errorf("reachable coderd: %+v (coderd reports %s)", up, info.Version)
		}
	})

	t.Run("healthy when everything answers", func(t *testing.T) {
		var rep HealthReport
		mustSucceed(t, callTool(t, s, "health", map[string]any{"namespace": "healthy"}, &rep))
		if !rep.Healthy || len(rep.ControlPlanes) != 1 || !rep.ControlPlanes[0].Reachable {
			t.Errorf("report: %+v", rep)
		}
	})

	t.Run("pages through control planes", func(t *testing.T) {
		var first, second HealthReport
		mustSucceed(t, callTool(t, s, "health", map[string]any{"limit": 2}, &first))
		if got := healthNames(first.ControlPlanes); got != "health/down health/fresh" || first.Continue == "" {
			t.Fatalf("first page %s, continue %q", got, first.Continue)
		}
		mustSucceed(t, callTool(t, s, "health", map[string]any{"limit": 2, "continue": first.Continue}, &second))
		if got := healthNames(second.ControlPlanes); got != "health/up healthy/up" || second.Continue != "" {
			t.Fatalf("second page %s, continue %q", got, second.Continue)
		}
	})

	t.Run("unknown namespace and missing RBAC are errors", func(t *testing.T) {
		mustFail(t, callTool(t, s, "health", map[string]any{"namespace": "no-such-ns"}, nil), `namespace "no-such-ns" does not exist`)
		nobody := h.connect(t, h.serviceAccountToken(t, "agents", "nobody"))
		mustFail(t, callTool(t, nobody, "health", map[string]any{"namespace": ns}, nil),
			`User "system:serviceaccount:agents:nobody" cannot list resource "codercontrolplanes" in API group "coder.com" in the namespace "health"`)
	})
}

func rowNames(rows []ControlPlaneRow) string {
	var s []string
	for _, r := range rows {
		s = append(s, r.Namespace+"/"+r.Name)
	}
	return strings.Join(s, " ")
}

func healthNames(rows []ControlPlaneHealth) string {
	var s []string
	for _, r := range rows {
		s = append(s, r.Namespace+"/"+r.Name)
	}
	return strings.Join(s, " ")
}
