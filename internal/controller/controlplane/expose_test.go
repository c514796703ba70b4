package controlplane

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/controllertest"
)

func TestExposeIngress(t *testing.T) {
	ns := controllertest.Namespace(t, "ingress")
	h := startManager(t, []string{ns}, nil, nil)
	ctx := context.Background()

	ccp := newControlPlane(ns, "coder")
	ccp.Spec.Expose = &coderv1alpha1.ExposeSpec{Ingress: &coderv1alpha1.IngressSpec{
		ClassName:     "nginx",
		Host:          "coder.example.com",
		WildcardHost:  "*.coder.example.com",
		Annotations:   map[string]string{"cert-manager.io/cluster-issuer": "letsencrypt"},
		TLSSecretName: "coder-ingress-tls",
	}}
	create(t, h.c, ccp)
	runPod(t, h.c, ns, "coder", fakePodIP)
	ccp = getCCP(t, h.c, ns, "coder")

	var ing networkingv1.Ingress
	eventually(t, 30*time.Second, "Ingress", func() error {
		return h.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "coder"}, &ing)
	})
	requireControlledBy(t, &ing, ccp)
	if ptr.Deref(ing.Spec.IngressClassName, "") != "nginx" || ing.Annotations["cert-manager.io/cluster-issuer"] != "letsencrypt" {
		t.Errorf("Ingress class %v annotations %v", ing.Spec.IngressClassName, ing.Annotations)
	}
	if len(ing.Spec.Rules) != 2 || ing.Spec.Rules[0].Host != "coder.example.com" || ing.Spec.Rules[1].Host != "*.coder.example.com" {
		t.Fatalf("Ingress rules = %+v, want the host and the wildcard host", ing.Spec.Rules)
	}
	backend := ing.Spec.Rules[0].HTTP.Paths[0].Backend.Service
	if backend.Name != "coder" || backend.Port.Name != "http" {
		t.Errorf("Ingress backend = %+v, want Service coder port http", backend)
	}
	if len(ing.Spec.TLS) != 1 || ing.Spec.TLS[0].SecretName != "coder-ingress-tls" || len(ing.Spec.TLS[0].Hosts) != 2 {
		t.Errorf("Ingress TLS = %+v", ing.Spec.TLS)
	}
	waitCondition(t, h.c, ns, "coder", coderv1alpha1.ConditionExposed, metav1.ConditionTrue, coderv1alpha1.ReasonIngressApplied)

	updateCCP(t, h.c, ns, "coder", func(ccp *coderv1alpha1.CoderControlPlane) { ccp.Spec.Expose = nil })
	eventually(t, 30*time.Second, "Ingress removed", func() error {
		err := h.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "coder"}, &networkingv1.Ingress{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	ccp = waitCondition(t, h.c, ns, "coder", coderv1alpha1.ConditionReconciled, metav1.ConditionTrue, "")
	if c := apimeta.FindStatusCondition(ccp.Status.Conditions, coderv1alpha1.ConditionExposed); c != nil {
		t.Errorf("condition Exposed %+v remains without spec.expose", c)
	}
}

func TestExposeHTTPRouteWithoutAndWithGatewayAPI(t *testing.T) {
	ns := controllertest.Namespace(t, "route")
	h := startManager(t, []string{ns}, nil, nil)
	ctx := context.Background()

	ccp := newControlPlane(ns, "coder")
	ccp.Spec.Expose = &coderv1alpha1.ExposeSpec{HTTPRoute: &coderv1alpha1.HTTPRouteSpec{
		ParentRefs: []coderv1alpha1.GatewayReference{{Name: "public", Namespace: "gateways", SectionName: "https"}},
		Hostnames:  []string{"coder.example.com"},
	}}
	create(t, h.c, ccp)
	runPod(t, h.c, ns, "coder", fakePodIP)

	// Without the Gateway API the rest is deployed and the condition says
	// why there is no route.
	ccp = waitCondition(t, h.c, ns, "coder", coderv1alpha1.ConditionExposed, metav1.ConditionFalse, coderv1alpha1.ReasonGatewayAPINotInstalled)
	getDeployment(t, h.c, ns, "coder")
	if !apimeta.IsStatusConditionTrue(ccp.Status.Conditions, coderv1alpha1.ConditionReconciled) {
		t.Errorf("Reconciled not True: %+v", ccp.Status.Conditions)
	}
	waitEvent(t, ns, "coder", corev1.EventTypeWarning, coderv1alpha1.ReasonGatewayAPINotInstalled)

	// Installing the Gateway API later is noticed without a spec change.
	crd := httpRouteCRD()
	if err := h.c.Create(ctx, crd); err != nil {
		t.Fatalf("create HTTPRoute CRD: %v", err)
	}
	t.Cleanup(func() {
		_ = h.c.Delete(context.Background(), httpRouteCRD())
		eventually(t, 30*time.Second, "HTTPRoute CRD deleted", func() error {
			err := h.c.Get(context.Background(), client.ObjectKey{Name: "httproutes.gateway.networking.k8s.io"}, httpRouteCRD())
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there (%v)", err)
			}
			return nil
		})
	})
	waitCondition(t, h.c, ns, "coder", coderv1alpha1.ConditionExposed, metav1.ConditionTrue, coderv1alpha1.ReasonHTTPRouteApplied)
	route := newHTTPRoute()
	if err := h.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "coder"}, route); err != nil {
		t.Fatalf("HTTPRoute: %v", err)
	}
	parents, _, _ := unstructured.NestedSlice(route.Object, "spec", "parentRefs")
	hosts, _, _ := unstructured.NestedStringSlice(route.Object, "spec", "hostnames")
	rules, _, _ := unstructured.NestedSlice(route.Object, "spec", "rules")
	if len(parents) != 1 || parents[0].(map[string]any)["name"] != "public" || parents[0].(map[string]any)["sectionName"] != "https" ||
		!slices.Equal(hosts, []string{"coder.example.com"}) || len(rules) != 1 {
		t.Errorf("HTTPRoute spec = %v", route.Object["spec"])
	}
	backends, _, _ := unstructured.NestedSlice(rules[0].(map[string]any), "backendRefs")
	if len(backends) != 1 || backends[0].(map[string]any)["name"] != "coder" || backends[0].(map[string]any)["port"] != int64(80) {
		t.Errorf("HTTPRoute backends = %v, want Service coder port 80", backends)
	}
	if ref := metav1.GetControllerOf(route); ref == nil || ref.Name != "coder" {
		t.Errorf("HTTPRoute owner = %+v", ref)
	}

	// Removing expose removes the route.
	updateCCP(t, h.c, ns, "coder", func(ccp *coderv1alpha1.CoderControlPlane) { ccp.Spec.Expose = nil })
	eventually(t, 30*time.Second, "HTTPRoute removed", func() error {
		err := h.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "coder"}, newHTTPRoute())
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
}
