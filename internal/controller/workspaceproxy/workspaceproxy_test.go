package workspaceproxy_test

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/controllertest"
	"github.com/coder/coder-k8s/internal/controller/workspaceproxy"
	"github.com/coder/coder-k8s/internal/testenv"
)

const waitTimeout = controllertest.WaitTimeout

// TestWorkspaceProxyLifecycle drives a CoderWorkspaceProxy through its
// life against a coderd entitled to workspace proxies (the fake following
// coderd's contract): registration, token Secret, Deployment and Service,
// status, display name sync, token regeneration when its Secret is lost,
// and deregistration on deletion.
func TestWorkspaceProxyLifecycle(t *testing.T) {
	h := newHarness(t, 0)
	ctx := t.Context()
	const token = "operator-session-token"
	fake := newFakeCoderd(t, token)
	h.CreateControlPlane("coder", fake.URL.String(), token)

	p := &coderv1alpha1.CoderWorkspaceProxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.NS, Name: "eu"},
		Spec: coderv1alpha1.CoderWorkspaceProxySpec{
			ControlPlaneRef:   coderv1alpha1.ControlPlaneReference{Name: "coder"},
			DisplayName:       "Europe",
			Icon:              "/emojis/1f1ea-1f1fa.png",
			AccessURL:         "https://eu.coder.example.com",
			WildcardAccessURL: "*.eu.coder.example.com",
			Service: coderv1alpha1.ServiceSpec{
				Type:                  corev1.ServiceTypeLoadBalancer,
				Port:                  443,
				Annotations:           map[string]string{"lb.example.com/scheme": "internet-facing"},
				ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			},
			PodSpec: coderv1alpha1.PodSpec{
				Env: []corev1.EnvVar{{Name: "CODER_VERBOSE", Value: "true"}},
			},
		},
	}
	if err := h.C.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	const secretName, workload = "eu-wsproxy-token", "eu-wsproxy"

	controllertest.Eventually(t, waitTimeout, "proxy registered and deployed", func() (bool, string) {
		p = h.Get("eu")
		c := controllertest.Condition(p, coderv1alpha1.ConditionAvailable)
		return p.Status.Phase == coderv1alpha1.PhaseProvisioning && c != nil && c.Reason == coderv1alpha1.ReasonReplicasNotReady, controllertest.Describe(p)
	})
	registered, ok := fake.proxy("eu")
	if !ok || fake.registered() != 1 {
		t.Fatalf("proxy %q not registered in Coder (%d registered)", "eu", fake.registered())
	}
	if registered.proxy.DisplayName != "Europe" || registered.proxy.IconURL != "/emojis/1f1ea-1f1fa.png" {
		t.Errorf("registered display name/icon = %q/%q", registered.proxy.DisplayName, registered.proxy.IconURL)
	}
	for _, ct := range []string{coderv1alpha1.ConditionControlPlaneReady, coderv1alpha1.ConditionFeatureSupported, coderv1alpha1.ConditionCredentialsReady} {
		c := controllertest.Condition(p, ct)
		if c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != p.Generation {
			t.Errorf("condition %s = %+v, want True at generation %d", ct, c, p.Generation)
		}
	}
	if p.Status.ObservedGeneration != p.Generation {
		t.Errorf("observedGeneration = %d, want %d", p.Status.ObservedGeneration, p.Generation)
	}
	if p.Status.ProxyID != registered.proxy.ID.String() || p.Status.URL != "https://eu.coder.example.com" ||
		p.Status.TokenSecretRef == nil || *p.Status.TokenSecretRef != (coderv1alpha1.SecretKeyReference{Name: secretName, Key: "token"}) {
		t.Errorf("status = proxyID %q url %q tokenSecretRef %+v", p.Status.ProxyID, p.Status.URL, p.Status.TokenSecretRef)
	}
	if !slices.Contains(p.Finalizers, workspaceproxy.Finalizer) {
		t.Errorf("finalizers = %v, want %s", p.Finalizers, workspaceproxy.Finalizer)
	}
	secret := h.Secret(secretName)
	if string(secret.Data["token"]) != registered.token || !metav1.IsControlledBy(secret, p) {
		t.Errorf("Secret %s: token matches %v, controlled %v", secretName, string(secret.Data["token"]) == registered.token, metav1.IsControlledBy(secret, p))
	}
	dep := h.Deployment(workload)
	checkDeployment(t, dep, p, fake.URL.String(), secretName, "token", registered.token)
	svc := h.Service(workload)
	controllertest.CheckCached(t, secret, dep, svc)
	if !metav1.IsControlledBy(svc, p) || svc.Spec.Type != corev1.ServiceTypeLoadBalancer || len(svc.Spec.Ports) != 1 ||
		svc.Spec.Ports[0].Port != 443 || svc.Spec.Ports[0].TargetPort.String() != "http" ||
		svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal ||
		svc.Annotations["lb.example.com/scheme"] != "internet-facing" ||
		svc.Spec.Selector["app.kubernetes.io/instance"] != "eu" {
		t.Errorf("Service = %+v %+v", svc.ObjectMeta, svc.Spec)
	}
	if n := h.Recorder.Count("eu", corev1.EventTypeNormal, workspaceproxy.EventProxyRegistered); n != 1 {
		t.Errorf("ProxyRegistered events = %d, want 1", n)
	}
	if w := h.Recorder.Warnings("eu"); len(w) != 0 {
		t.Errorf("Warning events on the happy path: %v", w)
	}

	// No churn on a reconcile with nothing to do.
	depRV, svcRV, crRV := dep.ResourceVersion, svc.ResourceVersion, p.ResourceVersion
	h.CheckIdleReconcile(secret, nil)
	if h.Deployment(workload).ResourceVersion != depRV || h.Service(workload).ResourceVersion != svcRV || h.Get("eu").ResourceVersion != crRV {
		t.Errorf("a no-op reconcile rewrote the Deployment, the Service or the CoderWorkspaceProxy")
	}
	if n := fake.Count(http.MethodPatch, "/api/v2/workspaceproxies/"+registered.proxy.ID.String()); n != 0 {
		t.Errorf("PATCH calls with nothing to change: %d", n)
	}

	// Display name and icon follow the spec; the token stays.
	tokenHash := dep.Spec.Template.Annotations[workspaceproxy.AnnotationTokenHash]
	p = h.Get("eu")
	p.Spec.DisplayName = "Europe (Frankfurt)"
	p.Spec.Icon = ""
	if err := h.C.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	controllertest.Eventually(t, waitTimeout, "display name and icon synced", func() (bool, string) {
		got, _ := fake.proxy("eu")
		return got.proxy.DisplayName == "Europe (Frankfurt)" && got.proxy.IconURL == workspaceproxy.DefaultIcon,
			got.proxy.DisplayName + " " + got.proxy.IconURL
	})
	if got, _ := fake.proxy("eu"); got.token != registered.token {
		t.Errorf("token regenerated by a display name change")
	}
	time.Sleep(500 * time.Millisecond)
	if got := h.Deployment(workload).Spec.Template.Annotations[workspaceproxy.AnnotationTokenHash]; got != tokenHash {
		t.Errorf("pods rolled by a display name change: token hash %s -> %s", tokenHash, got)
	}

	// A lost token Secret: the token of the registered proxy is
	// regenerated (same proxy ID) and the pods roll.
	if err := h.C.Delete(ctx, h.Secret(secretName)); err != nil {
		t.Fatal(err)
	}
	controllertest.Eventually(t, waitTimeout, "token regenerated into a new Secret", func() (bool, string) {
		got, _ := fake.proxy("eu")
		var s corev1.Secret
		if err := h.C.Get(ctx, client.ObjectKey{Namespace: h.NS, Name: secretName}, &s); err != nil {
			return false, err.Error()
		}
		return got.token != registered.token && string(s.Data["token"]) == got.token, "Secret not rewritten yet"
	})
	if got, _ := fake.proxy("eu"); got.proxy.ID != registered.proxy.ID || fake.registered() != 1 {
		t.Errorf("the proxy was registered again instead of regenerating its token")
	}
	controllertest.Eventually(t, waitTimeout, "pods rolled for the new token", func() (bool, string) {
		got := h.Deployment(workload).Spec.Template.Annotations[workspaceproxy.AnnotationTokenHash]
		return got != "" && got != tokenHash, "token hash unchanged"
	})
	if n := h.Recorder.Count("eu", corev1.EventTypeNormal, workspaceproxy.EventTokenRegenerated); n != 1 {
		t.Errorf("TokenRegenerated events = %d, want 1", n)
	}

	// Deletion deregisters the proxy and releases the object.
	if err := h.C.Delete(ctx, h.Get("eu")); err != nil {
		t.Fatal(err)
	}
	h.WaitDeleted(&coderv1alpha1.CoderWorkspaceProxy{ObjectMeta: metav1.ObjectMeta{Namespace: h.NS, Name: "eu"}}, "CoderWorkspaceProxy deleted")
	if fake.registered() != 0 {
		t.Errorf("proxy still registered in Coder after deletion")
	}
	if n := h.Recorder.Count("eu", corev1.EventTypeNormal, workspaceproxy.EventProxyDeregistered); n != 1 {
		t.Errorf("ProxyDeregistered events = %d, want 1", n)
	}
}

// checkDeployment asserts what the proxy runs with.
func checkDeployment(t *testing.T, dep *appsv1.Deployment, p *coderv1alpha1.CoderWorkspaceProxy, primaryURL, secretName, secretKey, token string) {
	t.Helper()
	pod, env := controllertest.CheckDeployment(t, dep, p, controllertest.DeploymentWant{
		Kind: "CoderWorkspaceProxy", Secret: token, SecretWhat: "proxy token",
		Image: workspaceproxy.DefaultImage, Command: "/opt/coder wsproxy server",
		SecretEnv: "CODER_PROXY_SESSION_TOKEN", SecretName: secretName, SecretKey: secretKey,
		HashAnnotation: workspaceproxy.AnnotationTokenHash,
	})
	c := pod.Containers[0]
	want := map[string]string{
		"CODER_PRIMARY_ACCESS_URL": primaryURL,
		"CODER_ACCESS_URL":         p.Spec.AccessURL,
		"CODER_HTTP_ADDRESS":       "0.0.0.0:8080",
	}
	for _, e := range p.Spec.Env {
		want[e.Name] = e.Value
	}
	if p.Spec.WildcardAccessURL != "" {
		want["CODER_WILDCARD_ACCESS_URL"] = p.Spec.WildcardAccessURL
	}
	for k, v := range want {
		if env[k].Value != v {
			t.Errorf("%s = %q, want %q", k, env[k].Value, v)
		}
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "http" || c.Ports[0].ContainerPort != 8080 {
		t.Errorf("ports = %+v, want http 8080", c.Ports)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("readiness probe = %+v, want GET /healthz", c.ReadinessProbe)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("the proxy pod mounts a service account token it does not need")
	}
}

// TestWorkspaceProxySuppliedToken: with spec.proxyTokenSecretRef the
// proxy runs with that token and nothing is registered, edited or deleted
// in Coder, on creation or on deletion.
func TestWorkspaceProxySuppliedToken(t *testing.T) {
	h := newHarness(t, 0)
	ctx := t.Context()
	const token = "operator-session-token"
	fake := newFakeCoderd(t, token)
	h.CreateControlPlane("coder", fake.URL.String(), token)

	proxyID := uuid.New()
	supplied := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.NS, Name: "byo-token"},
		Data:       map[string][]byte{"proxy-token": []byte(proxyID.String() + ":s3cr3t-part")},
	}
	if err := h.C.Create(ctx, supplied); err != nil {
		t.Fatal(err)
	}
	p := &coderv1alpha1.CoderWorkspaceProxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.NS, Name: "byo"},
		Spec: coderv1alpha1.CoderWorkspaceProxySpec{
			ControlPlaneRef:     coderv1alpha1.ControlPlaneReference{Name: "coder"},
			AccessURL:           "https://byo.coder.example.com",
			ProxyTokenSecretRef: &coderv1alpha1.SecretKeyReference{Name: "byo-token", Key: "proxy-token"},
		},
	}
	if err := h.C.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	controllertest.Eventually(t, waitTimeout, "proxy deployed with the supplied token", func() (bool, string) {
		p = h.Get("byo")
		c := controllertest.Condition(p, coderv1alpha1.ConditionCredentialsReady)
		return p.Status.Phase == coderv1alpha1.PhaseProvisioning && c != nil && c.Reason == coderv1alpha1.ReasonTokenSupplied, controllertest.Describe(p)
	})
	if p.Status.TokenSecretRef == nil || *p.Status.TokenSecretRef != *p.Spec.ProxyTokenSecretRef {
		t.Errorf("status.tokenSecretRef = %+v, want the supplied one", p.Status.TokenSecretRef)
	}
	if p.Status.ProxyID != proxyID.String() {
		t.Errorf("status.proxyID = %q, want %s (from the token)", p.Status.ProxyID, proxyID)
	}
	checkDeployment(t, h.Deployment("byo-wsproxy"), p, fake.URL.String(), "byo-token", "proxy-token", "s3cr3t-part")
	var s corev1.Secret
	if err := h.C.Get(ctx, client.ObjectKey{Namespace: h.NS, Name: "byo-wsproxy-token"}, &s); !apierrors.IsNotFound(err) {
		t.Errorf("an operator token Secret exists with a supplied token (err %v)", err)
	}

	if err := h.C.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	h.WaitDeleted(p, "deleted")
	if calls := fake.CallsExcept(http.MethodGet); len(calls) != 0 {
		t.Errorf("calls to coderd other than reads with a supplied token: %v", calls)
	}
	if fake.registered() != 0 {
		t.Errorf("a proxy was registered")
	}
}

// TestWorkspaceProxyMissingControlPlane: a CoderWorkspaceProxy whose
// control plane does not exist says so (condition and one Warning event)
// and recovers by itself once the control plane appears with working
// access, without anyone touching the CoderWorkspaceProxy.
func TestWorkspaceProxyMissingControlPlane(t *testing.T) {
	h := newHarness(t, 0)
	ctx := t.Context()
	const token = "operator-session-token"
	fake := newFakeCoderd(t, token)

	p := &coderv1alpha1.CoderWorkspaceProxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.NS, Name: "late"},
		Spec: coderv1alpha1.CoderWorkspaceProxySpec{
			ControlPlaneRef: coderv1alpha1.ControlPlaneReference{Name: "coder"},
			AccessURL:       "https://late.coder.example.com",
		},
	}
	if err := h.C.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	h.CheckMissingControlPlane(p, func() { h.CreateControlPlane("coder", fake.URL.String(), token) })
	if fake.registered() != 1 {
		t.Errorf("registered proxies = %d, want 1", fake.registered())
	}
}

// TestWorkspaceProxyUnsupportedOnOpenSourceCoderd runs against the real
// open-source coderd, which has no workspace proxy API: the object reports
// FeatureSupported=False with Coder's own message and phase Unsupported,
// creates no Deployment or Service, emits one Warning event, and does not
// loop.
func TestWorkspaceProxyUnsupportedOnOpenSourceCoderd(t *testing.T) {
	coder := testenv.NewCoder(t, testenv.CoderOptions{})
	h := newHarness(t, 0)
	ctx := t.Context()
	h.CreateControlPlane("coder", coder.URL.String(), coder.SessionToken)

	start := h.Reconciles()
	p := &coderv1alpha1.CoderWorkspaceProxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.NS, Name: "oss"},
		Spec: coderv1alpha1.CoderWorkspaceProxySpec{
			ControlPlaneRef: coderv1alpha1.ControlPlaneReference{Name: "coder"},
			AccessURL:       "https://oss.coder.example.com",
		},
	}
	if err := h.C.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	h.CheckUnsupported(p, start)
	var deps appsv1.DeploymentList
	if err := h.C.List(ctx, &deps, client.InNamespace(h.NS)); err != nil {
		t.Fatal(err)
	}
	var svcs corev1.ServiceList
	if err := h.C.List(ctx, &svcs, client.InNamespace(h.NS)); err != nil {
		t.Fatal(err)
	}
	if len(deps.Items) != 0 || len(svcs.Items) != 0 {
		t.Errorf("created on an open-source coderd: %d Deployments, %d Services", len(deps.Items), len(svcs.Items))
	}
}
