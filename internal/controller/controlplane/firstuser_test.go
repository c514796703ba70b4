package controlplane

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/controllertest"
	"github.com/coder/coder-k8s/internal/controller/operatoraccess"
	"github.com/coder/coder-k8s/internal/testenv"
)

// podNetwork stands in for the pod network: it listens at a loopback
// address as the pod IP, on coderd's container port, and forwards every
// connection to the real coderd the test runs.
func podNetwork(t *testing.T, coderd string, port int) string {
	t.Helper()
	var ln net.Listener
	var ip string
	for range 20 {
		ip = fmt.Sprintf("127.%d.%d.%d", 1+rand.IntN(250), rand.IntN(250), 1+rand.IntN(250))
		var err error
		if ln, err = net.Listen("tcp", net.JoinHostPort(ip, fmt.Sprint(port))); err == nil {
			break
		}
	}
	if ln == nil {
		t.Fatal("no free loopback address for the pod")
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer func() { _ = in.Close() }()
				out, err := net.Dial("tcp", coderd)
				if err != nil {
					return
				}
				defer func() { _ = out.Close() }()
				go func() { _, _ = io.Copy(out, in); _ = out.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(in, out)
			})
		}
	})
	return ip
}

// TestFirstUserSetupCannotBeRaced deploys a control plane with an Ingress
// and the real operator access manager against a real coderd (reached at
// a pod IP, as in a cluster): no Service or Ingress exists before coderd
// has its first user, which the operator creates at the ready pod; then
// both appear.
func TestFirstUserSetupCannotBeRaced(t *testing.T) {
	coder := testenv.NewCoder(t, testenv.CoderOptions{SkipFirstUser: true})
	podIP := podNetwork(t, coder.URL.Host, httpPort)
	ns := controllertest.Namespace(t, "setup")
	ctx := t.Context()
	anon := coderapi.NewClient(coder.URL, "", 5*time.Second, coderapi.Target{})

	// Every Service and Ingress that appears in the namespace, and whether
	// coderd had its first user at that moment.
	type seen struct {
		kind, name string
		firstUser  bool
	}
	var mu sync.Mutex
	var appeared []seen
	cs := controllertest.Kube().Clientset
	for kind, w := range map[string]func() (watch.Interface, error){
		"Service": func() (watch.Interface, error) { return cs.CoreV1().Services(ns).Watch(ctx, metav1.ListOptions{}) },
		"Ingress": func() (watch.Interface, error) {
			return cs.NetworkingV1().Ingresses(ns).Watch(ctx, metav1.ListOptions{})
		},
	} {
		wi, err := w()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(wi.Stop)
		go func() {
			for ev := range wi.ResultChan() {
				if ev.Type != watch.Added {
					continue
				}
				obj, ok := ev.Object.(metav1.Object)
				if !ok {
					continue
				}
				has, err := anon.HasFirstUser(ctx)
				mu.Lock()
				appeared = append(appeared, seen{kind: kind, name: obj.GetName(), firstUser: has && err == nil})
				mu.Unlock()
			}
		}()
	}

	mgr := controllertest.NewManager(t, controllertest.Kube().Config, ns)
	access := &operatoraccess.Manager{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("operator-access"), Timeout: 15 * time.Second}
	if err := (&Reconciler{Access: access}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	controllertest.StartManager(t, mgr)

	c := controllertest.Client(t)
	ccp := newControlPlane(ns, "coder")
	ccp.Spec.Expose = &coderv1alpha1.ExposeSpec{Ingress: &coderv1alpha1.IngressSpec{Host: "coder.example.com"}}
	create(t, c, ccp)

	ccp = waitCondition(t, c, ns, "coder", coderv1alpha1.ConditionInitialized, metav1.ConditionFalse, coderv1alpha1.ReasonAwaitingFirstUser)
	waitCondition(t, c, ns, "coder", coderv1alpha1.ConditionExposed, metav1.ConditionFalse, coderv1alpha1.ReasonAwaitingFirstUser)
	getDeployment(t, c, ns, "coder")
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "coder"}, &corev1.Service{}); !apierrors.IsNotFound(err) {
		t.Errorf("Service before setup: %v", err)
	}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "coder"}, &networkingv1.Ingress{}); !apierrors.IsNotFound(err) {
		t.Errorf("Ingress before setup: %v", err)
	}
	if has, err := anon.HasFirstUser(ctx); err != nil || has {
		t.Fatalf("coderd has a first user before any pod ran (%v, %v)", has, err)
	}
	if cond := apimeta.FindStatusCondition(ccp.Status.Conditions, coderv1alpha1.ConditionInitialized); !strings.Contains(cond.Message, "no coderd pod is ready") {
		t.Errorf("Initialized message %q does not say what it waits for", cond.Message)
	}

	runPod(t, c, ns, "coder", podIP)
	ccp = waitConditionFor(t, 90*time.Second, c, ns, "coder", coderv1alpha1.ConditionInitialized, metav1.ConditionTrue, coderv1alpha1.ReasonFirstUserExists)
	waitObject(t, c, ns, "coder", &corev1.Service{})
	waitObject(t, c, ns, "coder", &networkingv1.Ingress{})
	if has, err := anon.HasFirstUser(ctx); err != nil || !has {
		t.Fatalf("coderd has no first user after setup (%v, %v)", has, err)
	}
	eventually(t, 10*time.Second, "both appearances recorded", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(appeared) < 2 {
			return fmt.Errorf("seen %v", appeared)
		}
		return nil
	})
	mu.Lock()
	for _, s := range appeared {
		if !s.firstUser {
			t.Errorf("%s %s appeared while coderd had no first user", s.kind, s.name)
		}
	}
	mu.Unlock()

	// The credentials belong to coderd's URL, not to the pod's address.
	admin := &corev1.Secret{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "coder-admin"}, admin); err != nil {
		t.Fatalf("first user Secret: %v", err)
	}
	if got := admin.Annotations[coderapi.AnnotationCoderURL]; got != ccp.Status.URL {
		t.Errorf("first user Secret bound to %q, want the control plane's URL %q", got, ccp.Status.URL)
	}
	if ccp.Status.OperatorTokenSecretRef == nil {
		t.Fatal("no operator token after setup")
	}
	tok := &corev1.Secret{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: ccp.Status.OperatorTokenSecretRef.Name}, tok); err != nil {
		t.Fatal(err)
	}
	if got := tok.Annotations[coderapi.AnnotationCoderURL]; got != ccp.Status.URL {
		t.Errorf("operator token Secret bound to %q, want %q", got, ccp.Status.URL)
	}
	if _, err := coderapi.NewClient(coder.URL, string(tok.Data[coderapi.TokenKey]), 5*time.Second, coderapi.Target{}).User(ctx, "me"); err != nil {
		t.Errorf("coderd rejects the operator token issued at setup: %v", err)
	}
	waitEvent(t, ns, "coder", corev1.EventTypeNormal, "Initialized")
}
