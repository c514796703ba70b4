package mcpserver

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/coder/coder-k8s/internal/truncate"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// maxEventMessageBytes caps the message of one event row.
const maxEventMessageBytes = 300

// EventListInput filters the events of a namespace.
type EventListInput struct {
	Namespace string `json:"namespace" jsonschema:"Kubernetes namespace of the events (events are listed one namespace at a time)"`
	Kind      string `json:"kind,omitempty" jsonschema:"only events about objects of this kind, spelled as in the object (case-sensitive): CoderControlPlane, CoderProvisioner, CoderWorkspaceProxy, Deployment, Pod, ..."`
	Name      string `json:"name,omitempty" jsonschema:"only events about the object with this name"`
	Type      string `json:"type,omitempty" jsonschema:"Normal or Warning; empty means both"`
	Limit     int    `json:"limit,omitempty" jsonschema:"rows to return (default 20, at most 100)"`
	Continue  string `json:"continue,omitempty" jsonschema:"the continue token of the previous call, for the next (older) rows"`
}

// EventRow is one event in a list.
type EventRow struct {
	LastSeen string `json:"lastSeen" jsonschema:"when the event last happened (RFC 3339, UTC)"`
	Type     string `json:"type" jsonschema:"Normal or Warning"`
	Reason   string `json:"reason"`
	Object   string `json:"object" jsonschema:"<kind>/<name> of the object the event is about"`
	Message  string `json:"message" jsonschema:"what happened, cut to 300 bytes"`
	Count    int32  `json:"count" jsonschema:"how many times it happened"`
}

// EventList is a page of events, newest first.
type EventList struct {
	Items    []EventRow `json:"items"`
	Continue string     `json:"continue,omitempty" jsonschema:"pass to the next call for older rows; empty at the end"`
}

func (s *Server) eventTools() []tool {
	return []tool{
		define(s, "list_events", toolMeta{
			Title:       "List Kubernetes events",
			Description: "Lists the Kubernetes events of a namespace, newest first, a page at a time: when, Normal or Warning, reason, the object (kind/name) and the message. Filter by the object (kind CoderControlPlane, name coder) to see why a control plane, deployment or pod is not progressing, and by type Warning to see only problems.",
			ReadOnly:    true, Idempotent: true,
		}, listEvents),
	}
}

func listEvents(ctx context.Context, c *call, in EventListInput) (EventList, error) {
	if in.Namespace == "" {
		return EventList{}, fmt.Errorf("namespace is required: events are listed one namespace at a time")
	}
	eventType, err := eventTypeFilter(in.Type)
	if err != nil {
		return EventList{}, err
	}
	// kube-apiserver filters core events by these fields itself.
	selector := fields.Set{}
	if in.Kind != "" {
		selector["involvedObject.kind"] = in.Kind
	}
	if in.Name != "" {
		selector["involvedObject.name"] = in.Name
	}
	if eventType != "" {
		selector["type"] = eventType
	}
	opts := []client.ListOption{client.InNamespace(in.Namespace)}
	if len(selector) > 0 {
		opts = append(opts, client.MatchingFieldsSelector{Selector: selector.AsSelector()})
	}
	var list corev1.EventList
	if err := c.kube.Direct.List(ctx, &list, opts...); err != nil {
		return EventList{}, fmt.Errorf("list events in namespace %s: %w", in.Namespace, err)
	}
	if len(list.Items) == 0 && c.namespaceMissing(ctx, in.Namespace) {
		return EventList{}, errNoNamespace(in.Namespace)
	}
	sort.SliceStable(list.Items, func(i, j int) bool {
		a, b := &list.Items[i], &list.Items[j]
		if ta, tb := eventLastSeen(a), eventLastSeen(b); !ta.Equal(tb) {
			return ta.After(tb)
		}
		return a.Name < b.Name
	})
	items, next, err := page(list.Items, in.Limit, in.Continue)
	if err != nil {
		return EventList{}, err
	}
	out := EventList{Items: make([]EventRow, len(items)), Continue: next}
	for i := range items {
		e := &items[i]
		out.Items[i] = EventRow{
			LastSeen: eventLastSeen(e).UTC().Format(time.RFC3339),
			Type:     e.Type,
			Reason:   e.Reason,
			Object:   e.InvolvedObject.Kind + "/" + e.InvolvedObject.Name,
			Message:  truncate.String(strings.Join(strings.Fields(e.Message), " "), maxEventMessageBytes),
			Count:    eventCount(e),
		}
	}
	return out, nil
}

// eventTypeFilter is the canonical spelling of an event type filter.
func eventTypeFilter(t string) (string, error) {
	for _, v := range []string{corev1.EventTypeNormal, corev1.EventTypeWarning} {
		if strings.EqualFold(t, v) {
			return v, nil
		}
	}
	if t == "" {
		return "", nil
	}
	return "", fmt.Errorf("type %q is not an event type: use Normal, Warning, or leave it empty for both", t)
}

// eventLastSeen is when e last happened, whichever API wrote it: the core
// recorder sets lastTimestamp, the events.k8s.io one eventTime and series.
// The creation time stands in only when neither did.
func eventLastSeen(e *corev1.Event) time.Time {
	var t time.Time
	for _, c := range []time.Time{e.LastTimestamp.Time, e.EventTime.Time} {
		if c.After(t) {
			t = c
		}
	}
	if e.Series != nil && e.Series.LastObservedTime.After(t) {
		t = e.Series.LastObservedTime.Time
	}
	if t.IsZero() {
		return e.CreationTimestamp.Time
	}
	return t
}

func eventCount(e *corev1.Event) int32 {
	n := e.Count
	if e.Series != nil && e.Series.Count > n {
		n = e.Series.Count
	}
	return max(n, 1)
}
