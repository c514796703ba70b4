package controllertest

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/dependent"
	"github.com/coder/coder-k8s/internal/controller/reconcile"
)

// WaitTimeout bounds how long the dependent kinds' tests wait for the
// reconciler.
const WaitTimeout = 30 * time.Second

// Dependent is a Harness running the reconciler of a dependent kind
// (package dependent), whose objects are *T.
type Dependent[T any, O interface {
	*T
	reconcile.Object
}] struct {
	*Harness
}

// NewDependent runs the reconciler setup registers, given a
// dependent.Base on the harness's manager (5 s per call to coderd, the
// default image, cleanupTimeout), for kind in a namespace named after
// nsPrefix.
func NewDependent[T any, O interface {
	*T
	reconcile.Object
}](t *testing.T, kind, nsPrefix string, cleanupTimeout time.Duration, setup func(ctrl.Manager, dependent.Base) error) *Dependent[T, O] {
	t.Helper()
	return &Dependent[T, O]{NewHarness(t, kind, nsPrefix, func(mgr ctrl.Manager, c client.Client, rec events.EventRecorder) error {
		return setup(mgr, dependent.Base{
			Client:         c,
			APIReader:      mgr.GetAPIReader(),
			Scheme:         mgr.GetScheme(),
			Recorder:       rec,
			CoderTimeout:   5 * time.Second,
			DefaultImage:   coderv1alpha1.DefaultImage,
			CleanupTimeout: cleanupTimeout,
		})
	})}
}

// Get reads the named object of the kind.
func (h *Dependent[T, O]) Get(name string) O {
	h.T.Helper()
	obj := O(new(T))
	h.Object(name, obj)
	return obj
}

// Reconciles returns how often the kind's controller (named after the
// kind in lower case) has reconciled in this process.
func (h *Dependent[T, O]) Reconciles() float64 {
	h.T.Helper()
	return Reconciles(h.T, strings.ToLower(h.kind))
}

// WaitDeleted waits until obj is gone from the API server.
func (h *Dependent[T, O]) WaitDeleted(obj client.Object, what string) {
	h.T.Helper()
	Eventually(h.T, WaitTimeout, what, func() (bool, string) {
		err := h.C.Get(h.T.Context(), client.ObjectKeyFromObject(obj), O(new(T)))
		return apierrors.IsNotFound(err), "still present"
	})
}

// Condition is the condition of obj of that type, nil when it has none.
func Condition(obj reconcile.Object, typ string) *metav1.Condition {
	return apimeta.FindStatusCondition(obj.GetConditions(), typ)
}

// Describe renders obj's phase and conditions for a failure message.
func Describe(obj reconcile.Object) string {
	return DescribeConditions(obj.GetPhase(), obj.GetConditions())
}

// CheckMissingControlPlane checks that obj, just created referencing the
// control plane "coder" that does not exist yet, says so (condition,
// phase Pending and one Warning event), and recovers by itself once
// createControlPlane has created it with working access, without anyone
// touching obj: its credentials ready and its workload provisioning.
func (h *Dependent[T, O]) CheckMissingControlPlane(obj O, createControlPlane func()) {
	h.T.Helper()
	t, name := h.T, obj.GetName()
	Eventually(t, WaitTimeout, "ControlPlaneNotFound reported", func() (bool, string) {
		obj = h.Get(name)
		c := Condition(obj, coderv1alpha1.ConditionControlPlaneReady)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == coderv1alpha1.ReasonControlPlaneNotFound, Describe(obj)
	})
	if obj.GetPhase() != coderv1alpha1.PhasePending {
		t.Errorf("phase = %s, want Pending", obj.GetPhase())
	}
	Eventually(t, WaitTimeout, "Warning event recorded in the API", func() (bool, string) {
		return len(h.APIEvents(name, corev1.EventTypeWarning, coderv1alpha1.ReasonControlPlaneNotFound)) == 1, "no event yet"
	})
	if n := h.Recorder.Count(name, corev1.EventTypeWarning, coderv1alpha1.ReasonControlPlaneNotFound); n != 1 {
		t.Errorf("ControlPlaneNotFound events emitted = %d, want 1", n)
	}
	generation := obj.GetGeneration()

	createControlPlane()
	Eventually(t, WaitTimeout, "recovered once the control plane exists", func() (bool, string) {
		obj = h.Get(name)
		c := Condition(obj, coderv1alpha1.ConditionCredentialsReady)
		return Condition(obj, coderv1alpha1.ConditionControlPlaneReady).Status == metav1.ConditionTrue &&
			c != nil && c.Status == metav1.ConditionTrue && obj.GetPhase() == coderv1alpha1.PhaseProvisioning, Describe(obj)
	})
	if obj.GetGeneration() != generation {
		t.Errorf("the %s's spec changed (generation %d -> %d); recovery must come from the control plane watch", h.kind, generation, obj.GetGeneration())
	}
}

// CheckUnsupported checks obj, just created against an open-source
// coderd, which lacks the kind's feature (start is Reconciles before):
// FeatureSupported=False with Coder's own message and phase Unsupported,
// no finalizer (nothing was created in Coder), one Warning event, and no
// hot loop. It returns obj as the reconciler left it.
func (h *Dependent[T, O]) CheckUnsupported(obj O, start float64) O {
	h.T.Helper()
	t, name := h.T, obj.GetName()
	Eventually(t, WaitTimeout, "FeatureSupported=False", func() (bool, string) {
		obj = h.Get(name)
		c := Condition(obj, coderv1alpha1.ConditionFeatureSupported)
		return c != nil && c.Status == metav1.ConditionFalse, Describe(obj)
	})
	c := Condition(obj, coderv1alpha1.ConditionFeatureSupported)
	if c.Reason != coderv1alpha1.ReasonNotSupported || !strings.Contains(c.Message, "Route not found.") {
		t.Errorf("FeatureSupported = %s %q, want NotSupported with coderd's message (Route not found.)", c.Reason, c.Message)
	}
	if obj.GetPhase() != coderv1alpha1.PhaseUnsupported {
		t.Errorf("phase = %s, want Unsupported", obj.GetPhase())
	}
	if len(obj.GetFinalizers()) != 0 {
		t.Errorf("finalizers = %v, want none: nothing was created in Coder", obj.GetFinalizers())
	}
	Eventually(t, WaitTimeout, "Warning event recorded in the API", func() (bool, string) {
		return len(h.APIEvents(name, corev1.EventTypeWarning, coderv1alpha1.ReasonNotSupported)) == 1, "no event yet"
	})
	if ev := h.APIEvents(name, corev1.EventTypeWarning, coderv1alpha1.ReasonNotSupported)[0]; !strings.Contains(ev.Note, "Route not found.") {
		t.Errorf("event note = %q, want coderd's message", ev.Note)
	}

	// No hot loop: the object stays put while the manager runs.
	rv := obj.GetResourceVersion()
	settled := h.Reconciles()
	time.Sleep(5 * time.Second)
	if got := h.Get(name).GetResourceVersion(); got != rv {
		t.Errorf("resourceVersion changed %s -> %s while nothing changed", rv, got)
	}
	if got := h.Reconciles(); got != settled || got-start > 3 {
		t.Errorf("reconciles: %v before settling, %v after 5s idle (started at %v): want no further reconciles and at most 3 in all", settled, got, start)
	}
	if n := h.Recorder.Count(name, corev1.EventTypeWarning, coderv1alpha1.ReasonNotSupported); n != 1 {
		t.Errorf("NotSupported events emitted = %d, want exactly 1", n)
	}
	return obj
}

// CheckIdleReconcile touches child, a Secret the object owns (a change
// of an owned child triggers a reconcile), and checks that the reconcile
// it triggers, with nothing to do, writes nothing. settled, when not nil,
// runs once earlier work has settled, before the touch.
func (h *Dependent[T, O]) CheckIdleReconcile(child *corev1.Secret, settled func()) {
	h.T.Helper()
	t := h.T
	Settle(t, "reconciles", h.Reconciles)
	h.Writes.Reset()
	before := h.Reconciles()
	if settled != nil {
		settled()
	}
	child.Labels["test.coder.com/touch"] = "1"
	if err := h.C.Update(t.Context(), child); err != nil {
		t.Fatal(err)
	}
	Eventually(t, WaitTimeout, "a reconcile after touching the Secret", func() (bool, string) {
		return h.Reconciles() > before, "no reconcile yet"
	})
	Settle(t, "reconciles", h.Reconciles)
	if n, log := h.Writes.Written(); n != 0 {
		t.Errorf("a no-op reconcile made %d writes: %v", n, log)
	}
}

// CheckRestricted checks that pod's one container runs with the
// restricted security defaults of package workload.
func CheckRestricted(t *testing.T, pod corev1.PodSpec) {
	t.Helper()
	sc := pod.Containers[0].SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("container security context = %+v, want the restricted default", sc)
	}
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context = %+v, want non-root with RuntimeDefault seccomp", psc)
	}
}

// DeploymentWant is what CheckDeployment expects of the Deployment of a
// dependent kind's object.
type DeploymentWant struct {
	// Kind is the owner's kind, for messages.
	Kind string
	// Secret is the credential the workload runs with, which must appear
	// nowhere in the Deployment; SecretWhat says what it is, for
	// messages.
	Secret, SecretWhat string
	// Image and Command (with the arguments) are what the one container
	// runs.
	Image, Command string
	// SecretEnv is the environment variable that takes the credential
	// from key SecretKey of Secret SecretName.
	SecretEnv, SecretName, SecretKey string
	// HashAnnotation is the pod template's annotation holding the
	// credential's hash, which rolls the pods when it changes.
	HashAnnotation string
}

// CheckDeployment checks what the Deployments of the dependent kinds
// have in common: dep is controlled by owner, holds no credential
// itself, and runs one container with the image and command, whose
// want.SecretEnv refers to the credential's Secret, with the restricted
// security defaults (CheckRestricted) and the credential's hash on the
// pod template. It returns the pod spec and the container's environment
// by name, for the kind's own checks.
func CheckDeployment(t *testing.T, dep *appsv1.Deployment, owner metav1.Object, want DeploymentWant) (corev1.PodSpec, map[string]corev1.EnvVar) {
	t.Helper()
	if !metav1.IsControlledBy(dep, owner) {
		t.Errorf("Deployment not controlled by the %s: %+v", want.Kind, dep.OwnerReferences)
	}
	raw, _ := json.Marshal(dep)
	if strings.Contains(string(raw), want.Secret) {
		t.Errorf("the Deployment contains the %s itself", want.SecretWhat)
	}
	pod := dep.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("containers = %d, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if c.Image != want.Image {
		t.Errorf("image = %q, want %q", c.Image, want.Image)
	}
	if got := strings.Join(append(c.Command, c.Args...), " "); got != want.Command {
		t.Errorf("command = %q, want %s", got, want.Command)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	ref := env[want.SecretEnv].ValueFrom
	if env[want.SecretEnv].Value != "" || ref == nil || ref.SecretKeyRef == nil ||
		ref.SecretKeyRef.Name != want.SecretName || ref.SecretKeyRef.Key != want.SecretKey {
		t.Errorf("%s = %+v, want a secretKeyRef to %s/%s", want.SecretEnv, env[want.SecretEnv], want.SecretName, want.SecretKey)
	}
	CheckRestricted(t, pod)
	if dep.Spec.Template.Annotations[want.HashAnnotation] == "" {
		t.Errorf("pod template lacks %s", want.HashAnnotation)
	}
	return pod, env
}
