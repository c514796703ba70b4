package provisioner_test

import (
	"net/http"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/controllertest"
	"github.com/coder/coder-k8s/internal/controller/provisioner"
	"github.com/coder/coder-k8s/internal/testenv"
)

const waitTimeout = controllertest.WaitTimeout

// TestProvisionerLifecycle drives a CoderProvisioner through its life
// against a coderd entitled to external provisioner daemons (the fake
// following coderd's contract): key issued and stored, Deployment, status,
// no churn, rotation on a tag change and on an organization change, and
// revocation on deletion.
func TestProvisionerLifecycle(t *testing.T) {
	h := newHarness(t, 0)
	ctx := t.Context()
	const token = "operator-session-token"
	fake := newFakeCoderd(t, token, "coder", "other")
	h.CreateControlPlane("coder", fake.URL.String(), token)

	p := &coderv1alpha1.CoderProvisioner{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.NS, Name: "eu"},
		Spec: coderv1alpha1.CoderProvisionerSpec{
			ControlPlaneRef: coderv1alpha1.ControlPlaneReference{Name: "coder"},
			Tags:            map[string]string{"region": "eu"},
			PodSpec: coderv1alpha1.PodSpec{
				Replicas: ptr.To(int32(2)),
				Env:      []corev1.EnvVar{{Name: "CODER_VERBOSE", Value: "true"}},
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("250m"),
				}},
				NodeSelector:     map[string]string{"pool": "builders"},
				ImagePullSecrets: []corev1.LocalObjectReference{{Name: "registry"}},
			},
		},
	}
	if err := h.C.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	keyName := h.NS + "-eu"
	secretName := "eu-provisioner-key"

	// Issued: key in Coder, Secret, Deployment, status.
	controllertest.Eventually(t, waitTimeout, "provisioner ready", func() (bool, string) {
		p = h.Get("eu")
		c := controllertest.Condition(p, coderv1alpha1.ConditionAvailable)
		return p.Status.Phase == coderv1alpha1.PhaseProvisioning && c != nil && c.Reason == coderv1alpha1.ReasonReplicasNotReady, controllertest.Describe(p)
	})
	for _, ct := range []string{coderv1alpha1.ConditionControlPlaneReady, coderv1alpha1.ConditionFeatureSupported, coderv1alpha1.ConditionCredentialsReady} {
		c := controllertest.Condition(p, ct)
		if c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != p.Generation {
			t.Errorf("condition %s = %+v, want True at generation %d", ct, c, p.Generation)
		}
	}
	if c := controllertest.Condition(p, coderv1alpha1.ConditionAvailable); c.Status != metav1.ConditionFalse || c.Message != "0/2 replicas ready" {
		t.Errorf("Available = %+v, want False with 0/2 replicas ready (no kubelet here)", c)
	}
	if p.Status.ObservedGeneration != p.Generation {
		t.Errorf("observedGeneration = %d, want %d", p.Status.ObservedGeneration, p.Generation)
	}
	if p.Status.KeyName != keyName || p.Status.KeySecretRef == nil || *p.Status.KeySecretRef != (coderv1alpha1.SecretKeyReference{Name: secretName, Key: "key"}) {
		t.Errorf("status key = %q %+v, want %q in %s/key", p.Status.KeyName, p.Status.KeySecretRef, keyName, secretName)
	}
	if p.Status.OrganizationID != fake.orgID("coder").String() {
		t.Errorf("status.organizationID = %q, want %s", p.Status.OrganizationID, fake.orgID("coder"))
	}
	if !slices.Contains(p.Finalizers, provisioner.Finalizer) {
		t.Errorf("finalizers = %v, want %s", p.Finalizers, provisioner.Finalizer)
	}
	keys := fake.keysIn("coder")
	issued, ok := keys[keyName]
	if len(keys) != 1 || !ok {
		t.Fatalf("keys in Coder = %v, want only %q", keys, keyName)
	}
	if got := map[string]string(issued.key.Tags); len(got) != 1 || got["region"] != "eu" {
		t.Errorf("key tags = %v, want region=eu", got)
	}
	secret := h.Secret(secretName)
	if string(secret.Data["key"]) != issued.secret {
		t.Errorf("Secret %s holds %q, want the issued key", secretName, secret.Data["key"])
	}
	if !metav1.IsControlledBy(secret, p) {
		t.Errorf("Secret %s is not controlled by the CoderProvisioner: %+v", secretName, secret.OwnerReferences)
	}
	dep := h.Deployment("eu-provisioner")
	checkDeployment(t, dep, p, fake.URL.String(), secretName, issued.secret)
	controllertest.CheckCached(t, secret, dep)
	if n := h.Recorder.Count("eu", corev1.EventTypeNormal, provisioner.EventKeyIssued); n != 1 {
		t.Errorf("KeyIssued events = %d, want 1", n)
	}
	if w := h.Recorder.Warnings("eu"); len(w) != 0 {
		t.Errorf("Warning events on the happy path: %v", w)
	}

	// No churn: a reconcile with nothing to do writes nothing and asks
	// coderd for nothing new.
	depRV, crRV := dep.ResourceVersion, p.ResourceVersion
	var creates int
	h.CheckIdleReconcile(secret, func() {
		creates = fake.Count(http.MethodPost, "/api/v2/organizations/"+fake.orgID("coder").String()+"/provisionerkeys")
	})
	if got := h.Deployment("eu-provisioner").ResourceVersion; got != depRV {
		t.Errorf("Deployment rewritten by a no-op reconcile: resourceVersion %s -> %s", depRV, got)
	}
	if got := h.Get("eu").ResourceVersion; got != crRV {
		t.Errorf("CoderProvisioner rewritten by a no-op reconcile: resourceVersion %s -> %s", crRV, got)
	}
	if got := fake.Count(http.MethodPost, "/api/v2/organizations/"+fake.orgID("coder").String()+"/provisionerkeys"); got != creates {
		t.Errorf("key created again by a no-op reconcile (%d -> %d creations)", creates, got)
	}

	// A tag change rotates the key: old revoked, new issued with the new
	// tags, Secret updated, pods rolled.
	oldHash := dep.Spec.Template.Annotations[provisioner.AnnotationKeyHash]
	p = h.Get("eu")
	p.Spec.Tags = map[string]string{"region": "eu", "gpu": "true"}
	if err := h.C.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	controllertest.Eventually(t, waitTimeout, "key rotated for the new tags", func() (bool, string) {
		k, ok := fake.keysIn("coder")[keyName]
		return ok && k.key.ID != issued.key.ID && k.key.Tags["gpu"] == "true", "key still the old one"
	})
	rotated := fake.keysIn("coder")[keyName]
	if n := len(fake.keysIn("coder")); n != 1 {
		t.Errorf("keys in Coder after rotation = %d, want 1 (the old one revoked)", n)
	}
	if deletes := fake.Count(http.MethodDelete, "/api/v2/organizations/"+fake.orgID("coder").String()+"/provisionerkeys/"+keyName); deletes != 1 {
		t.Errorf("old key revocations = %d, want 1", deletes)
	}
	controllertest.Eventually(t, waitTimeout, "Secret and Deployment follow the rotation", func() (bool, string) {
		s := h.Secret(secretName)
		d := h.Deployment("eu-provisioner")
		newHash := d.Spec.Template.Annotations[provisioner.AnnotationKeyHash]
		return string(s.Data["key"]) == rotated.secret && newHash != "" && newHash != oldHash,
			"secret or pod template annotation not updated yet"
	})
	checkDeployment(t, h.Deployment("eu-provisioner"), h.Get("eu"), fake.URL.String(), secretName, rotated.secret)
	if n := h.Recorder.Count("eu", corev1.EventTypeNormal, provisioner.EventKeyRotated); n != 1 {
		t.Errorf("KeyRotated events = %d, want 1", n)
	}

	// An organization change moves the key: revoked in the old one,
	// issued in the new one.
	p = h.Get("eu")
	p.Spec.Organization = "other"
	if err := h.C.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	controllertest.Eventually(t, waitTimeout, "key moved to organization other", func() (bool, string) {
		p = h.Get("eu")
		return p.Status.OrganizationID == fake.orgID("other").String() && len(fake.keysIn("other")) == 1 && len(fake.keysIn("coder")) == 0,
			controllertest.Describe(p) + " org=" + p.Status.OrganizationID
	})
	if s := h.Secret(secretName); string(s.Data["key"]) != fake.keysIn("other")[keyName].secret {
		t.Errorf("Secret does not hold the key issued in organization other")
	}

	// Deletion revokes the key and releases the object.
	if err := h.C.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	h.WaitDeleted(p, "CoderProvisioner deleted")
	if n := len(fake.keysIn("other")) + len(fake.keysIn("coder")); n != 0 {
		t.Errorf("keys left in Coder after deletion: %d", n)
	}
	if n := h.Recorder.Count("eu", corev1.EventTypeNormal, provisioner.EventKeyRevoked); n != 1 {
		t.Errorf("KeyRevoked events = %d, want 1", n)
	}
}

// checkDeployment asserts what the daemons run with.
func checkDeployment(t *testing.T, dep *appsv1.Deployment, p *coderv1alpha1.CoderProvisioner, coderURL, secretName, key string) {
	t.Helper()
	pod, env := controllertest.CheckDeployment(t, dep, p, controllertest.DeploymentWant{
		Kind: "CoderProvisioner", Secret: key, SecretWhat: "provisioner key",
		Image: provisioner.DefaultImage, Command: "/opt/coder provisioner start",
		SecretEnv: "CODER_PROVISIONER_DAEMON_KEY", SecretName: secretName, SecretKey: "key",
		HashAnnotation: provisioner.AnnotationKeyHash,
	})
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 2 {
		t.Errorf("replicas = %v, want 2", dep.Spec.Replicas)
	}
	c := pod.Containers[0]
	if env["CODER_URL"].Value != coderURL {
		t.Errorf("CODER_URL = %q, want %q", env["CODER_URL"].Value, coderURL)
	}
	if _, ok := env["CODER_PROVISIONERD_TAGS"]; ok {
		t.Errorf("CODER_PROVISIONERD_TAGS set: `coder provisioner start` refuses tags with a key (they are bound to it)")
	}
	if env["CODER_VERBOSE"].Value != "true" {
		t.Errorf("user env CODER_VERBOSE missing: %+v", c.Env)
	}
	if got := c.Resources.Requests.Cpu().String(); got != "250m" {
		t.Errorf("cpu request = %s, want 250m", got)
	}
	if pod.NodeSelector["pool"] != "builders" || len(pod.ImagePullSecrets) != 1 || pod.ImagePullSecrets[0].Name != "registry" {
		t.Errorf("scheduling/pull secrets not passed: nodeSelector %v, imagePullSecrets %v", pod.NodeSelector, pod.ImagePullSecrets)
	}
}

// TestProvisionerMissingControlPlane: a CoderProvisioner whose control
// plane does not exist says so (condition and one Warning event) and
// recovers by itself once the control plane appears with working access,
// without anyone touching the CoderProvisioner.
func TestProvisionerMissingControlPlane(t *testing.T) {
	h := newHarness(t, 0)
	ctx := t.Context()
	const token = "operator-session-token"
	fake := newFakeCoderd(t, token, "coder")

	p := &coderv1alpha1.CoderProvisioner{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.NS, Name: "late"},
		Spec:       coderv1alpha1.CoderProvisionerSpec{ControlPlaneRef: coderv1alpha1.ControlPlaneReference{Name: "coder"}},
	}
	if err := h.C.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	h.CheckMissingControlPlane(p, func() { h.CreateControlPlane("coder", fake.URL.String(), token) })
	if len(fake.keysIn("coder")) != 1 {
		t.Errorf("keys in Coder = %d, want 1", len(fake.keysIn("coder")))
	}
}

// TestProvisionerDeletionWithUnreachableCoderd: deletion does not hang
// when coderd is gone: revocation is retried until CleanupTimeout, then
// the finalizer is removed with a Warning event naming the key.
func TestProvisionerDeletionWithUnreachableCoderd(t *testing.T) {
	h := newHarness(t, 3*time.Second)
	ctx := t.Context()
	const token = "operator-session-token"
	fake := newFakeCoderd(t, token, "coder")
	h.CreateControlPlane("coder", fake.URL.String(), token)
	p := &coderv1alpha1.CoderProvisioner{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.NS, Name: "orphan"},
		Spec:       coderv1alpha1.CoderProvisionerSpec{ControlPlaneRef: coderv1alpha1.ControlPlaneReference{Name: "coder"}},
	}
	if err := h.C.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	controllertest.Eventually(t, waitTimeout, "key issued", func() (bool, string) {
		p = h.Get("orphan")
		c := controllertest.Condition(p, coderv1alpha1.ConditionCredentialsReady)
		return c != nil && c.Status == metav1.ConditionTrue, controllertest.Describe(p)
	})
	fake.Close() // coderd goes away

	start := time.Now()
	if err := h.C.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	h.WaitDeleted(p, "CoderProvisioner deleted despite coderd being gone")
	if took := time.Since(start); took < 1500*time.Millisecond {
		t.Errorf("finalizer removed after %s, before the 3s cleanup timeout: revocation was not retried", took)
	}
	if n := h.Recorder.Count("orphan", corev1.EventTypeWarning, provisioner.EventKeyRevocationFailed); n != 1 {
		t.Errorf("KeyRevocationFailed events = %d, want 1 (warnings: %v)", n, h.Recorder.Warnings("orphan"))
	}
}

// TestProvisionerUnsupportedOnOpenSourceCoderd runs against the real
// open-source coderd, which has no provisioner key API: the object reports
// FeatureSupported=False with Coder's own message and phase Unsupported,
// creates no Deployment, emits one Warning event, and does not loop.
func TestProvisionerUnsupportedOnOpenSourceCoderd(t *testing.T) {
	coder := testenv.NewCoder(t, testenv.CoderOptions{})
	h := newHarness(t, 0)
	ctx := t.Context()
	h.CreateControlPlane("coder", coder.URL.String(), coder.SessionToken)

	start := h.Reconciles()
	p := &coderv1alpha1.CoderProvisioner{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.NS, Name: "oss"},
		Spec: coderv1alpha1.CoderProvisionerSpec{
			ControlPlaneRef: coderv1alpha1.ControlPlaneReference{Name: "coder"},
			Tags:            map[string]string{"region": "eu"},
		},
	}
	if err := h.C.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p = h.CheckUnsupported(p, start)
	if cp := controllertest.Condition(p, coderv1alpha1.ConditionControlPlaneReady); cp.Status != metav1.ConditionTrue {
		t.Errorf("ControlPlaneReady = %+v, want True (coderd answered)", cp)
	}
	if p.Status.OrganizationID != coder.OrganizationID.String() {
		t.Errorf("status.organizationID = %q, want %s", p.Status.OrganizationID, coder.OrganizationID)
	}
	var deps appsv1.DeploymentList
	if err := h.C.List(ctx, &deps, client.InNamespace(h.NS)); err != nil {
		t.Fatal(err)
	}
	if len(deps.Items) != 0 {
		t.Errorf("Deployments created on an open-source coderd: %d", len(deps.Items))
	}
	var secrets corev1.SecretList
	if err := h.C.List(ctx, &secrets, client.InNamespace(h.NS)); err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets.Items {
		if s.Name == "oss-provisioner-key" {
			t.Errorf("key Secret created on an open-source coderd")
		}
	}

	// Without a finalizer, deletion is immediate.
	if err := h.C.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	h.WaitDeleted(p, "deleted")
}
