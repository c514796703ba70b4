package records_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/kubecache"
	"github.com/coder/coder-k8s/internal/scheme"
	"github.com/coder/coder-k8s/internal/testenv"
)

// A record survives kube-apiserver as written (field sets included, which
// a CRD schema would prune), is read from the informer, and stale writes
// conflict.
func TestStoreRoundTrip(t *testing.T) {
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sch := scheme.New()
	co := kubecache.Options()
	co.Scheme = sch
	c, err := cache.New(k.Config, co)
	if err != nil {
		t.Fatal(err)
	}
	w, err := client.New(k.Config, client.Options{Scheme: sch})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	s := records.New(c, w)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	changes := make(chan string, 16)
	if err := s.OnChange(ctx, func(r *records.Record, deleted bool) {
		if deleted {
			changes <- "deleted " + r.Name
			return
		}
		changes <- "changed " + r.Name
	}); err != nil {
		t.Fatal(err)
	}
	if err := w.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team"}}); err != nil {
		t.Fatal(err)
	}

	key := records.Key{Namespace: "team", Resource: "coderworkspaces", ControlPlane: "coder", CoderID: "0C8A2B39-5C8D-4E0F-9A43-0B9C7F2A1D11"}
	if got, want := key.Name(), "workspace.coder.0c8a2b39-5c8d-4e0f-9a43-0b9c7f2a1d11"; got != want {
		t.Fatalf("record name = %q, want %q", got, want)
	}
	mf := []metav1.ManagedFieldsEntry{{
		Manager: "argocd-controller", Operation: metav1.ManagedFieldsOperationApply, APIVersion: "aggregation.coder.com/v1alpha1",
		FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:labels":{"f:team":{}}}}`),
	}}
	r := &records.Record{}
	r.Spec.Name = "coder.admin.demo"
	r.Spec.Labels = map[string]string{"team": "a"}
	r.Spec.ManagedFields = mf
	if err := s.Save(ctx, r, key); err != nil {
		t.Fatal(err)
	}
	stale := r.DeepCopy()

	var got *records.Record
	deadline := time.Now().Add(10 * time.Second)
	for got == nil && time.Now().Before(deadline) {
		if got, err = s.Get(ctx, key); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got == nil {
		t.Fatal("the record never reached the cache")
	}
	if got.Spec.Generation != 1 || got.Spec.CoderID != "0c8a2b39-5c8d-4e0f-9a43-0b9c7f2a1d11" || got.Spec.Labels["team"] != "a" {
		t.Errorf("cached record spec = %+v", got.Spec)
	}
	back := got.Spec.ManagedFields
	if len(back) != 1 || back[0].FieldsV1.GetRawString() != mf[0].FieldsV1.GetRawString() || back[0].Operation != metav1.ManagedFieldsOperationApply {
		t.Errorf("managed fields after a round trip = %+v, want %+v", back, mf)
	}

	next := got.DeepCopy()
	next.Spec.Labels["team"] = "b"
	if err := s.Save(ctx, next, key); err != nil {
		t.Fatal(err)
	}
	stale.Spec.Labels["team"] = "c"
	if err := s.Save(ctx, stale, key); !apierrors.IsConflict(err) {
		t.Errorf("saving a stale record: %v, want a conflict", err)
	}
	if err := s.Delete(ctx, stale); !apierrors.IsConflict(err) {
		t.Errorf("deleting a stale record: %v, want a conflict", err)
	}
	if err := s.Delete(ctx, next); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, next); err != nil {
		t.Errorf("deleting a record already gone: %v", err)
	}

	want := []string{"changed " + key.Name(), "changed " + key.Name(), "deleted " + key.Name()}
	for _, w := range want {
		select {
		case got := <-changes:
			if got != w {
				t.Errorf("change = %q, want %q", got, w)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no change %q", w)
		}
	}
}
