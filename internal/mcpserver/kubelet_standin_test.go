package mcpserver

// The kubelet stand-in the pods/log tests (event_log_tools_test.go) read
// logs through: kube-apiserver proxies pods/log to a kubelet, and the
// mcpserver tests' stack runs none.

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// kubeletStandIn serves the one kubelet endpoint kube-apiserver calls for
// pods/log, because this test stack runs no kubelet. It follows the real
// kubelet's contract (pkg/kubelet/server getContainerLogs, the kubelet's
// validateContainerLogStatus and cri-client's ReadLogs in Kubernetes
// v1.36): GET /containerLogs/{namespace}/{pod}/{container} over HTTPS with
// the PodLogOptions query parameters kube-apiserver sends (tailLines,
// limitBytes, sinceSeconds, sinceTime, previous, timestamps, follow,
// stream); a 400 with a plain-text message when the container has no such
// log, which kube-apiserver passes on; tailLines picks the last lines
// first, sinceSeconds then skips older lines, and limitBytes cuts what is
// left, mid-line if need be. It knows pods as a kubelet does, from
// kube-apiserver: those bound to its node, and picks the container
// instance (current or previous) from the pod's status. Logs are held per
// container ID.
type kubeletStandIn struct {
	node string
	pods kubernetes.Interface
	srv  *httptest.Server

	mu       sync.Mutex
	logs     map[string][]kubeletLogLine
	requests []url.Values
}

// kubeletLogLine is one line of a container's log file.
type kubeletLogLine struct {
	at     time.Time
	stream string // stdout or stderr
	text   string
}

func newKubeletStandIn(t *testing.T, pods kubernetes.Interface, node string) *kubeletStandIn {
	k := &kubeletStandIn{node: node, pods: pods, logs: map[string][]kubeletLogLine{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", k.containerLogs)
	k.srv = httptest.NewTLSServer(mux)
	t.Cleanup(k.srv.Close)
	return k
}

// registerNode creates the Node with the kubelet's address and port in its
// status, as a kubelet registers itself.
func (k *kubeletStandIn) registerNode(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	host, portText, err := net.SplitHostPort(k.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(portText)
	node, err := k.pods.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: k.node}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node: %v", err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: host}}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(port)
	if _, err := k.pods.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update node status: %v", err)
	}
}

func (k *kubeletStandIn) setLog(containerID string, lines []kubeletLogLine) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.logs[containerID] = lines
}

func (k *kubeletStandIn) requestCount() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.requests)
}

func (k *kubeletStandIn) requestsSince(n int) []url.Values {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.requests[n:])
}

// kubeletLogOptions are the query parameters of /containerLogs, decoded as
// the kubelet decodes them into a v1 PodLogOptions.
type kubeletLogOptions struct {
	previous, timestamps      bool
	tailLines, limitBytes     *int64
	sinceSeconds              *int64
	sinceTime                 *time.Time
	stream                    string
	follow                    bool
	decodeErr, validationErrs bool
}

func decodeKubeletLogOptions(q url.Values) kubeletLogOptions {
	var o kubeletLogOptions
	// "tail" is the kubelet's older spelling of tailLines; "all" means no limit.
	if tail := q.Get("tail"); tail != "" {
		q.Set("tailLines", tail)
		if tail == "all" {
			q.Del("tailLines")
		}
	}
	boolean := func(name string, into *bool) {
		if v := q.Get(name); v != "" {
			b, err := strconv.ParseBool(v)
			o.decodeErr = o.decodeErr || err != nil
			*into = b
		}
	}
	integer := func(name string) *int64 {
		v := q.Get(name)
		if v == "" {
			return nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		o.decodeErr = o.decodeErr || err != nil
		return &n
	}
	boolean("previous", &o.previous)
	boolean("timestamps", &o.timestamps)
	boolean("follow", &o.follow)
	o.tailLines, o.limitBytes, o.sinceSeconds = integer("tailLines"), integer("limitBytes"), integer("sinceSeconds")
	if v := q.Get("sinceTime"); v != "" {
		ts, err := time.Parse(time.RFC3339, v)
		o.decodeErr = o.decodeErr || err != nil
		o.sinceTime = &ts
	}
	o.stream = q.Get("stream")
	// The kubelet's ValidatePodLogOptions.
	o.validationErrs = o.tailLines != nil && *o.tailLines < 0 ||
		o.limitBytes != nil && *o.limitBytes < 1 ||
		o.sinceSeconds != nil && (*o.sinceSeconds < 1 || o.sinceTime != nil) ||
		o.stream != "" && !slices.Contains([]string{"All", "Stdout", "Stderr"}, o.stream) ||
		o.stream != "" && o.stream != "All" && o.tailLines != nil
	return o
}

func (k *kubeletStandIn) containerLogs(w http.ResponseWriter, r *http.Request) {
	namespace, podName, container := r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("container")
	k.mu.Lock()
	k.requests = append(k.requests, r.URL.Query())
	k.mu.Unlock()

	o := decodeKubeletLogOptions(r.URL.Query())
	switch {
	case o.decodeErr:
		kubeletError(w, http.StatusBadRequest, `{"message": "Unable to decode query."}`)
		return
	case o.validationErrs:
		kubeletError(w, http.StatusUnprocessableEntity, `{"message": "Invalid request."}`)
		return
	}
	pod, err := k.pods.CoreV1().Pods(namespace).Get(r.Context(), podName, metav1.GetOptions{})
	if err != nil || pod.Spec.NodeName != k.node {
		kubeletError(w, http.StatusNotFound, fmt.Sprintf("pod %q does not exist", podName))
		return
	}
	if !kubeletHasContainer(pod, container) {
		kubeletError(w, http.StatusNotFound, fmt.Sprintf("container %q not found in pod %q", container, podName))
		return
	}
	id, err := kubeletContainerInstance(pod, container, o.previous)
	if err != nil {
		kubeletError(w, http.StatusBadRequest, err.Error())
		return
	}
	k.mu.Lock()
	lines := k.logs[id]
	k.mu.Unlock()

	if o.tailLines != nil {
		lines = lines[max(0, len(lines)-int(*o.tailLines)):]
	}
	var since time.Time
	switch {
	case o.sinceSeconds != nil:
		since = time.Now().Add(-time.Duration(*o.sinceSeconds) * time.Second)
	case o.sinceTime != nil:
		since = *o.sinceTime
	}
	remain := int64(-1)
	if o.limitBytes != nil {
		remain = *o.limitBytes
	}
	w.Header().Set("Content-Type", "text/plain")
	for _, l := range lines {
		if l.at.Before(since) || o.stream == "Stdout" && l.stream != "stdout" || o.stream == "Stderr" && l.stream != "stderr" {
			continue
		}
		b := []byte(l.text + "\n")
		if o.timestamps {
			b = append([]byte(l.at.UTC().Format(time.RFC3339Nano)+" "), b...)
		}
		if remain >= 0 && int64(len(b)) > remain {
			b = b[:remain]
		}
		_, _ = w.Write(b)
		if remain >= 0 {
			if remain -= int64(len(b)); remain == 0 {
				return
			}
		}
	}
}

func kubeletHasContainer(pod *corev1.Pod, name string) bool {
	for _, cs := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for _, c := range cs {
			if c.Name == name {
				return true
			}
		}
	}
	for _, c := range pod.Spec.EphemeralContainers {
		if c.Name == name {
			return true
		}
	}
	return false
}

// kubeletContainerInstance is the kubelet's validateContainerLogStatus:
// the ID of the container instance whose log to read, or the error the
// kubelet returns.
func kubeletContainerInstance(pod *corev1.Pod, container string, previous bool) (string, error) {
	var status *corev1.ContainerStatus
	for _, list := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses, pod.Status.EphemeralContainerStatuses} {
		for i := range list {
			if list[i].Name == container {
				status = &list[i]
			}
		}
	}
	if status == nil {
		return "", fmt.Errorf("container %q in pod %q is not available", container, pod.Name)
	}
	last := status.LastTerminationState
	switch state := status.State; {
	case previous:
		if last.Terminated == nil || last.Terminated.ContainerID == "" {
			return "", fmt.Errorf("previous terminated container %q in pod %q not found", container, pod.Name)
		}
		return last.Terminated.ContainerID, nil
	case state.Running != nil:
		return status.ContainerID, nil
	case state.Terminated != nil:
		if state.Terminated.ContainerID != "" {
			return state.Terminated.ContainerID, nil
		}
		if last.Terminated != nil && last.Terminated.ContainerID != "" {
			return last.Terminated.ContainerID, nil
		}
		return "", fmt.Errorf("container %q in pod %q is terminated", container, pod.Name)
	case last.Terminated != nil:
		if last.Terminated.ContainerID == "" {
			return "", fmt.Errorf("container %q in pod %q is terminated", container, pod.Name)
		}
		return last.Terminated.ContainerID, nil
	case state.Waiting != nil:
		return "", fmt.Errorf("container %q in pod %q is waiting to start: %v", container, pod.Name, state.Waiting.Reason)
	}
	return "", fmt.Errorf("container %q in pod %q is waiting to start - no logs yet", container, pod.Name)
}

// kubeletError answers as the kubelet's response.WriteError does: the
// status and the message as plain text.
func kubeletError(w http.ResponseWriter, status int, msg string) {
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg)
}
