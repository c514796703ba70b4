package storage

import (
	"context"
	"fmt"
	"sort"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

// Why a workspace's agent is not ready, in Kubernetes terms: the pods of a
// workspace (labelled com.coder.workspace.id, as Coder's kubernetes
// template example labels them) in the namespaces its control plane's
// workspace RBAC covers, their waiting or terminated containers, an
// unschedulable pod, and the latest Warning event of each.
//
// Only a GET (and MCP, which GETs) looks: a LIST or watch serves
// coderd's view alone, so it costs Kubernetes nothing per workspace, and
// the watch cache never holds what one caller may see and another may
// not. And only for namespaces where the caller may list pods and events
// (SubjectAccessReviews for the request's user): coder-k8s reads them
// with its own access and shows nothing its caller could not read.

// The operator reads pods and events of the workspace namespaces for the
// callers who may read them.
// +kubebuilder:rbac:groups="",resources=pods;events,verbs=get;list

// LabelWorkspaceID is the pod label naming the Coder workspace ID.
const LabelWorkspaceID = "com.coder.workspace.id"

// maxPodsShown bounds the pods a message describes.
const maxPodsShown = 3

// podDiagnosis describes why the pods of workspace id do not run, for the
// request's caller: one sentence per pod with a problem, "" when there is
// none or the caller may read none of the namespaces.
func podDiagnosis(ctx context.Context, kube SecretReader, namespaces []string, id string) (string, error) {
	if kube == nil || id == "" {
		return "", nil
	}
	var parts []string
	for _, ns := range namespaces {
		may, err := callerMay(ctx, kube, ns, "pods", "list", "")
		if err != nil {
			return strings.Join(parts, "; "), err
		}
		if !may {
			continue
		}
		if may, err = callerMay(ctx, kube, ns, "events", "list", ""); err != nil {
			return strings.Join(parts, "; "), err
		}
		var pods corev1.PodList
		if err := kube.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{LabelWorkspaceID: id}); err != nil {
			return strings.Join(parts, "; "), fmt.Errorf("list the pods of workspace %s in namespace %s: %w", id, ns, err)
		}
		sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
		for i := range pods.Items {
			if len(parts) == maxPodsShown {
				return strings.Join(parts, "; "), nil
			}
			p := &pods.Items[i]
			problem := PodProblems(p)
			if may {
				ev, err := latestWarning(ctx, kube, p)
				if err != nil {
					return strings.Join(parts, "; "), err
				}
				if ev != "" {
					problem = append(problem, "latest warning event "+ev)
				}
			}
			if len(problem) > 0 {
				parts = append(parts, fmt.Sprintf("pod %s/%s (%s): %s", p.Namespace, p.Name, p.Status.Phase, strings.Join(problem, ", ")))
			}
		}
	}
	return strings.Join(parts, "; "), nil
}

// PodProblems says what keeps p from running: a container waiting or
// terminated with a reason, or a pod the scheduler cannot place (MCP's
// diagnose_workspace shows the same).
func PodProblems(p *corev1.Pod) []string {
	var out []string
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			out = append(out, fmt.Sprintf("not scheduled: %s: %s", c.Reason, c.Message))
		}
	}
	statuses := append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...)
	for _, s := range statuses {
		switch {
		case s.State.Waiting != nil && s.State.Waiting.Reason != "" && s.State.Waiting.Reason != "ContainerCreating" && s.State.Waiting.Reason != "PodInitializing":
			out = append(out, fmt.Sprintf("container %s waiting: %s", s.Name, withMessage(s.State.Waiting.Reason, s.State.Waiting.Message)))
		case s.State.Terminated != nil && s.State.Terminated.ExitCode != 0:
			out = append(out, fmt.Sprintf("container %s terminated: %s (exit code %d)", s.Name, withMessage(s.State.Terminated.Reason, s.State.Terminated.Message), s.State.Terminated.ExitCode))
		}
	}
	return out
}

func withMessage(reason, message string) string {
	if message == "" {
		return reason
	}
	return reason + ": " + message
}

// latestWarning is the latest Warning event of pod p ("reason: message"),
// "" when it has none.
func latestWarning(ctx context.Context, kube SecretReader, p *corev1.Pod) (string, error) {
	var events corev1.EventList
	sel := fields.SelectorFromSet(fields.Set{"involvedObject.kind": "Pod", "involvedObject.name": p.Name, "involvedObject.uid": string(p.UID), "type": corev1.EventTypeWarning})
	if err := kube.List(ctx, &events, client.InNamespace(p.Namespace), client.MatchingFieldsSelector{Selector: sel}); err != nil {
		return "", fmt.Errorf("list the events of pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	var latest *corev1.Event
	var at metav1.Time
	for i := range events.Items {
		e := &events.Items[i]
		t := e.LastTimestamp
		if t.IsZero() {
			t = metav1.NewTime(e.EventTime.Time)
		}
		if latest == nil || at.Before(&t) {
			latest, at = e, t
		}
	}
	if latest == nil {
		return "", nil
	}
	return withMessage(latest.Reason, strings.TrimSpace(latest.Message)), nil
}

// callerMay asks kube-apiserver whether the request's user may do verb on
// resource (core group) in namespace: on the object called name, or on
// any ("").
func callerMay(ctx context.Context, kube SecretReader, namespace, resource, verb, name string) (bool, error) {
	u, ok := genericapirequest.UserFrom(ctx)
	if !ok {
		return false, fmt.Errorf("the request has no user")
	}
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.GetExtra() {
		extra[k] = v
	}
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: u.GetName(), Groups: u.GetGroups(), UID: u.GetUID(), Extra: extra,
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: verb, Resource: resource, Name: name},
	}}
	if err := kube.Create(ctx, sar); err != nil {
		return false, fmt.Errorf("ask kube-apiserver whether %s may %s %s %s in namespace %s: %w", u.GetName(), verb, resource, name, namespace, err)
	}
	return sar.Status.Allowed, nil
}

// withPods adds what the workspace's pods say to a Ready condition that
// its agents keep False, on a copy of ws (ws may be the watch cache's).
// A failure to look is logged, never the request's error: the
// workspace is still what coderd says.
func (s *WorkspaceStorage) withPods(ctx context.Context, ws *aggv1.CoderWorkspace) *aggv1.CoderWorkspace {
	c := meta.FindStatusCondition(ws.Status.Conditions, aggv1.ConditionReady)
	if c == nil || c.Status != metav1.ConditionFalse || !strings.HasPrefix(c.Reason, "Agent") {
		return ws
	}
	t, _, err := s.lookup(ctx, ws.Name)
	if err != nil {
		return ws
	}
	msg, err := podDiagnosis(ctx, s.kube, t.WorkspaceNamespaces, ws.Status.ID)
	if err != nil {
		s.log.V(1).Info("could not describe a workspace's pods", "workspace", ws.Name, "namespace", ws.Namespace, "error", err.Error())
	}
	if msg == "" {
		return ws
	}
	out := ws.DeepCopy()
	for i := range out.Status.Conditions {
		if out.Status.Conditions[i].Type == aggv1.ConditionReady {
			out.Status.Conditions[i].Message += "; " + msg
		}
	}
	return out
}
