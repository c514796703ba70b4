package controlplane

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/operatoraccess"
	"github.com/coder/coder-k8s/internal/controller/reconcile"
)

// First-user setup of a deployed coderd. Whoever creates coderd's first
// user owns it, so the operator does that before anyone else can reach
// coderd: until the first user exists there is no Service, Ingress or
// HTTPRoute, and the operator talks to a ready coderd pod directly, at its
// pod IP and container port (reachable from the operator's pod as from
// any pod of the cluster network). Someone who may create pods in the
// namespace could put a pod with coderd's labels there for the operator
// to find; they gain nothing: such a user can already mount the
// namespace's Secrets, the first user's included.

// The operator lists coderd's pods (uncached, by its label selector) to
// find one to set up.
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list

// How soon a coderd waiting for its first user is looked at again. Its
// pods are not watched: the Deployment is, and its readyReplicas change
// when a pod becomes ready, so without a ready replica the pods are not
// listed and only a slow recheck stands in for a missed event.
const (
	setupRecheck     = 5 * time.Second
	setupIdleRecheck = time.Minute
)

// initialized reports whether the deployed coderd of ccp is known to have
// its first user: its Initialized condition says so, or its Service, which
// the operator creates only then (or created before it withheld the
// Service until setup), exists.
func (r *Reconciler) initialized(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) (bool, error) {
	if apimeta.IsStatusConditionTrue(ccp.Status.Conditions, coderv1alpha1.ConditionInitialized) {
		return true, nil
	}
	var svc corev1.Service
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: ccp.Namespace, Name: ccp.Name}, &svc)
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("get Service %s/%s: %w", ccp.Namespace, ccp.Name, err)
	}
	if !metav1.IsControlledBy(&svc, ccp) {
		return false, nil
	}
	reconcile.SetCondition(ccp, coderv1alpha1.ConditionInitialized, metav1.ConditionTrue, coderv1alpha1.ReasonFirstUserExists,
		"coderd has its first user; its Service exists")
	return true, nil
}

// reconcileSetup runs operator access against a ready coderd pod of a
// deployed coderd that has no first user yet, and sets Initialized. It
// returns when to check again and whether coderd now has its first user.
func (r *Reconciler) reconcileSetup(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) (time.Duration, bool) {
	const withheld = "the operator creates coderd's Service, Ingress and HTTPRoute only once coderd has its first user, so that nobody else can claim coderd first"
	var dial string
	var err error
	recheck := setupRecheck
	if r.readyReplicas(ctx, ccp) == 0 {
		recheck = setupIdleRecheck
	} else {
		dial, err = r.readyPodURL(ctx, ccp)
	}
	if err != nil || dial == "" {
		why := "no coderd pod is ready yet"
		if err != nil {
			why = err.Error()
		}
		reconcile.SetCondition(ccp, coderv1alpha1.ConditionInitialized, metav1.ConditionFalse, coderv1alpha1.ReasonAwaitingFirstUser, withheld+"; "+why)
		if ccp.Spec.OperatorAccess.Disabled {
			reconcile.SetCondition(ccp, coderv1alpha1.ConditionOperatorAccessReady, metav1.ConditionFalse, coderv1alpha1.ReasonDisabled,
				"operator access is disabled (spec.operatorAccess.disabled)")
		} else {
			reconcile.SetCondition(ccp, coderv1alpha1.ConditionOperatorAccessReady, metav1.ConditionFalse, coderv1alpha1.ReasonAwaitingFirstUser,
				"the operator sets up coderd's first user at a ready coderd pod; "+why)
		}
		return recheck, false
	}
	after, res := r.reconcileAccess(ctx, ccp, operatoraccess.Endpoint{URL: ccp.Status.URL, Dial: dial})
	if res.FirstUser {
		reconcile.SetCondition(ccp, coderv1alpha1.ConditionInitialized, metav1.ConditionTrue, coderv1alpha1.ReasonFirstUserExists,
			"coderd has its first user; its Service, Ingress and HTTPRoute may exist")
		return after, true
	}
	msg := withheld + "; the operator sets it up at pod address " + dial
	if ccp.Spec.OperatorAccess.Disabled {
		msg = withheld + "; operator access is disabled (spec.operatorAccess.disabled): create the first user yourself, e.g. through " +
			"`kubectl port-forward deployment/" + ccp.Name + " 8080` and http://localhost:8080"
	}
	reconcile.SetCondition(ccp, coderv1alpha1.ConditionInitialized, metav1.ConditionFalse, coderv1alpha1.ReasonAwaitingFirstUser, msg)
	return minPositive(after, setupRecheck), false
}

// readyReplicas is what coderd's Deployment (from the cache) reports;
// 0 when it cannot be read.
func (r *Reconciler) readyReplicas(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) int32 {
	var dep appsv1.Deployment
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: ccp.Namespace, Name: ccp.Name}, &dep); err != nil {
		return 0
	}
	return dep.Status.ReadyReplicas
}

// readyPodURL is the base URL of a ready coderd pod of ccp ("" when none):
// its pod IP and the container's HTTP port. The pods are listed from the
// API server, restricted to ccp's namespace and coderd's pod labels.
func (r *Reconciler) readyPodURL(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) (string, error) {
	var pods corev1.PodList
	if err := r.APIReader.List(ctx, &pods, client.InNamespace(ccp.Namespace), client.MatchingLabels(selectorLabels(ccp))); err != nil {
		return "", fmt.Errorf("list coderd pods: %w", err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil || p.Status.PodIP == "" || !podReady(p) {
			continue
		}
		if port := httpContainerPort(p); port != 0 {
			return "http://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port))), nil
		}
	}
	return "", nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// httpContainerPort is the coderd container's HTTP port (0 when absent).
func httpContainerPort(p *corev1.Pod) int32 {
	for _, c := range p.Spec.Containers {
		if c.Name != containerName {
			continue
		}
		for _, port := range c.Ports {
			if port.Name == httpPortName {
				return port.ContainerPort
			}
		}
	}
	return 0
}
