package mcpserver

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

// sparseSeeds are list answers as kube-apiserver writes them, and JSON
// that tries decodeSparse's corners: escapes, non-ASCII, nulls, keys in
// another case, duplicate keys, nesting in skipped values, whitespace.
func sparseSeeds(t testing.TB) [][]byte {
	built := metav1.NewTime(time.Date(2026, 11, 26, 9, 30, 0, 0, time.UTC))
	ws := aggv1.CoderWorkspaceList{ListMeta: metav1.ListMeta{ResourceVersion: "17"}}
	for i := range 3 {
		ws.Items = append(ws.Items, aggv1.CoderWorkspace{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: fmt.Sprintf("coder.alice.ws-%d", i),
				Labels: map[string]string{"a": `quote " and \ backslash`}, Annotations: map[string]string{"note": "ünïcödé <&>"},
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "coderd", FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:phase":{}}}`)}}},
			Spec: aggv1.CoderWorkspaceSpec{TemplateName: "docker", Running: i%2 == 0,
				Parameters: []aggv1.WorkspaceParameter{{Name: "cpu", Value: `{"nested": ["]", "}"]}`}}},
			Status: aggv1.CoderWorkspaceStatus{Owner: "alice", Phase: "running",
				Conditions:  []metav1.Condition{{Type: "Ready", Status: "True", Message: "a \"quoted\" \\ message\n"}},
				LatestBuild: &aggv1.WorkspaceBuild{ID: "b", Transition: "start", JobStatus: "succeeded", CreatedAt: built}},
		})
	}
	ts := aggv1.CoderTemplateList{ListMeta: metav1.ListMeta{ResourceVersion: "9"}, Items: []aggv1.CoderTemplate{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "coder.docker"},
		Spec:       aggv1.CoderTemplateSpec{DisplayName: "Dócker", Files: map[string]string{"main.tf": "resource \"x\" {\n}\n"}},
		Status:     aggv1.CoderTemplateStatus{ActiveVersionName: "v1", BuildStatus: "succeeded", Deprecated: true},
	}}}
	var seeds [][]byte
	for _, v := range []any{ws, ts} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, b)
	}
	return append(seeds,
		[]byte(`{"items":[]}`),
		[]byte(`{"items":null,"metadata":null}`),
		[]byte(` { "METADATA" : { "ResourceVersion" : "5" } , "Items" : [ { "metadata" : { "name" : "a\u0062c" } , "status" : { "latestBuild" : null } } ] } `),
		[]byte(`{"items":[{"spec":{"running":true}},{"spec":{"running":false}}],"items":[{"metadata":{"name":"dup"}}]}`),
		[]byte(`{"items":[null,{"status":{"latestBuild":{"createdAt":"2026-01-02T03:04:05Z"},"phase":"x"}}]}`),
		[]byte(`{"x":[1,2,{"a":"]}"}],"items":[{"metadata":{"name":"\"q\""}}],"y":-1.5e3,"z":true}`),
		[]byte(`{"items":[{"spec":{"running":"yes"}}]}`),
		[]byte(`{"items":[{]}`),
		[]byte(`{"items":"unterminated`),
	)
}

// TestDecodeSparseMatchesEncodingJSON: what json.Unmarshal decodes,
// decodeSparse decodes the same. (The skimming underneath is fuzzed in
// internal/jsonskim.)
func TestDecodeSparseMatchesEncodingJSON(t *testing.T) {
	for i, seed := range sparseSeeds(t) {
		checkSparse[partialList[workspaceRowSource]](t, i, seed)
		checkSparse[partialList[templateRowSource]](t, i, seed)
	}
}

func checkSparse[T any](t *testing.T, i int, data []byte) {
	t.Helper()
	var want, got T
	if err := json.Unmarshal(data, &want); err != nil {
		// Refused by encoding/json: decodeSparse may decode it or not,
		// but must not panic.
		_ = decodeSparse(data, &got)
		return
	}
	if err := decodeSparse(data, &got); err != nil {
		t.Fatalf("input %d %q: decodeSparse: %v; json.Unmarshal accepts it", i, data, err)
	}
	if !reflect.DeepEqual(want, got) {
		t.Fatalf("input %d %q (%T):\njson.Unmarshal %+v\ndecodeSparse   %+v", i, data, got, want, got)
	}
}

// BenchmarkDecodeList compares decoding a list of 300 workspaces into the
// row sources with decodeSparse and with json.Unmarshal.
func BenchmarkDecodeList(b *testing.B) {
	one := sparseSeeds(b)[0]
	var list map[string]json.RawMessage
	if err := json.Unmarshal(one, &list); err != nil {
		b.Fatal(err)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(list["items"], &items); err != nil {
		b.Fatal(err)
	}
	for len(items) < 300 {
		items = append(items, items[len(items)%3])
	}
	list["items"], _ = json.Marshal(items)
	data, _ := json.Marshal(list)
	b.SetBytes(int64(len(data)))
	for _, c := range []struct {
		name   string
		decode func([]byte, any) error
	}{{"sparse", decodeSparse}, {"encoding-json", json.Unmarshal}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				var l partialList[workspaceRowSource]
				if err := c.decode(data, &l); err != nil || len(l.Items) != 300 {
					b.Fatal(err, len(l.Items))
				}
			}
		})
	}
}
