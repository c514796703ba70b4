package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/coder/coder-k8s/internal/testenv"
)

// Tunables of BenchmarkMemory.
const (
	// memoryObjects is how many objects of each unrelated kind (Secrets,
	// Deployments, ConfigMaps) the loaded cluster holds.
	memoryObjects = 5000
	// memoryNamespaces spreads them, as tenants would.
	memoryNamespaces = 5
	// memoryWorkers create them in parallel.
	memoryWorkers = 8
	// memoryRounds is how many times the binary is started on each
	// cluster; the figures are medians.
	memoryRounds = 3
	// memoryTarget is the largest loaded/empty RSS ratio that meets the
	// target: objects coder-k8s does not own must not cost memory.
	memoryTarget = 1.10
)

// BenchmarkMemory measures the resident memory of the coder-k8s binary in
// all mode (the chart's default: controller, aggregated API server and
// MCP server in one process) against the real kube-apiserver, first in an
// empty cluster, then in the same cluster holding memoryObjects Secrets,
// Deployments and ConfigMaps that coder-k8s does not own, each created
// the way `kubectl apply` creates objects (with the last-applied
// annotation, which holds a Secret's data). The figure is VmRSS
// startupIdle after every /readyz answers 200 (caches synced), the
// median over memoryRounds starts; the target is a loaded/empty ratio of
// at most memoryTarget.
//
//	make bench-memory   # or: go test ./test/e2e -run '^$' -bench '^BenchmarkMemory$' -benchtime 1x
func BenchmarkMemory(b *testing.B) {
	k := testenv.NewKubeAPI(b, testenv.KubeAPIOptions{})
	ctx := context.Background()
	// autoTLS keeps its Secret and writes its CA into the APIService
	// there, as the chart sets it up.
	if err := k.EnsureNamespace(ctx, aggServiceNamespace); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	empty := memoryMedian(b, k)

	start := time.Now()
	fillCluster(b, k)
	fill := time.Since(start)

	loaded := memoryMedian(b, k)
	ratio := loaded.mib("VmRSS") / empty.mib("VmRSS")
	b.ReportMetric(empty.mib("VmRSS"), "rss-empty-MiB")
	b.ReportMetric(loaded.mib("VmRSS"), "rss-loaded-MiB")
	b.ReportMetric(ratio, "rss-ratio")
	b.ReportMetric(fill.Seconds(), "fill-s")
	fmt.Printf("memory: rss empty cluster=%.1f MiB (anonymous %.1f MiB), with %d unrelated Secrets, Deployments and ConfigMaps each=%.1f MiB (anonymous %.1f MiB); ratio=%.3f (target ≤ %.2f); median VmRSS %s after ready over %d starts each in all mode; the objects took %s to create\n",
		empty.mib("VmRSS"), empty.mib("RssAnon"), memoryObjects, loaded.mib("VmRSS"), loaded.mib("RssAnon"),
		ratio, memoryTarget, startupIdle, memoryRounds, fill.Round(time.Second))
}

// memoryMedian starts the binary memoryRounds times against k and
// returns the start with the median VmRSS.
func memoryMedian(b *testing.B, k *testenv.KubeAPI) procStatus {
	b.Helper()
	samples := make([]procStatus, 0, memoryRounds)
	for range memoryRounds {
		samples = append(samples, startOnce(b, k).rss)
	}
	rss := make([]float64, len(samples))
	for i, s := range samples {
		rss[i] = s.mib("VmRSS")
	}
	m := median(rss)
	best := samples[0]
	for _, s := range samples {
		if math.Abs(s.mib("VmRSS")-m) < math.Abs(best.mib("VmRSS")-m) {
			best = s
		}
	}
	return best
}

// fillCluster creates memoryObjects Secrets, Deployments and ConfigMaps
// in memoryNamespaces namespaces with memoryWorkers parallel clients.
func fillCluster(b *testing.B, k *testenv.KubeAPI) {
	b.Helper()
	ctx := context.Background()
	cfg := rest.CopyConfig(k.Config)
	cfg.QPS, cfg.Burst = 2000, 4000
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	for n := range memoryNamespaces {
		if err := k.EnsureNamespace(ctx, "tenant-"+strconv.Itoa(n)); err != nil {
			b.Fatal(err)
		}
	}
	jobs := make(chan int)
	var failed atomic.Value
	var wg sync.WaitGroup
	for range memoryWorkers {
		wg.Go(func() {
			for i := range jobs {
				if err := createUnrelated(ctx, cs, i); err != nil {
					failed.CompareAndSwap(nil, err)
				}
			}
		})
	}
	for i := range memoryObjects {
		if failed.Load() != nil {
			break
		}
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
}

// createUnrelated creates the i-th Secret, Deployment and ConfigMap, as
// `kubectl apply -f` of a manifest would (client-side apply keeps the
// manifest in an annotation).
func createUnrelated(ctx context.Context, cs kubernetes.Interface, i int) error {
	ns := "tenant-" + strconv.Itoa(i%memoryNamespaces)
	name := "app-" + strconv.Itoa(i)
	labels := map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "kubectl"}

	// A TLS-sized Secret (certificate chain and key).
	secret := &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-tls", Labels: labels},
		Type:       corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			"tls.crt": []byte(strings.Repeat("C", 1500)),
			"tls.key": []byte(strings.Repeat("K", 1700)),
		},
	}
	cm := &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-config", Labels: labels},
		Data:       map[string]string{"config.yaml": strings.Repeat("key: value\n", 100)},
	}
	sel := map[string]string{"app.kubernetes.io/name": name}
	dep := &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: sel},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: sel},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name:  "app",
					Image: "registry.example.com/team/app:1.2.3",
					Args:  []string{"--config", "/etc/app/config.yaml"},
					Env:   []corev1.EnvVar{{Name: "LOG_LEVEL", Value: "info"}, {Name: "PORT", Value: "8080"}},
					Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
						corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi"),
					}},
					VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/app"}, {Name: "tls", MountPath: "/etc/tls"}},
				}},
					Volumes: []corev1.Volume{
						{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: cm.Name}}}},
						{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret.Name}}},
					},
				},
			},
		},
	}
	for _, o := range []metav1.Object{secret, cm, dep} {
		raw, err := json.Marshal(o)
		if err != nil {
			return err
		}
		o.SetAnnotations(map[string]string{corev1.LastAppliedConfigAnnotation: string(raw)})
	}
	opts := metav1.CreateOptions{FieldManager: "kubectl-client-side-apply"}
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, secret, opts); err != nil {
		return fmt.Errorf("create Secret %s/%s: %w", ns, secret.Name, err)
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, opts); err != nil {
		return fmt.Errorf("create ConfigMap %s/%s: %w", ns, cm.Name, err)
	}
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, dep, opts); err != nil {
		return fmt.Errorf("create Deployment %s/%s: %w", ns, dep.Name, err)
	}
	return nil
}
