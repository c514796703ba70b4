package testenv

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
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

// TestControllerManagerServiceAccountCredentials runs kube-controller-manager
// as clusters run it: each controller calls kube-apiserver as its own
// ServiceAccount with its bootstrap role. A ValidatingAdmissionPolicy lets
// only the user a ConfigMap's label names delete it, so the garbage
// collector deletes an orphaned ConfigMap only as generic-garbage-collector
// and the namespace controller empties a deleted namespace only as
// namespace-controller.
func TestControllerManagerServiceAccountCredentials(t *testing.T) {
	k := NewKubeAPI(t, KubeAPIOptions{})
	ctx := t.Context()
	const deleter = "e2e.coder.com/deleter"

	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "only-the-named-deleter"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{
				ObjectSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: deleter, Operator: metav1.LabelSelectorOpExists}}},
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Delete},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
				}}},
			},
			Validations: []admissionregistrationv1.Validation{{
				Expression:        `request.userInfo.username == "system:serviceaccount:kube-system:" + oldObject.metadata.labels["` + deleter + `"]`,
				MessageExpression: `"only system:serviceaccount:kube-system:" + oldObject.metadata.labels["` + deleter + `"] + " may delete this ConfigMap, not " + request.userInfo.username`,
			}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        policy.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	vap := k.Clientset.AdmissionregistrationV1()
	if _, err := vap.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := vap.ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// labeled creates ConfigMap ns/name that only ServiceAccount
	// kube-system/by may delete ("": anyone).
	labeled := func(ns, name, by string, owners ...metav1.OwnerReference) *corev1.ConfigMap {
		t.Helper()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, OwnerReferences: owners}}
		if by != "" {
			cm.Labels = map[string]string{deleter: by}
		}
		cm, err := k.Clientset.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm
	}
	// kube-apiserver applies the policy once it has loaded it: then the
	// admin may not delete a ConfigMap labeled for the garbage collector.
	labeled("default", "probe", "generic-garbage-collector")
	WaitFor(t, 30*time.Second, func() error {
		err := k.Clientset.CoreV1().ConfigMaps("default").Delete(ctx, "probe", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "only system:serviceaccount:kube-system:generic-garbage-collector may delete this ConfigMap, not admin") {
			return fmt.Errorf("the admin's delete of default/probe: %v, want refused by the policy", err)
		}
		return nil
	})

	k.NewControllerManagerWith(t, ControllerManagerOptions{
		Controllers:               []string{"garbage-collector-controller", "namespace-controller"},
		ServiceAccountCredentials: true,
	})

	// The garbage collector: a ConfigMap whose owner is deleted.
	owner := labeled("default", "owner", "")
	labeled("default", "dependent", "generic-garbage-collector", metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID})
	if err := k.Clientset.CoreV1().ConfigMaps("default").Delete(ctx, owner.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The namespace controller: a namespace with a ConfigMap.
	ns, err := k.Clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "deleted-by-its-controller-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	labeled(ns.Name, "content", "namespace-controller")
	deleteNamespace(t, k, ns.Name)

	WaitFor(t, 60*time.Second, func() error {
		_, err := k.Clientset.CoreV1().ConfigMaps("default").Get(ctx, "dependent", metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("the orphaned ConfigMap default/dependent is still there: %v", err)
		}
		return nil
	})
	waitNamespaceGone(t, k, ns.Name, 60*time.Second)
	for _, sa := range []string{"generic-garbage-collector", "namespace-controller"} {
		if _, err := k.Clientset.CoreV1().ServiceAccounts("kube-system").Get(ctx, sa, metav1.GetOptions{}); err != nil {
			t.Errorf("ServiceAccount kube-system/%s, which kube-controller-manager creates for its controller: %v", sa, err)
		}
	}
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
