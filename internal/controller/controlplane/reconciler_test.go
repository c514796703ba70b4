package controlplane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/controllertest"
)

// markDeploymentAvailable writes the status the deployment controller
// would write once every replica is ready: the test API server runs no
// controller manager and no kubelet, so pods never run.
func markDeploymentAvailable(t *testing.T, c client.Client, ns, name string) {
	t.Helper()
	eventually(t, 10*time.Second, "mark Deployment available", func() error {
		var dep appsv1.Deployment
		if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &dep); err != nil {
			return err
		}
		n := ptr.Deref(dep.Spec.Replicas, 1)
		dep.Status = appsv1.DeploymentStatus{
			ObservedGeneration: dep.Generation,
			Replicas:           n,
			UpdatedReplicas:    n,
			ReadyReplicas:      n,
			AvailableReplicas:  n,
			Conditions: []appsv1.DeploymentCondition{{
				Type:               appsv1.DeploymentAvailable,
				Status:             corev1.ConditionTrue,
				Reason:             "MinimumReplicasAvailable",
				Message:            "Deployment has minimum availability.",
				LastUpdateTime:     metav1.Now(),
				LastTransitionTime: metav1.Now(),
			}},
		}
		return c.Status().Update(context.Background(), &dep)
	})
}

func getDeployment(t *testing.T, c client.Client, ns, name string) *appsv1.Deployment {
	t.Helper()
	var dep appsv1.Deployment
	eventually(t, 30*time.Second, "Deployment "+name, func() error {
		return c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &dep)
	})
	return &dep
}

// waitObject waits until the named object exists: the reconciler writes
// children one after another, so one existing says nothing of the next.
func waitObject(t *testing.T, c client.Client, ns, name string, obj client.Object) {
	t.Helper()
	eventually(t, 30*time.Second, fmt.Sprintf("%T %s", obj, name), func() error {
		return c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, obj)
	})
}

func requireControlledBy(t *testing.T, obj client.Object, ccp *coderv1alpha1.CoderControlPlane) {
	t.Helper()
	ref := metav1.GetControllerOf(obj)
	if ref == nil || ref.UID != ccp.UID || ref.Kind != "CoderControlPlane" || !ptr.Deref(ref.BlockOwnerDeletion, false) {
		t.Errorf("%T %s: controller reference %+v, want the control plane %s (uid %s)", obj, obj.GetName(), ref, ccp.Name, ccp.UID)
	}
}

func TestDeployedControlPlaneCreatesChildren(t *testing.T) {
	ns := controllertest.Namespace(t, "children")
	h := startManager(t, []string{ns}, nil, nil)

	ccp := newControlPlane(ns, "coder")
	ccp.Spec.Replicas = ptr.To[int32](2)
	ccp.Spec.Env = []corev1.EnvVar{
		{Name: "CODER_PG_CONNECTION_URL", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "coder-db"}, Key: "url"}}},
		// A user variable wins over the operator's of the same name.
		{Name: "CODER_CACHE_DIRECTORY", Value: "/var/cache/coder/mine"},
	}
	ccp.Spec.ExtraArgs = []string{"--verbose"}
	ccp.Spec.ServiceAccount.Annotations = map[string]string{"iam.example.com/role": "coder"}
	ccp.Spec.PodLabels = map[string]string{"team": "platform"}
	create(t, h.c, ccp)
	runPod(t, h.c, ns, "coder", fakePodIP)
	ccp = getCCP(t, h.c, ns, "coder")

	dep := getDeployment(t, h.c, ns, "coder")
	requireControlledBy(t, dep, ccp)
	if got := ptr.Deref(dep.Spec.Replicas, 0); got != 2 {
		t.Errorf("replicas = %d, want 2", got)
	}
	pod := dep.Spec.Template.Spec
	if pod.ServiceAccountName != "coder" {
		t.Errorf("serviceAccountName = %q, want coder", pod.ServiceAccountName)
	}
	if dep.Spec.Template.Labels["team"] != "platform" || dep.Spec.Template.Labels[labelInstance] != "coder" {
		t.Errorf("pod labels = %v, want the user's and the selector's", dep.Spec.Template.Labels)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("containers = %d, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if c.Image != DefaultImage {
		t.Errorf("image = %q, want %q", c.Image, DefaultImage)
	}
	if want := []string{"server", "--verbose"}; !slices.Equal(c.Args, want) {
		t.Errorf("args = %v, want %v", c.Args, want)
	}
	wantURL := "http://coder." + ns + ".svc.cluster.local"
	for name, want := range map[string]string{
		"CODER_HTTP_ADDRESS":    "0.0.0.0:8080",
		"CODER_ACCESS_URL":      wantURL,
		"CODER_CACHE_DIRECTORY": "/var/cache/coder/mine",
	} {
		got := findEnv(c.Env, name)
		if len(got) != 1 || got[0].Value != want {
			t.Errorf("env %s = %+v, want exactly one with value %q", name, got, want)
		}
	}
	if got := findEnv(c.Env, "CODER_PG_CONNECTION_URL"); len(got) != 1 || got[0].ValueFrom == nil || got[0].ValueFrom.SecretKeyRef.Name != "coder-db" {
		t.Errorf("env CODER_PG_CONNECTION_URL = %+v, want the user's secretKeyRef", got)
	}
	if c.Env[0].Name != "CODER_HTTP_ADDRESS" {
		t.Errorf("first env var = %s, want the operator's CODER_HTTP_ADDRESS first", c.Env[0].Name)
	}
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port.StrVal != "http" {
			t.Errorf("%s probe = %+v, want GET /healthz on port http", name, p)
		}
	}
	if len(c.Ports) != 1 || c.Ports[0].ContainerPort != 8080 || c.Ports[0].Name != "http" {
		t.Errorf("ports = %+v, want http 8080", c.Ports)
	}
	// Restricted by default.
	psc := pod.SecurityContext
	if psc == nil || !ptr.Deref(psc.RunAsNonRoot, false) || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context = %+v, want runAsNonRoot and seccomp RuntimeDefault", psc)
	}
	sc := c.SecurityContext
	if sc == nil || ptr.Deref(sc.AllowPrivilegeEscalation, true) || !ptr.Deref(sc.ReadOnlyRootFilesystem, false) ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !ptr.Deref(sc.RunAsNonRoot, false) {
		t.Errorf("container security context = %+v, want no privilege escalation, drop ALL, read-only root, non-root", sc)
	}
	mounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = true
	}
	if !mounts["/tmp"] || !mounts[cacheDir] {
		t.Errorf("mounts = %+v, want writable /tmp and %s on a read-only root", c.VolumeMounts, cacheDir)
	}

	var svc corev1.Service
	waitObject(t, h.c, ns, "coder", &svc)
	requireControlledBy(t, &svc, ccp)
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 80 || svc.Spec.Ports[0].TargetPort.StrVal != "http" || svc.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Errorf("Service = %s %+v, want ClusterIP port 80 -> http", svc.Spec.Type, svc.Spec.Ports)
	}
	for k, v := range svc.Spec.Selector {
		if dep.Spec.Template.Labels[k] != v {
			t.Errorf("Service selector %v does not select the pod labels %v", svc.Spec.Selector, dep.Spec.Template.Labels)
		}
	}

	var sa corev1.ServiceAccount
	waitObject(t, h.c, ns, "coder", &sa)
	requireControlledBy(t, &sa, ccp)
	if sa.Annotations["iam.example.com/role"] != "coder" {
		t.Errorf("ServiceAccount annotations = %v", sa.Annotations)
	}

	// Workspace RBAC: a RoleBinding to the default workspace ClusterRole,
	// no Role.
	var rb rbacv1.RoleBinding
	waitObject(t, h.c, ns, "coder-workspace-"+DefaultWorkspaceClusterRole, &rb)
	requireControlledBy(t, &rb, ccp)
	if len(rb.Subjects) != 1 || rb.Subjects[0].Name != "coder" || rb.Subjects[0].Namespace != ns ||
		rb.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: DefaultWorkspaceClusterRole}) {
		t.Errorf("RoleBinding = %+v -> %+v, want service account coder bound to ClusterRole %s", rb.Subjects, rb.RoleRef, DefaultWorkspaceClusterRole)
	}

	// Status: the in-cluster URL; not available while no pod runs; access
	// (the double) ready.
	// Access is set up after the children (at a ready pod first): wait for
	// it, then look at the whole status.
	ccp = waitCondition(t, h.c, ns, "coder", coderv1alpha1.ConditionOperatorAccessReady, metav1.ConditionTrue, "")
	if c := apimeta.FindStatusCondition(ccp.Status.Conditions, coderv1alpha1.ConditionAvailable); c == nil ||
		c.Status != metav1.ConditionFalse || c.Reason != coderv1alpha1.ReasonDeploymentUnavailable {
		t.Errorf("condition Available = %+v, want False %s", c, coderv1alpha1.ReasonDeploymentUnavailable)
	}
	if ccp.Status.URL != wantURL {
		t.Errorf("status.url = %q, want %q", ccp.Status.URL, wantURL)
	}
	if ccp.Status.Phase != coderv1alpha1.PhaseProvisioning {
		t.Errorf("phase = %s, want Provisioning", ccp.Status.Phase)
	}
	for _, typ := range []string{coderv1alpha1.ConditionReconciled, coderv1alpha1.ConditionOperatorAccessReady} {
		if !apimeta.IsStatusConditionTrue(ccp.Status.Conditions, typ) {
			t.Errorf("condition %s not True: %+v", typ, ccp.Status.Conditions)
		}
	}
	if ccp.Status.OperatorTokenSecretRef == nil || ccp.Status.OperatorTokenSecretRef.Name != "coder-operator-token" ||
		ccp.Status.OperatorUser != "coder-k8s" || ccp.Status.CoderVersion != "v2.30.0" {
		t.Errorf("status access fields = %+v", ccp.Status)
	}
	if !slices.Contains(ccp.Finalizers, FinalizerOperatorAccess) {
		t.Errorf("finalizers = %v, want %s", ccp.Finalizers, FinalizerOperatorAccess)
	}
	if urls, _ := h.access.calls(); len(urls) == 0 || urls[len(urls)-1] != wantURL {
		t.Errorf("access manager called with %v, want %s", urls, wantURL)
	}
}

func TestDeployedControlPlaneBecomesReadyWithoutChurn(t *testing.T) {
	ns := controllertest.Namespace(t, "ready")
	h := startManager(t, []string{ns}, nil, nil)
	ctx := context.Background()

	// A spec that uses most fields, so that server-side defaults inside
	// user-supplied structures are part of the no-churn check below.
	for _, name := range []string{"coder-tls", "internal-ca"} {
		create(t, h.c, tlsSecret(t, ns, name, "coder."+ns+".svc.cluster.local"))
	}
	ccp := newControlPlane(ns, "coder")
	if err := yaml.Unmarshal([]byte(`
replicas: 1
env:
  - name: POD_NAME
    valueFrom: {fieldRef: {fieldPath: metadata.name}}
envFrom:
  - secretRef: {name: coder-env}
resources:
  requests: {cpu: 1000m, memory: 1024Mi}
tolerations:
  - {key: dedicated, value: coder, effect: NoSchedule}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector: {matchLabels: {app.kubernetes.io/instance: coder}}
topologySpreadConstraints:
  - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway, labelSelector: {matchLabels: {app.kubernetes.io/instance: coder}}}
imagePullSecrets: [{name: registry}]
volumes:
  - name: extra
    configMap: {name: coder-extra}
volumeMounts:
  - {name: extra, mountPath: /etc/coder-extra}
readinessProbe:
  httpGet: {path: /healthz, port: 8080}
priorityClassName: high
tls: {secretNames: [coder-tls]}
caCerts: [{name: internal-ca, key: ca.crt}]
service: {type: LoadBalancer, externalTrafficPolicy: Local, annotations: {lb.example.com/internal: "true"}}
expose: {ingress: {host: coder.example.com, className: nginx}}
`), &ccp.Spec); err != nil {
		t.Fatal(err)
	}
	create(t, h.c, ccp)
	// The pod's priority class, as an admin would have installed it.
	if err := h.c.Create(ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "high"}, Value: 1000}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	runPod(t, h.c, ns, "coder", fakePodIP)
	getDeployment(t, h.c, ns, "coder")
	waitCondition(t, h.c, ns, "coder", coderv1alpha1.ConditionAvailable, metav1.ConditionFalse, "")

	markDeploymentAvailable(t, h.c, ns, "coder")
	ccp = waitCondition(t, h.c, ns, "coder", coderv1alpha1.ConditionAvailable, metav1.ConditionTrue, coderv1alpha1.ReasonDeploymentAvailable)
	eventually(t, 10*time.Second, "phase Ready", func() error {
		ccp = getCCP(t, h.c, ns, "coder")
		if ccp.Status.Phase != coderv1alpha1.PhaseReady {
			return fmt.Errorf("phase %s", ccp.Status.Phase)
		}
		return nil
	})
	if ccp.Status.Replicas != 1 || ccp.Status.ReadyReplicas != 1 {
		t.Errorf("replicas = %d/%d, want 1/1 from the Deployment", ccp.Status.ReadyReplicas, ccp.Status.Replicas)
	}
	waitEvent(t, ns, "coder", corev1.EventTypeNormal, "Available")
	waitEvent(t, ns, "coder", corev1.EventTypeNormal, "OperatorAccessReady")

	// Settled: a reconcile with nothing changed writes nothing. Trigger
	// reconciles through the watches (an unrelated annotation on the
	// Deployment) and directly, and count the writes.
	snapshot := func() map[string]string {
		rv := map[string]string{}
		for _, obj := range []client.Object{&coderv1alpha1.CoderControlPlane{}, &appsv1.Deployment{}, &corev1.Service{}, &corev1.ServiceAccount{}, &networkingv1.Ingress{}} {
			if err := h.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "coder"}, obj); err != nil {
				t.Fatal(err)
			}
			rv[fmt.Sprintf("%T", obj)] = obj.GetResourceVersion()
		}
		var rb rbacv1.RoleBinding
		if err := h.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "coder-workspace-" + DefaultWorkspaceClusterRole}, &rb); err != nil {
			t.Fatal(err)
		}
		rv["RoleBinding"] = rb.GetResourceVersion()
		return rv
	}
	settle := func() {
		controllertest.Settle(t, "reconciles", func() float64 { return controllertest.Reconciles(t, "codercontrolplane") })
	}
	settle() // the reconciles of the transitions above
	h.writes.Reset()
	urlsBefore, _ := h.access.calls()
	var dep appsv1.Deployment
	if err := h.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "coder"}, &dep); err != nil {
		t.Fatal(err)
	}
	dep.Annotations["example.com/touched-by-someone-else"] = "yes"
	if err := h.c.Update(ctx, &dep); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "reconcile after the Deployment changed", func() error {
		if urls, _ := h.access.calls(); len(urls) <= len(urlsBefore) {
			return errors.New("no reconcile yet")
		}
		return nil
	})
	before := snapshot()
	for range 3 {
		if _, err := h.r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "coder"}}); err != nil {
			t.Fatalf("reconcile: %v", err)
		}
	}
	settle()
	if n, log := h.writes.Written(); n != 0 {
		t.Errorf("reconciles without a change made %d writes: %v", n, log)
	}
	if after := snapshot(); !mapsEqual(before, after) {
		t.Errorf("resource versions changed without a spec change:\nbefore %v\nafter  %v", before, after)
	}
	if n := countEvents(t, ns, "coder", "Available"); n != 1 {
		t.Errorf("%d Available events, want 1 (events on transitions only)", n)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestSpecChangeUpdatesDeployment(t *testing.T) {
	ns := controllertest.Namespace(t, "change")
	h := startManager(t, []string{ns}, nil, nil)

	ccp := newControlPlane(ns, "coder")
	ccp.Spec.NodeSelector = map[string]string{"pool": "coder"}
	ccp.Spec.Service.Annotations = map[string]string{"lb.example.com/internal": "true"}
	create(t, h.c, ccp)
	runPod(t, h.c, ns, "coder", fakePodIP)
	dep := getDeployment(t, h.c, ns, "coder")
	if dep.Spec.Template.Spec.NodeSelector["pool"] != "coder" {
		t.Fatalf("nodeSelector = %v", dep.Spec.Template.Spec.NodeSelector)
	}

	updateCCP(t, h.c, ns, "coder", func(ccp *coderv1alpha1.CoderControlPlane) {
		ccp.Spec.Replicas = ptr.To[int32](3)
		ccp.Spec.Env = append(ccp.Spec.Env, corev1.EnvVar{Name: "CODER_VERBOSE", Value: "true"})
		ccp.Spec.Image = "ghcr.io/coder/coder:v2.29.1"
		ccp.Spec.NodeSelector = nil // removed fields must go from the Deployment too
		ccp.Spec.Service.Annotations = nil
		ccp.Spec.Service.Port = 8080
	})
	eventually(t, 30*time.Second, "Deployment follows the spec", func() error {
		var dep appsv1.Deployment
		if err := h.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "coder"}, &dep); err != nil {
			return err
		}
		c := dep.Spec.Template.Spec.Containers[0]
		switch {
		case ptr.Deref(dep.Spec.Replicas, 0) != 3:
			return fmt.Errorf("replicas %d", ptr.Deref(dep.Spec.Replicas, 0))
		case len(findEnv(c.Env, "CODER_VERBOSE")) != 1:
			return fmt.Errorf("env %v", c.Env)
		case c.Image != "ghcr.io/coder/coder:v2.29.1":
			return fmt.Errorf("image %s", c.Image)
		case len(dep.Spec.Template.Spec.NodeSelector) != 0:
			return fmt.Errorf("nodeSelector still %v", dep.Spec.Template.Spec.NodeSelector)
		case findEnv(c.Env, "CODER_ACCESS_URL")[0].Value != "http://coder."+ns+".svc.cluster.local:8080":
			return fmt.Errorf("access URL %v", findEnv(c.Env, "CODER_ACCESS_URL"))
		}
		return nil
	})
	eventually(t, 30*time.Second, "Service follows the spec", func() error {
		var svc corev1.Service
		if err := h.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "coder"}, &svc); err != nil {
			return err
		}
		if svc.Spec.Ports[0].Port != 8080 || svc.Annotations["lb.example.com/internal"] != "" {
			return fmt.Errorf("ports %+v annotations %v", svc.Spec.Ports, svc.Annotations)
		}
		return nil
	})
	ccp = waitCondition(t, h.c, ns, "coder", coderv1alpha1.ConditionReconciled, metav1.ConditionTrue, coderv1alpha1.ReasonApplied)
	if want := "http://coder." + ns + ".svc.cluster.local:8080"; ccp.Status.URL != want {
		t.Errorf("status.url = %q, want %q", ccp.Status.URL, want)
	}
}

// httpRouteCRD is a minimal HTTPRoute CRD: enough for the API server to
// serve the kind, not the Gateway API's validation.
func httpRouteCRD() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata": map[string]any{
			"name": "httproutes.gateway.networking.k8s.io",
			// *.k8s.io groups need it; the Gateway API's own CRDs carry it.
			"annotations": map[string]any{"api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/gateway-api/pull/1538"},
		},
		"spec": map[string]any{
			"group": "gateway.networking.k8s.io",
			"scope": "Namespaced",
			"names": map[string]any{"kind": "HTTPRoute", "listKind": "HTTPRouteList", "plural": "httproutes", "singular": "httproute"},
			"versions": []any{map[string]any{
				"name": "v1", "served": true, "storage": true,
				"schema":       map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
				"subresources": map[string]any{"status": map[string]any{}},
			}},
		},
	}}
}

func TestMissingTLSSecretRecoversWhenCreated(t *testing.T) {
	ns := controllertest.Namespace(t, "tls")
	h := startManager(t, []string{ns}, nil, nil)
	ctx := context.Background()

	ccp := newControlPlane(ns, "coder")
	ccp.Spec.TLS = &coderv1alpha1.TLSSpec{SecretNames: []string{"coder-tls"}}
	create(t, h.c, ccp)

	ccp = waitCondition(t, h.c, ns, "coder", coderv1alpha1.ConditionReconciled, metav1.ConditionFalse, coderv1alpha1.ReasonSecretNotFound)
	if ccp.Status.Phase != coderv1alpha1.PhasePending {
		t.Errorf("phase = %s, want Pending", ccp.Status.Phase)
	}
	ev := waitEvent(t, ns, "coder", corev1.EventTypeWarning, coderv1alpha1.ReasonSecretNotFound)
	if !containsAll(ev.Note, "coder-tls") {
		t.Errorf("event note %q does not name the Secret", ev.Note)
	}
	if want := "https://coder." + ns + ".svc.cluster.local"; ccp.Status.URL != want {
		t.Errorf("status.url = %q, want %q", ccp.Status.URL, want)
	}
	// The workload is in place already; the kubelet starts it once the
	// Secret exists.
	dep := getDeployment(t, h.c, ns, "coder")
	c := dep.Spec.Template.Spec.Containers[0]
	if e := findEnv(c.Env, "CODER_TLS_CERT_FILE"); len(e) != 1 || e[0].Value != tlsDir+"/coder-tls/tls.crt" {
		t.Errorf("CODER_TLS_CERT_FILE = %+v", e)
	}
	// No pod can run without the Secret, so coderd has no first user and
	// no Service yet.
	var svc corev1.Service
	if err := h.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "coder"}, &svc); !apierrors.IsNotFound(err) {
		t.Errorf("Service before coderd's first user: %v", err)
	}

	generation := ccp.Generation
	create(t, h.c, tlsSecret(t, ns, "coder-tls", "coder."+ns+".svc.cluster.local"))
	runPod(t, h.c, ns, "coder", fakePodIP)
	ccp = waitCondition(t, h.c, ns, "coder", coderv1alpha1.ConditionReconciled, metav1.ConditionTrue, coderv1alpha1.ReasonApplied)
	waitObject(t, h.c, ns, "coder", &svc)
	if len(svc.Spec.Ports) != 2 || svc.Spec.Ports[1].Port != 443 || svc.Spec.Ports[1].TargetPort.StrVal != "https" {
		t.Errorf("Service ports = %+v, want http and 443 -> https", svc.Spec.Ports)
	}
	if ccp.Generation != generation {
		t.Errorf("generation %d -> %d: the control plane was changed", generation, ccp.Generation)
	}
	if ccp.Status.Phase != coderv1alpha1.PhaseProvisioning {
		t.Errorf("phase = %s, want Provisioning (no pod runs here)", ccp.Status.Phase)
	}
	waitEvent(t, ns, "coder", corev1.EventTypeNormal, "Reconciled")
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !contains(s, sub) {
			return false
		}
	}
	return true
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

func TestAccessErrorIsAConditionNotACrash(t *testing.T) {
	ns := controllertest.Namespace(t, "accesserr")
	access := &fakeAccess{err: errors.New("operator access: implementation in progress")}
	h := startManager(t, []string{ns}, access, nil)

	ccp := newControlPlane(ns, "coder")
	ccp.Spec.ExternalURL = "https://coder.example.com"
	create(t, h.c, ccp)
	ccp = waitCondition(t, h.c, ns, "coder", coderv1alpha1.ConditionOperatorAccessReady, metav1.ConditionFalse, coderv1alpha1.ReasonAccessError)
	cond := apimeta.FindStatusCondition(ccp.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady)
	if !contains(cond.Message, "implementation in progress") {
		t.Errorf("message %q does not carry the error", cond.Message)
	}
	if a := apimeta.FindStatusCondition(ccp.Status.Conditions, coderv1alpha1.ConditionAvailable); a == nil || a.Status != metav1.ConditionUnknown {
		t.Errorf("Available = %+v, want Unknown: nothing reached coderd", a)
	}
	if ccp.Status.Phase != coderv1alpha1.PhaseProvisioning {
		t.Errorf("phase = %s, want Provisioning", ccp.Status.Phase)
	}

	// The access manager recovers: so does the control plane, without a
	// spec change (the failure is retried with backoff).
	access.set(readyAccess(), nil)
	ccp = waitCondition(t, h.c, ns, "coder", coderv1alpha1.ConditionOperatorAccessReady, metav1.ConditionTrue, coderv1alpha1.ReasonTokenValid)
	if ccp.Status.Phase != coderv1alpha1.PhaseReady {
		t.Errorf("phase = %s, want Ready", ccp.Status.Phase)
	}
}
