package testenv

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestControllerManagerNamespaceController proves the real namespace
// controller runs in the test stack: a deleted namespace stays Terminating
// (kube-apiserver alone only marks it) until kube-controller-manager
// deletes its content and removes the finalizer, both for a namespace
// deleted before it started and for one deleted while it runs.
func TestControllerManagerNamespaceController(t *testing.T) {
	k := NewKubeAPI(t, KubeAPIOptions{})
	ctx := t.Context()

	// Registered before NewControllerManager, so it runs after that
	// helper's cleanup: the process must be gone by the end of the test.
	var kcm *Process
	t.Cleanup(func() {
		if kcm == nil {
			return
		}
		if exited, _ := kcm.Exited(); !exited {
			t.Errorf("kube-controller-manager (pid %d) still runs after the test", kcm.cmd.Process.Pid)
			kcm.Stop(time.Second)
		}
	})

	// Without the namespace controller a deleted namespace keeps its
	// content and the kubernetes finalizer.
	before := createNamespaceWithConfigMap(t, k, "deleted-before-kcm")
	deleteNamespace(t, k, before)
	ns, err := k.Clientset.CoreV1().Namespaces().Get(ctx, before, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get namespace %s after delete: %v", before, err)
	}
	if ns.Status.Phase != corev1.NamespaceTerminating || !slices.Contains(ns.Spec.Finalizers, corev1.FinalizerKubernetes) {
		t.Fatalf("namespace %s after delete: phase %q, finalizers %v; want Terminating with %q",
			before, ns.Status.Phase, ns.Spec.Finalizers, corev1.FinalizerKubernetes)
	}

	start := time.Now()
	kcm = k.NewControllerManager(t, "namespace")
	t.Logf("kube-controller-manager ready in %s", time.Since(start).Round(time.Millisecond))
	if kcm.cmd.SysProcAttr == nil || kcm.cmd.SysProcAttr.Pdeathsig != syscall.SIGKILL {
		t.Errorf("kube-controller-manager does not die with the test process (Pdeathsig %v)", kcm.cmd.SysProcAttr)
	}

	after := createNamespaceWithConfigMap(t, k, "deleted-with-kcm")
	deleteNamespace(t, k, after)

	// The controller waits a fixed 5s (namespaceDeletionGracePeriod) after
	// each namespace event before it acts, so this takes about 5.5s.
	for _, name := range []string{before, after} {
		waitNamespaceGone(t, k, name, 60*time.Second)
		// kube-apiserver serves namespaced objects from etcd whether or not
		// their namespace exists: NotFound means the controller deleted it.
		_, err := k.Clientset.CoreV1().ConfigMaps(name).Get(ctx, "content", metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("configmap %s/content after its namespace went: err = %v, want NotFound", name, err)
		}
	}
	t.Logf("both namespaces deleted %s after kube-controller-manager started", time.Since(start).Round(time.Millisecond))
}

// Without the binary the error tells the user how to get it.
func TestControllerManagerMissingBinary(t *testing.T) {
	t.Setenv("CODER_K8S_BIN_DIR", t.TempDir())
	k := &KubeAPI{KubeconfigPath: "unused", Dir: t.TempDir()}
	_, err := k.StartControllerManager(context.Background(), "namespace")
	if err == nil || !strings.Contains(err.Error(), "make tools") || !strings.Contains(err.Error(), "kube-controller-manager") {
		t.Fatalf("error = %v, want one naming kube-controller-manager and `make tools`", err)
	}
}

func TestControllerChecksListed(t *testing.T) {
	for body, want := range map[string]bool{
		"[+]ping ok\nhealthz check passed\n":                                   false,
		"[+]namespace-controller ok\nhealthz check passed\n":                   true,
		"[+]ping ok\n[+]garbage-collector-controller ok\nhealthz check passed": true,
		"ok": false,
	} {
		if got := controllerChecksListed(body); got != want {
			t.Errorf("controllerChecksListed(%q) = %v, want %v", body, got, want)
		}
	}
}

// createNamespaceWithConfigMap creates a namespace named after prefix
// holding ConfigMap "content" and returns its name.
func createNamespaceWithConfigMap(t *testing.T, k *KubeAPI, prefix string) string {
	t.Helper()
	ctx := t.Context()
	ns, err := k.Clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "content", Namespace: ns.Name},
		Data:       map[string]string{"key": "value"},
	}
	if _, err := k.Clientset.CoreV1().ConfigMaps(ns.Name).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create configmap in %s: %v", ns.Name, err)
	}
	return ns.Name
}

func deleteNamespace(t *testing.T, k *KubeAPI, name string) {
	t.Helper()
	if err := k.Clientset.CoreV1().Namespaces().Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete namespace %s: %v", name, err)
	}
}

// waitNamespaceGone waits until namespace name no longer exists; on
// timeout it reports the namespace's phase, finalizers and conditions.
func waitNamespaceGone(t *testing.T, k *KubeAPI, name string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	for {
		ns, err := k.Clientset.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		select {
		case <-ctx.Done():
			if err != nil {
				t.Fatalf("namespace %s not deleted within %s: %v", name, timeout, err)
			}
			t.Fatalf("namespace %s not deleted within %s: phase %q, finalizers %v, conditions %+v",
				name, timeout, ns.Status.Phase, ns.Spec.Finalizers, ns.Status.Conditions)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
