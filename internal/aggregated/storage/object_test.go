package storage

import (
	"reflect"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestCheckResourceVersion(t *testing.T) {
	r := fxResource(nil)
	const cur = "0123456789ab.17.00000001e240"
	for _, tc := range []struct {
		given    string
		conflict bool
	}{
		{"", false},
		{cur, false},
		// Same content (fingerprint), stamped by another replica or
		// before a restart.
		{"ba9876543210.5.00000001e240", false},
		{"0123456789ab.17.00000001e241", true},
		// A list version describes no content.
		{"0123456789ab.17", true},
		// The previous binary's decimal format.
		{"1700000000000123456", true},
		{"abc", true},
	} {
		err := r.checkResourceVersion("obj", tc.given, cur)
		if got := apierrors.IsConflict(err); got != tc.conflict || (!tc.conflict && err != nil) {
			t.Errorf("checkResourceVersion(%q, %q) = %v, want conflict %v", tc.given, cur, err, tc.conflict)
		}
	}
}

func TestCheckDeletePreconditions(t *testing.T) {
	r := fxResource(nil)
	cur := toWorkspace(fxTarget(t, "prod", false), fxWorkspace(), nil)
	cur.ResourceVersion = "0123456789ab.17.00000001e240"
	uid, otherUID := cur.UID, types.UID("other")
	for _, tc := range []struct {
		name     string
		opts     *metav1.DeleteOptions
		conflict bool
	}{
		{"no options", nil, false},
		{"no preconditions", &metav1.DeleteOptions{}, false},
		{"matching UID", &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}, false},
		{"other UID", &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &otherUID}}, true},
		{"matching resourceVersion", &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: fxPtr("ba9876543210.5.00000001e240")}}, false},
		{"stale resourceVersion", &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: fxPtr("0123456789ab.17.000000000001")}}, true},
		{"matching UID, stale resourceVersion", &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: fxPtr("1")}}, true},
	} {
		err := r.checkDeletePreconditions(cur.Name, cur, tc.opts)
		if apierrors.IsConflict(err) != tc.conflict || (!tc.conflict && err != nil) {
			t.Errorf("%s: %v, want conflict %v", tc.name, err, tc.conflict)
		}
	}
}

func TestCreateOptions(t *testing.T) {
	if got := createOptions(nil); got == nil || !reflect.DeepEqual(*got, metav1.CreateOptions{}) {
		t.Errorf("createOptions(nil) = %+v", got)
	}
	got := createOptions(&metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: "kubectl", FieldValidation: "Strict"})
	want := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: "kubectl", FieldValidation: "Strict"}
	if !reflect.DeepEqual(*got, want) {
		t.Errorf("createOptions = %+v, want %+v", *got, want)
	}
	if !isDryRun(got.DryRun) || isDryRun(nil) {
		t.Error("isDryRun")
	}
}
