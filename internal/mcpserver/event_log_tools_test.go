package mcpserver

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestListEvents(t *testing.T) {
	h := newHarness(t, nil, nil)
	ctx := t.Context()
	now := time.Now().Truncate(time.Second)
	longMessage := "Deployment coder failed:\n" + strings.Repeat("image pull back-off ", 40)
	for _, e := range []struct {
		namespace, name, kind, object, typ, reason, message string
		ago                                                 time.Duration
		count                                               int32
	}{
		{"team", "ccp-reconciled", "CoderControlPlane", "coder", "Normal", "Reconciled", "control plane is up to date", 5 * time.Minute, 1},
		{"team", "ccp-failed", "CoderControlPlane", "coder", "Warning", "DeploymentFailed", longMessage, time.Minute, 3},
		{"team", "deploy-scaled", "Deployment", "coder", "Normal", "ScalingReplicaSet", "Scaled up replica set coder-7d9 to 1", 2 * time.Minute, 1},
		{"team", "ccp-other", "CoderControlPlane", "other", "Normal", "Reconciled", "control plane is up to date", 4 * time.Minute, 2},
		{"elsewhere", "ccp-elsewhere", "CoderControlPlane", "coder", "Warning", "DeploymentFailed", "not in team", 10 * time.Second, 1},
	} {
		if err := h.k.EnsureNamespace(ctx, e.namespace); err != nil {
			t.Fatal(err)
		}
		last := metav1.NewTime(now.Add(-e.ago))
		ev := &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: e.name, Namespace: e.namespace},
			InvolvedObject: corev1.ObjectReference{Kind: e.kind, Name: e.object, Namespace: e.namespace},
			Type:           e.typ, Reason: e.reason, Message: e.message, Count: e.count,
			FirstTimestamp: last, LastTimestamp: last, Source: corev1.EventSource{Component: "coder-k8s"},
		}
		if err := h.c.Create(ctx, ev); err != nil {
			t.Fatalf("create event %s: %v", e.name, err)
		}
	}
	// An event written through the events.k8s.io API has eventTime and a
	// series instead of lastTimestamp and count.
	series := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "pod-pulling", Namespace: "team"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "coder-7d9-abcde", Namespace: "team"},
		Type:           "Warning", Reason: "BackOff", Message: "Back-off pulling image", Action: "Pulling",
		EventTime:           metav1.NewMicroTime(now.Add(-10 * time.Minute)),
		Series:              &corev1.EventSeries{Count: 7, LastObservedTime: metav1.NewMicroTime(now.Add(-30 * time.Second))},
		ReportingController: "kubelet", ReportingInstance: "node-1",
	}
	if err := h.c.Create(ctx, series); err != nil {
		t.Fatalf("create event with a series: %v", err)
	}

	token := h.serviceAccountToken(t, "agents", "event-reader")
	h.grant(t, "agents", "event-reader", "team", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"list"}})
	s := h.connect(t, token)

	list := func(t *testing.T, args map[string]any) EventList {
		t.Helper()
		var out EventList
		if res := callTool(t, s, "list_events", args, &out); res.IsError {
			t.Fatalf("list_events %v: %s", args, resultText(res))
		}
		return out
	}
	reasons := func(l EventList) []string {
		var r []string
		for _, row := range l.Items {
			r = append(r, row.Object+" "+row.Reason)
		}
		return r
	}

	t.Run("newest first, one namespace, compact rows", func(t *testing.T) {
		out := list(t, map[string]any{"namespace": "team"})
		want := []string{
			"Pod/coder-7d9-abcde BackOff",
			"CoderControlPlane/coder DeploymentFailed",
			"Deployment/coder ScalingReplicaSet",
			"CoderControlPlane/other Reconciled",
			"CoderControlPlane/coder Reconciled",
		}
		if got := reasons(out); !slices.Equal(got, want) || out.Continue != "" {
			t.Fatalf("rows %q continue %q, want %q", got, out.Continue, want)
		}
		pod := out.Items[0]
		if pod.Count != 7 || pod.Type != "Warning" || pod.LastSeen != now.Add(-30*time.Second).UTC().Format(time.RFC3339) {
			t.Errorf("series event row %+v: want count 7 and lastSeen from the series", pod)
		}
		failed := out.Items[1]
		if failed.Count != 3 || failed.LastSeen != now.Add(-time.Minute).UTC().Format(time.RFC3339) {
			t.Errorf("row %+v", failed)
		}
		if len(failed.Message) > maxEventMessageBytes || !strings.HasSuffix(failed.Message, "…") ||
			!strings.HasPrefix(failed.Message, "Deployment coder failed: image pull back-off") || strings.Contains(failed.Message, "\n") {
			t.Errorf("long message not cut to one line of at most %d bytes: %q (%d bytes)", maxEventMessageBytes, failed.Message, len(failed.Message))
		}
	})

	t.Run("filter by object kind and name", func(t *testing.T) {
		out := list(t, map[string]any{"namespace": "team", "kind": "CoderControlPlane", "name": "coder"})
		if got, want := reasons(out), []string{"CoderControlPlane/coder DeploymentFailed", "CoderControlPlane/coder Reconciled"}; !slices.Equal(got, want) {
			t.Fatalf("rows %q, want %q", got, want)
		}
		out = list(t, map[string]any{"namespace": "team", "name": "coder"})
		if got, want := reasons(out), []string{"CoderControlPlane/coder DeploymentFailed", "Deployment/coder ScalingReplicaSet", "CoderControlPlane/coder Reconciled"}; !slices.Equal(got, want) {
			t.Fatalf("name only: rows %q, want %q", got, want)
		}
		out = list(t, map[string]any{"namespace": "team", "kind": "CoderControlPlane"})
		if len(out.Items) != 3 {
			t.Fatalf("kind only: rows %q, want the 3 CoderControlPlane events", reasons(out))
		}
	})

	t.Run("filter by type, spelled either way", func(t *testing.T) {
		for _, typ := range []string{"Warning", "warning"} {
			out := list(t, map[string]any{"namespace": "team", "type": typ})
			if got, want := reasons(out), []string{"Pod/coder-7d9-abcde BackOff", "CoderControlPlane/coder DeploymentFailed"}; !slices.Equal(got, want) {
				t.Fatalf("type %s: rows %q, want %q", typ, got, want)
			}
		}
		out := list(t, map[string]any{"namespace": "team", "type": "Normal", "kind": "CoderControlPlane", "name": "coder"})
		if got, want := reasons(out), []string{"CoderControlPlane/coder Reconciled"}; !slices.Equal(got, want) {
			t.Fatalf("rows %q, want %q", got, want)
		}
	})

	t.Run("pages with a continue token", func(t *testing.T) {
		all := reasons(list(t, map[string]any{"namespace": "team"}))
		var got []string
		cont := ""
		for pages := 0; ; pages++ {
			if pages > 3 {
				t.Fatalf("more than 3 pages of 2 for 5 events: %q", got)
			}
			args := map[string]any{"namespace": "team", "limit": 2}
			if cont != "" {
				args["continue"] = cont
			}
			out := list(t, args)
			if len(out.Items) > 2 {
				t.Fatalf("page of %d rows with limit 2", len(out.Items))
			}
			got = append(got, reasons(out)...)
			if cont = out.Continue; cont == "" {
				break
			}
		}
		if !slices.Equal(got, all) {
			t.Fatalf("pages gave %q, want %q", got, all)
		}
	})

	t.Run("nothing matches", func(t *testing.T) {
		out := list(t, map[string]any{"namespace": "team", "kind": "CoderControlPlane", "name": "missing"})
		if len(out.Items) != 0 || out.Continue != "" {
			t.Fatalf("rows %+v", out)
		}
	})

	for _, tc := range []struct {
		name string
		args map[string]any
		want string
	}{
		{"no namespace", map[string]any{"kind": "CoderControlPlane"}, `missing properties: ["namespace"]`},
		{"empty namespace", map[string]any{"namespace": ""}, "namespace is required"},
		{"unknown type", map[string]any{"namespace": "team", "type": "Error"}, `type "Error" is not an event type: use Normal, Warning`},
		{"bad continue token", map[string]any{"namespace": "team", "continue": "nonsense"}, "call it again without continue"},
	} {
		t.Run("bad input: "+tc.name, func(t *testing.T) {
			res := callTool(t, s, "list_events", tc.args, nil)
			if !res.IsError || !strings.Contains(resultText(res), tc.want) {
				t.Fatalf("isError %v: %s; want an error containing %q", res.IsError, resultText(res), tc.want)
			}
		})
	}

	t.Run("RBAC: list events is needed in that namespace", func(t *testing.T) {
		res := callTool(t, s, "list_events", map[string]any{"namespace": "elsewhere"}, nil)
		if !res.IsError || !strings.Contains(resultText(res), `events is forbidden: User "system:serviceaccount:agents:event-reader" cannot list resource "events" in API group "" in the namespace "elsewhere"`) {
			t.Fatalf("isError %v: %s", res.IsError, resultText(res))
		}
		other := h.connect(t, h.serviceAccountToken(t, "agents", "pod-reader"))
		h.grant(t, "agents", "pod-reader", "team", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "get"}})
		res = callTool(t, other, "list_events", map[string]any{"namespace": "team"}, nil)
		if !res.IsError || !strings.Contains(resultText(res), `events is forbidden: User "system:serviceaccount:agents:pod-reader" cannot list resource "events" in API group "" in the namespace "team"`) {
			t.Fatalf("isError %v: %s", res.IsError, resultText(res))
		}
	})
}

func TestGetPodLogs(t *testing.T) {
	h := newHarness(t, nil, nil)
	kubelet := newKubeletStandIn(t, h.cs, "node-1")
	kubelet.registerNode(t)
	now := time.Now()

	// coder-0: one container that restarted once; its log has 300 old
	// lines and 10 from the last minute.
	var current []kubeletLogLine
	for i := 1; i <= 300; i++ {
		at := now.Add(-2 * time.Hour)
		if i > 290 {
			at = now.Add(-time.Duration(301-i) * time.Second)
		}
		current = append(current, kubeletLogLine{at: at, stream: "stdout", text: fmt.Sprintf("line %03d", i)})
	}
	kubelet.setLog("containerd://coder-1", current)
	kubelet.setLog("containerd://coder-0", []kubeletLogLine{
		{at: now.Add(-time.Hour), stream: "stdout", text: "starting coderd"},
		{at: now.Add(-time.Hour), stream: "stderr", text: "panic: connect to postgres: connection refused"},
	})
	kubelet.setLog("containerd://dev-1", []kubeletLogLine{{at: now, stream: "stdout", text: "workspace agent started"}})
	kubelet.setLog("containerd://sidecar-1", []kubeletLogLine{{at: now, stream: "stdout", text: "sidecar ready ✓✓✓"}})

	running := func(name, id string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, Image: "busybox", ImageID: "docker.io/library/busybox@sha256:0", ContainerID: id, Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(now.Add(-time.Minute))}}}
	}
	coder := running("coder", "containerd://coder-1")
	coder.RestartCount = 1
	coder.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2, Reason: "Error", ContainerID: "containerd://coder-0"}}
	initDone := corev1.ContainerStatus{Name: "init", Image: "busybox", ImageID: "docker.io/library/busybox@sha256:0", ContainerID: "containerd://init-1",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", ContainerID: "containerd://init-1"}}}
	waiting := corev1.ContainerStatus{Name: "coder", Image: "coder:bad",
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}

	createPod(t, h, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "coder-0", Namespace: "team"},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "coder", Image: "coder",
			Env: []corev1.EnvVar{{Name: "CODER_PG_CONNECTION_URL", Value: "postgres://coder:hunter2@db/coder"}}}}},
	}, []corev1.ContainerStatus{coder}, nil)
	createPod(t, h, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "ws-1", Namespace: "team"},
		Spec: corev1.PodSpec{NodeName: "node-1",
			InitContainers: []corev1.Container{{Name: "init", Image: "busybox"}},
			Containers:     []corev1.Container{{Name: "dev", Image: "codercom/enterprise-base"}, {Name: "sidecar", Image: "busybox"}}},
	}, []corev1.ContainerStatus{running("dev", "containerd://dev-1"), running("sidecar", "containerd://sidecar-1")}, []corev1.ContainerStatus{initDone})
	createPod(t, h, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "starting", Namespace: "team"},
		Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "coder", Image: "coder:bad"}}},
	}, []corev1.ContainerStatus{waiting}, nil)
	createPod(t, h, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "unscheduled", Namespace: "team"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "coder", Image: "coder"}}},
	}, nil, nil)

	// The agent may read pods (to pick the container) and their logs, as
	// kubectl logs needs.
	token := h.serviceAccountToken(t, "agents", "log-reader")
	h.grant(t, "agents", "log-reader", "team", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods", "pods/log"}, Verbs: []string{"get"}})
	s := h.connect(t, token)

	logs := func(t *testing.T, args map[string]any) (PodLogs, url.Values) {
		t.Helper()
		before := kubelet.requestCount()
		var out PodLogs
		res := callTool(t, s, "get_pod_logs", args, &out)
		if res.IsError {
			t.Fatalf("get_pod_logs %v: %s", args, resultText(res))
		}
		if strings.Contains(resultText(res), "hunter2") {
			t.Fatalf("the result shows the pod's environment: %s", resultText(res))
		}
		reqs := kubelet.requestsSince(before)
		if len(reqs) != 1 {
			t.Fatalf("the kubelet got %d requests, want 1", len(reqs))
		}
		return out, reqs[0]
	}
	lines := func(from, to int) string {
		var b strings.Builder
		for i := from; i <= to; i++ {
			fmt.Fprintf(&b, "line %03d\n", i)
		}
		return b.String()
	}

	t.Run("defaults: the last 100 lines of the only container", func(t *testing.T) {
		out, q := logs(t, map[string]any{"namespace": "team", "pod": "coder-0"})
		if out.Container != "coder" || out.Truncated || out.TailLines != 100 || out.LimitBytes != 16<<10 || out.Log != lines(201, 300) {
			t.Fatalf("container %q truncated %v tailLines %d limitBytes %d, log %d bytes from %q",
				out.Container, out.Truncated, out.TailLines, out.LimitBytes, len(out.Log), firstLine(out.Log))
		}
		if q.Get("tailLines") != "100" || q.Get("limitBytes") != strconv.Itoa(16<<10+1) || q.Has("previous") || q.Has("sinceSeconds") || q.Has("follow") {
			t.Fatalf("kubelet query %v: want tailLines=100, limitBytes=16385 and no other option", q)
		}
	})

	t.Run("the result carries the log and nothing else", func(t *testing.T) {
		res := callTool(t, s, "get_pod_logs", map[string]any{"namespace": "team", "pod": "coder-0", "tailLines": 2}, nil)
		m, ok := res.StructuredContent.(map[string]any)
		if res.IsError || !ok {
			t.Fatalf("result %v: %s", res.IsError, resultText(res))
		}
		var keys []string
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if want := []string{"container", "limitBytes", "log", "tailLines", "truncated"}; !slices.Equal(keys, want) {
			t.Fatalf("structured content fields %q, want %q", keys, want)
		}
	})

	t.Run("tailLines", func(t *testing.T) {
		out, q := logs(t, map[string]any{"namespace": "team", "pod": "coder-0", "tailLines": 5})
		if out.Log != lines(296, 300) || out.Truncated || q.Get("tailLines") != "5" {
			t.Fatalf("log %q truncated %v, kubelet query %v", out.Log, out.Truncated, q)
		}
		out, q = logs(t, map[string]any{"namespace": "team", "pod": "coder-0", "tailLines": 100000})
		if out.TailLines != 5000 || q.Get("tailLines") != "5000" || out.Log != lines(1, 300) {
			t.Fatalf("tailLines above the cap: applied %d, kubelet query %v, %d bytes", out.TailLines, q, len(out.Log))
		}
	})

	t.Run("limitBytes cuts the log and says so", func(t *testing.T) {
		window := lines(201, 300)
		out, q := logs(t, map[string]any{"namespace": "team", "pod": "coder-0", "limitBytes": 50})
		if !out.Truncated || out.Log != window[:50] || q.Get("limitBytes") != "51" {
			t.Fatalf("truncated %v log %q, kubelet query %v", out.Truncated, out.Log, q)
		}
		exact := len(lines(296, 300))
		out, _ = logs(t, map[string]any{"namespace": "team", "pod": "coder-0", "tailLines": 5, "limitBytes": exact})
		if out.Truncated || out.Log != lines(296, 300) {
			t.Fatalf("a log of exactly limitBytes: truncated %v log %q", out.Truncated, out.Log)
		}
		out, _ = logs(t, map[string]any{"namespace": "team", "pod": "coder-0", "tailLines": 5, "limitBytes": exact - 1})
		if !out.Truncated || len(out.Log) != exact-1 {
			t.Fatalf("a log one byte over limitBytes: truncated %v, %d bytes", out.Truncated, len(out.Log))
		}
		out, q = logs(t, map[string]any{"namespace": "team", "pod": "coder-0", "limitBytes": 10 << 20})
		if out.LimitBytes != 256<<10 || q.Get("limitBytes") != strconv.Itoa(256<<10+1) || out.Truncated {
			t.Fatalf("limitBytes above the cap: applied %d, kubelet query %v", out.LimitBytes, q)
		}
	})

	t.Run("a cut never splits a character", func(t *testing.T) {
		// "sidecar ready " is 14 bytes; ✓ takes 3.
		out, _ := logs(t, map[string]any{"namespace": "team", "pod": "ws-1", "container": "sidecar", "limitBytes": 16})
		if !out.Truncated || out.Log != "sidecar ready " || !utf8.ValidString(out.Log) {
			t.Fatalf("truncated %v log %q", out.Truncated, out.Log)
		}
	})

	t.Run("sinceSeconds", func(t *testing.T) {
		out, q := logs(t, map[string]any{"namespace": "team", "pod": "coder-0", "sinceSeconds": 120})
		if out.Log != lines(291, 300) || q.Get("sinceSeconds") != "120" {
			t.Fatalf("log %q, kubelet query %v", out.Log, q)
		}
	})

	t.Run("previous: the instance before the restart", func(t *testing.T) {
		out, q := logs(t, map[string]any{"namespace": "team", "pod": "coder-0", "previous": true})
		if want := "starting coderd\npanic: connect to postgres: connection refused\n"; out.Log != want || !out.Previous || q.Get("previous") != "true" {
			t.Fatalf("log %q previous %v, kubelet query %v", out.Log, out.Previous, q)
		}
		res := callTool(t, s, "get_pod_logs", map[string]any{"namespace": "team", "pod": "ws-1", "container": "dev", "previous": true}, nil)
		if !res.IsError || !strings.Contains(resultText(res), `previous terminated container "dev" in pod "ws-1" not found`) {
			t.Fatalf("previous of a container that never restarted: isError %v: %s", res.IsError, resultText(res))
		}
	})

	t.Run("container selection", func(t *testing.T) {
		out, _ := logs(t, map[string]any{"namespace": "team", "pod": "ws-1", "container": "dev"})
		if out.Container != "dev" || out.Log != "workspace agent started\n" {
			t.Fatalf("container %q log %q", out.Container, out.Log)
		}
		out, _ = logs(t, map[string]any{"namespace": "team", "pod": "ws-1", "container": "init"})
		if out.Container != "init" {
			t.Fatalf("init container: %+v", out)
		}
		before := kubelet.requestCount()
		res := callTool(t, s, "get_pod_logs", map[string]any{"namespace": "team", "pod": "ws-1"}, nil)
		if text := resultText(res); !res.IsError || !strings.Contains(text, "pod team/ws-1 has 2 containers; pass container, one of: dev, sidecar (init and ephemeral containers: init)") {
			t.Fatalf("no container for a pod with several: isError %v: %s", res.IsError, text)
		}
		res = callTool(t, s, "get_pod_logs", map[string]any{"namespace": "team", "pod": "ws-1", "container": "web"}, nil)
		if text := resultText(res); !res.IsError || !strings.Contains(text, `pod team/ws-1 has no container "web"; one of: dev, sidecar`) {
			t.Fatalf("unknown container: isError %v: %s", res.IsError, text)
		}
		if n := kubelet.requestCount() - before; n != 0 {
			t.Fatalf("the kubelet was asked %d times for a container the tool should have refused", n)
		}
	})

	for _, tc := range []struct {
		name string
		args map[string]any
		want string
	}{
		{"no pod", map[string]any{"namespace": "team"}, `missing properties: ["pod"]`},
		{"empty pod", map[string]any{"namespace": "team", "pod": ""}, "pod is required"},
		{"empty namespace", map[string]any{"namespace": "", "pod": "coder-0"}, "namespace is required"},
		{"negative tailLines", map[string]any{"namespace": "team", "pod": "coder-0", "tailLines": -1}, "tailLines must be positive (default 100, at most 5000), got -1"},
		{"negative limitBytes", map[string]any{"namespace": "team", "pod": "coder-0", "limitBytes": -5}, "limitBytes must be positive"},
		{"negative sinceSeconds", map[string]any{"namespace": "team", "pod": "coder-0", "sinceSeconds": -5}, "sinceSeconds must be positive"},
		{"ill-typed argument", map[string]any{"namespace": "team", "pod": "coder-0", "tailLines": "ten"}, "The arguments must match this JSON schema"},
		{"missing pod", map[string]any{"namespace": "team", "pod": "nope"}, `pods "nope" not found (check the namespace and the name`},
		{"unscheduled pod", map[string]any{"namespace": "team", "pod": "unscheduled"}, "pod team/unscheduled is not scheduled to a node yet"},
		{"container not started", map[string]any{"namespace": "team", "pod": "starting"}, `container "coder" in pod "starting" is waiting to start: ContainerCreating`},
	} {
		t.Run("error: "+tc.name, func(t *testing.T) {
			res := callTool(t, s, "get_pod_logs", tc.args, nil)
			if !res.IsError || !strings.Contains(resultText(res), tc.want) {
				t.Fatalf("isError %v: %s; want an error containing %q", res.IsError, resultText(res), tc.want)
			}
		})
	}

	t.Run("RBAC: get pods/log is needed, get pods is not enough", func(t *testing.T) {
		token := h.serviceAccountToken(t, "agents", "pod-getter")
		h.grant(t, "agents", "pod-getter", "team", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}})
		before := kubelet.requestCount()
		res := callTool(t, h.connect(t, token), "get_pod_logs", map[string]any{"namespace": "team", "pod": "coder-0"}, nil)
		if !res.IsError || !strings.Contains(resultText(res), `pods "coder-0" is forbidden: User "system:serviceaccount:agents:pod-getter" cannot get resource "pods/log" in API group "" in the namespace "team"`) {
			t.Fatalf("isError %v: %s", res.IsError, resultText(res))
		}
		if strings.Contains(resultText(res), "line ") || kubelet.requestCount() != before {
			t.Fatalf("a denied call reached the kubelet: %s", resultText(res))
		}
		res = callTool(t, s, "get_pod_logs", map[string]any{"namespace": "elsewhere", "pod": "coder-0"}, nil)
		if !res.IsError || !strings.Contains(resultText(res), `User "system:serviceaccount:agents:log-reader" cannot get resource "pods" in API group "" in the namespace "elsewhere"`) {
			t.Fatalf("another namespace: isError %v: %s", res.IsError, resultText(res))
		}
	})
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// createPod creates pod (and the namespace's default ServiceAccount,
// which admission requires) and writes the container statuses a kubelet
// would report.
func createPod(t *testing.T, h *harness, pod *corev1.Pod, statuses, initStatuses []corev1.ContainerStatus) {
	t.Helper()
	ctx := t.Context()
	if err := h.k.EnsureNamespace(ctx, pod.Namespace); err != nil {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: pod.Namespace}}
	if err := h.c.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	created, err := h.cs.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	if statuses == nil {
		return
	}
	created.Status.Phase = corev1.PodRunning
	created.Status.ContainerStatuses = statuses
	created.Status.InitContainerStatuses = initStatuses
	if _, err := h.cs.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update status of pod %s: %v", pod.Name, err)
	}
}
