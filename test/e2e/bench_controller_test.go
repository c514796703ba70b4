package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/scheme"
	"github.com/coder/coder-k8s/internal/testenv"
)

// BenchmarkController measures how fast the controller (the built binary in
// controller mode) brings 100 CoderControlPlanes to what it writes before
// coderd has its first user (ServiceAccount, Deployment, workspace
// RoleBinding; the Service waits for a ready pod, which this stack has no
// kubelet to run) with a current observedGeneration and Initialized=False
// AwaitingFirstUser, against a reference measured in the same run: writing
// the same 100 ServiceAccounts, Deployments and RoleBindings directly. It then
// counts the controller's writes per object over a minute of steady state
// (goal: 0), from when its writes after converging have stopped.
//
//	make bench-controller
func BenchmarkController(b *testing.B) {
	const n = 100
	steady := time.Minute
	if d, err := time.ParseDuration(os.Getenv("BENCH_STEADY_STATE")); err == nil {
		steady = d
	}
	k := testenv.NewKubeAPI(b, testenv.KubeAPIOptions{})
	ctx := context.Background()
	c, err := client.New(k.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		b.Fatal(err)
	}
	for _, ns := range []string{"reference", "bench"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			b.Fatal(err)
		}
	}

	// Reference: the same objects written by a client, no controller.
	start := time.Now()
	parallel(n, func(i int) error {
		name := "coder-" + strconv.Itoa(i)
		labels := map[string]string{"app": name}
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "reference"},
			Spec: appsv1.DeploymentSpec{
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "coder", Image: "ghcr.io/coder/coder:v2.30.0"}}},
				},
			},
		}
		if err := c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "reference"}}); err != nil {
			return err
		}
		if err := c.Create(ctx, d); err != nil {
			return err
		}
		return c.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-workspace", Namespace: "reference"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "coder-k8s-workspace"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: "reference"}},
		})
	}, b)
	reference := time.Since(start)

	// BENCH_KUBE_QPS raises the operator's client rate limit (default
	// kubernetes.qps 50) to see what the controller does unthrottled.
	qps, _ := strconv.Atoi(os.Getenv("BENCH_KUBE_QPS"))
	op := StartOperator(b, OperatorOptions{Mode: "controller", Kubeconfig: k.KubeconfigPath, KubeQPS: qps})
	op.WaitOK(b, op.Health+"/readyz")

	b.ResetTimer()
	start = time.Now()
	parallel(n, func(i int) error {
		return c.Create(ctx, &coderv1alpha1.CoderControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "coder-" + strconv.Itoa(i), Namespace: "bench"}})
	}, b)
	for {
		if converged(ctx, b, c, n) {
			break
		}
		if time.Since(start) > 5*time.Minute {
			b.Fatalf("not converged after 5 minutes; operator log tail:\n%s", op.LogTail(30))
		}
		time.Sleep(100 * time.Millisecond)
	}
	controller := time.Since(start)
	b.StopTimer()

	// Steady state: every write the controller makes shows up as a watch
	// event, counted from the resourceVersion of a list taken now. The
	// count starts once the writes that follow convergence (status
	// updates after the last observedGeneration, and what they trigger)
	// have stopped for settleQuiet.
	var writes atomic.Int64
	var lastWrite atomic.Int64 // UnixNano
	settleStart := time.Now()
	lastWrite.Store(settleStart.UnixNano())
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := client.NewWithWatch(k.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, list := range []client.ObjectList{
		&coderv1alpha1.CoderControlPlaneList{}, &appsv1.DeploymentList{}, &corev1.ServiceList{},
		&corev1.ServiceAccountList{}, &corev1.SecretList{}, &rbacv1.RoleList{}, &rbacv1.RoleBindingList{},
	} {
		if err := w.List(ctx, list, client.InNamespace("bench")); err != nil {
			b.Fatal(err)
		}
		rv := list.(metav1.ListInterface).GetResourceVersion()
		wi, err := w.Watch(wctx, list, client.InNamespace("bench"), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer wi.Stop()
			for {
				select {
				case <-wctx.Done():
					return
				case ev, ok := <-wi.ResultChan():
					if !ok {
						return
					}
					if ev.Type != watch.Bookmark && ev.Type != watch.Error {
						writes.Add(1)
						lastWrite.Store(time.Now().UnixNano())
					}
				}
			}
		}()
	}
	const settleQuiet, settleMax = 5 * time.Second, 2 * time.Minute
	for time.Since(time.Unix(0, lastWrite.Load())) < settleQuiet {
		if time.Since(settleStart) > settleMax {
			b.Logf("the controller kept writing for %s after converging (%d writes); measuring anyway", settleMax, writes.Load())
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	settled, settleWrites := time.Since(settleStart), writes.Load()
	time.Sleep(steady)
	steadyWrites := writes.Load() - settleWrites
	cancel()
	wg.Wait()

	ratio := controller.Seconds() / reference.Seconds()
	b.ReportMetric(controller.Seconds(), "s/100-control-planes")
	b.ReportMetric(ratio, "ratio")
	b.ReportMetric(reference.Seconds(), "direct-writes-s")
	b.ReportMetric(float64(steadyWrites)/n, "steady-writes/CR")
	fmt.Printf("controller: %d control planes converged in %s; reference (%d ServiceAccounts+Deployments+RoleBindings written directly) %s; ratio=%.2f\n",
		n, controller.Round(time.Millisecond), n, reference.Round(time.Millisecond), ratio)
	fmt.Printf("controller: steady-state API writes per CR over %s: %.2f (goal 0), counted from %s after convergence (%d writes until then, none in the %s before)\n",
		steady, float64(steadyWrites)/n, settled.Round(time.Millisecond), settleWrites, settleQuiet)
}

func converged(ctx context.Context, b *testing.B, c client.Client, n int) bool {
	var ccps coderv1alpha1.CoderControlPlaneList
	if err := c.List(ctx, &ccps, client.InNamespace("bench")); err != nil {
		b.Fatal(err)
	}
	var deps appsv1.DeploymentList
	if err := c.List(ctx, &deps, client.InNamespace("bench")); err != nil {
		b.Fatal(err)
	}
	var rbs rbacv1.RoleBindingList
	if err := c.List(ctx, &rbs, client.InNamespace("bench")); err != nil {
		b.Fatal(err)
	}
	if len(ccps.Items) != n || len(deps.Items) < n || len(rbs.Items) < n {
		return false
	}
	for _, ccp := range ccps.Items {
		init := apimeta.FindStatusCondition(ccp.Status.Conditions, coderv1alpha1.ConditionInitialized)
		if ccp.Status.ObservedGeneration != ccp.Generation || init == nil || init.Reason != coderv1alpha1.ReasonAwaitingFirstUser {
			return false
		}
	}
	return true
}

// parallel runs f for 0..n-1 on 10 workers.
func parallel(n int, f func(i int) error, b *testing.B) {
	b.Helper()
	if err := testenv.Parallel(n, 10, f); err != nil {
		b.Fatal(err)
	}
}
