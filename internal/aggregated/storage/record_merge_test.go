package storage

import (
	"fmt"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/registry/rest"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/testenv"
)

// TestRecordMergeKeepsNewerObject: a record's change is merged into the
// cached template, and an update's answer stored while that merge runs
// stays: the cache ends with the update's build under way and the
// changed metadata, not with the template as it was before the update
// (its previous build shown as current, which nothing would correct
// until the next poll: the CI failure of TestPromoterHungCoderd).
//
// A label set on the template changes its record; while the record
// event's merge runs (after it read the cached object, before it stores
// the merge), the test updates the template's files, whose answer shows
// the new version building.
func TestRecordMergeKeepsNewerObject(t *testing.T) {
	ts := newTemplateStack(t, "merging", "merging")
	ctx, cancel, rctx, s, name, tpl := ts.ctx, ts.cancel, ts.rctx, ts.s, ts.name, ts.tpl
	if err := waitImported(ctx, ts.coder, tpl.Status.ActiveVersionID); err != nil {
		t.Fatal(err)
	}

	// The update made while the label's merge runs, and its answer.
	var once sync.Once
	updated := make(chan error, 1)
	var building string
	s.recordMerged = func(rec *records.Record) {
		if rec.Spec.Labels["merge"] != "label" {
			return
		}
		once.Do(func() {
			cur, err := s.Get(rctx, name, &metav1.GetOptions{})
			if err != nil {
				updated <- err
				return
			}
			next := cur.(*aggv1.CoderTemplate).DeepCopy()
			next.Spec.Files = map[string]string{"main.tf": "output \"n\" {\n  value = 1\n}\n"}
			out, _, err := s.Update(rctx, name, rest.DefaultUpdatedObjectInfo(next), nil, nil, false, &metav1.UpdateOptions{})
			if err == nil {
				building = out.(*aggv1.CoderTemplate).Status.BuildingVersionID
				if building == "" {
					err = fmt.Errorf("the update's answer shows no building version")
				}
			}
			updated <- err
		})
	}
	done := make(chan struct{})
	go func() { s.genericStore.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	cur, err := s.Get(rctx, name, &metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	next := cur.(*aggv1.CoderTemplate).DeepCopy()
	next.Labels = map[string]string{"merge": "label"}
	if _, _, err := s.Update(rctx, name, rest.DefaultUpdatedObjectInfo(next), nil, nil, false, &metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-updated:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("no merge of the labelled record ran within 2m")
	}
	// Without the fix the merge stores the template as it was before the
	// update (with the label), and nothing corrects it before the next
	// poll, an hour away.
	testenv.WaitFor(t, 15*time.Second, func() error {
		var got *aggv1.CoderTemplate
		objs, _ := s.cache.Snapshot(nil)
		for _, o := range objs {
			if o.GetName() == name {
				got = o.(*aggv1.CoderTemplate)
			}
		}
		if got == nil {
			return fmt.Errorf("the template is not cached")
		}
		if got.Status.BuildingVersionID != building || readyOf(got) != "False Building" || got.Labels["merge"] != "label" {
			c := readyCondition(got)
			return fmt.Errorf("the cache shows active=%s building=%s Ready=%s %s labels=%v; want building=%s Ready=False Building with label merge=label (the update's answer, merged)",
				got.Status.ActiveVersionID, got.Status.BuildingVersionID, c.Status, c.Reason, got.Labels, building)
		}
		return nil
	})
}
