package mcpserver

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Pod log caps: lines from the end of the log, and bytes in all.
const (
	defaultTailLines = 100
	maxTailLines     = 5000
	defaultLogBytes  = 16 << 10
	maxLogBytes      = 256 << 10
)

// PodLogsInput names a container and how much of its log to show.
type PodLogsInput struct {
	Namespace    string `json:"namespace" jsonschema:"Kubernetes namespace of the pod"`
	Pod          string `json:"pod" jsonschema:"pod name"`
	Container    string `json:"container,omitempty" jsonschema:"container name; required when the pod has several containers (the error lists them)"`
	TailLines    int64  `json:"tailLines,omitempty" jsonschema:"show only the last this many lines (default 100, at most 5000)"`
	LimitBytes   int64  `json:"limitBytes,omitempty" jsonschema:"show at most this many bytes of those lines (default 16384, at most 262144); the newest lines are cut first"`
	SinceSeconds int64  `json:"sinceSeconds,omitempty" jsonschema:"only lines written in the last this many seconds"`
	Previous     bool   `json:"previous,omitempty" jsonschema:"the log of the container's previous instance, the one that exited before the last restart (for crash loops)"`
}

// PodLogs is the log text of one container.
type PodLogs struct {
	Container  string `json:"container" jsonschema:"the container the log is from"`
	Previous   bool   `json:"previous,omitempty" jsonschema:"the log is from the previous instance of the container"`
	TailLines  int64  `json:"tailLines" jsonschema:"the tailLines applied"`
	LimitBytes int64  `json:"limitBytes" jsonschema:"the limitBytes applied"`
	Truncated  bool   `json:"truncated" jsonschema:"the lines asked for were longer than limitBytes and were cut; ask for fewer tailLines, a shorter sinceSeconds or a larger limitBytes"`
	Log        string `json:"log" jsonschema:"the log text"`
}

func (s *Server) logTools() []tool {
	return []tool{
		define(s, "get_pod_logs", toolMeta{
			Title:       "Get a pod's container log",
			Description: "Returns the last lines (default 100) of a container's log in a pod, such as a coderd pod of a control plane or a workspace pod, capped in bytes (default 16 KiB) and saying whether it was cut. Name the container when the pod has several; set previous to read the instance that crashed before the last restart, sinceSeconds for recent lines only.",
			ReadOnly:    true, Idempotent: true,
		}, getPodLogs),
	}
}

func getPodLogs(ctx context.Context, c *call, in PodLogsInput) (PodLogs, error) {
	if err := requireNamed(in.Namespace, "pod", in.Pod); err != nil {
		return PodLogs{}, err
	}
	tail, err := logCap("tailLines", in.TailLines, defaultTailLines, maxTailLines)
	if err != nil {
		return PodLogs{}, err
	}
	limit, err := logCap("limitBytes", in.LimitBytes, defaultLogBytes, maxLogBytes)
	if err != nil {
		return PodLogs{}, err
	}
	if in.SinceSeconds < 0 {
		return PodLogs{}, fmt.Errorf("sinceSeconds must be positive (or left out for the whole log), got %d", in.SinceSeconds)
	}
	var pod corev1.Pod
	if err := c.kube.Direct.Get(ctx, types.NamespacedName{Namespace: in.Namespace, Name: in.Pod}, &pod); err != nil {
		return PodLogs{}, fmt.Errorf("get pod %s/%s: %w", in.Namespace, in.Pod, err)
	}
	container, err := logContainer(&pod, in.Container)
	if err != nil {
		return PodLogs{}, err
	}
	if pod.Spec.NodeName == "" {
		return PodLogs{}, fmt.Errorf("pod %s/%s is not scheduled to a node yet (phase %s), so it has no logs; list_events with kind Pod and name %s says why", pod.Namespace, pod.Name, pod.Status.Phase, pod.Name)
	}
	// One byte more than shown tells whether there was more.
	ask := limit + 1
	opts := &corev1.PodLogOptions{Container: container, TailLines: &tail, LimitBytes: &ask, Previous: in.Previous}
	if in.SinceSeconds > 0 {
		opts.SinceSeconds = &in.SinceSeconds
	}
	stream, err := c.kube.Clientset.CoreV1().Pods(in.Namespace).GetLogs(in.Pod, opts).Stream(ctx)
	if err != nil {
		return PodLogs{}, fmt.Errorf("get the log of container %s in pod %s/%s: %w", container, in.Namespace, in.Pod, err)
	}
	defer stream.Close()
	// The kubelet honours limitBytes; the reader enforces it regardless.
	b, err := io.ReadAll(io.LimitReader(stream, limit+1))
	if err != nil {
		return PodLogs{}, fmt.Errorf("read the log of container %s in pod %s/%s: %w", container, in.Namespace, in.Pod, err)
	}
	out := PodLogs{Container: container, Previous: in.Previous, TailLines: tail, LimitBytes: limit}
	if int64(len(b)) > limit {
		b, out.Truncated = trimPartialRune(b[:limit]), true
	}
	out.Log = string(b)
	return out, nil
}

// logCap is v, def when v is zero, and at most max.
func logCap(name string, v, def, maxV int64) (int64, error) {
	switch {
	case v < 0:
		return 0, fmt.Errorf("%s must be positive (default %d, at most %d), got %d", name, def, maxV, v)
	case v == 0:
		return def, nil
	}
	return min(v, maxV), nil
}

// logContainer is the container whose log to read: the one named, or the
// pod's only container.
func logContainer(pod *corev1.Pod, name string) (string, error) {
	var names, initNames []string
	for _, ct := range pod.Spec.Containers {
		names = append(names, ct.Name)
	}
	for _, ct := range pod.Spec.InitContainers {
		initNames = append(initNames, ct.Name)
	}
	for _, ct := range pod.Spec.EphemeralContainers {
		initNames = append(initNames, ct.Name)
	}
	if name != "" {
		if slices.Contains(names, name) || slices.Contains(initNames, name) {
			return name, nil
		}
		return "", fmt.Errorf("pod %s/%s has no container %q; %s", pod.Namespace, pod.Name, name, containerChoice(names, initNames))
	}
	if len(names) == 1 {
		return names[0], nil
	}
	return "", fmt.Errorf("pod %s/%s has %d containers; pass container, %s", pod.Namespace, pod.Name, len(names), containerChoice(names, initNames))
}

func containerChoice(names, initNames []string) string {
	s := "one of: " + strings.Join(names, ", ")
	if len(initNames) > 0 {
		s += " (init and ephemeral containers: " + strings.Join(initNames, ", ") + ")"
	}
	return s
}

// trimPartialRune drops a character cut in two at the end of b.
func trimPartialRune(b []byte) []byte {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i]
			}
			break
		}
	}
	return b
}
