package storage

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/endpoints/handlers/negotiation"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
)

// servedBody is the body the API server's LIST handler writes for obj
// (responsewriters.WriteObjectNegotiated) for a request with accept and
// acceptEncoding to url, decompressed.
func servedBody(t *testing.T, codecs runtime.NegotiatedSerializer, obj runtime.Object, url, accept, acceptEncoding string) []byte {
	body, _ := servedBodyEncoding(t, codecs, obj, url, accept, acceptEncoding)
	return body
}

// servedBodyEncoding is servedBody with the answer's Content-Encoding.
func servedBodyEncoding(t *testing.T, codecs runtime.NegotiatedSerializer, obj runtime.Object, url, accept, acceptEncoding string) ([]byte, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Accept", accept)
	if acceptEncoding != "" {
		req.Header.Set("Accept-Encoding", acceptEncoding)
	}
	rec := httptest.NewRecorder()
	responsewriters.WriteObjectNegotiated(codecs, negotiation.DefaultEndpointRestrictions, aggv1.SchemeGroupVersion, rec, req, http.StatusOK, obj, false)
	if rec.Code != http.StatusOK {
		t.Fatalf("%s (%s): status %d: %s", url, accept, rec.Code, rec.Body.String())
	}
	body := rec.Body.Bytes()
	if rec.Header().Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body, err = io.ReadAll(zr); err != nil {
			t.Fatal(err)
		}
	}
	return body, rec.Header().Get("Content-Encoding")
}

// TestListAnswerServesTheSameBytes: a LIST answer is served from each
// object's cached JSON, and the bytes are exactly what the API server
// writes for the same list as a plain CoderWorkspaceList: compact JSON
// (plain and gzip-compressed, large enough to be compressed), pretty
// JSON and YAML (which are encoded whole), and again after objects
// changed and after a record merged new metadata. Table conversion and
// the list accessors behind metadata-only lists see the same items, and
// encoding leaves the cached objects as they were.
func TestListAnswerServesTheSameBytes(t *testing.T) {
	const ns = "team-a"
	bk := backend.Backend{Namespace: ns, ControlPlane: "coder", URL: fxURL(t, "https://coder.example.com")}
	s, err := NewWorkspaces(Options{Backends: fxProvider{backends: []backend.Backend{bk}}, PollInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tgt := targetsOf([]backend.Backend{bk})[0]
	const n = 200 // beyond the API server's 128 KiB compression threshold
	build := func(gen string) []watchcache.Object {
		objs := make([]watchcache.Object, n)
		for i := range n {
			w := fxWorkspace()
			w.Name = "dev-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
			w.ID[15] = byte(i)
			obj := toWorkspace(tgt, w, []aggv1.WorkspaceParameter{{Name: "region", Value: "eu<&>" + gen}})
			var rec *records.Record
			if i%3 == 0 {
				rec = &records.Record{}
				rec.ResourceVersion = "7"
				rec.Spec.Labels = map[string]string{"team": "a" + gen}
				rec.Spec.Annotations = map[string]string{"note": "\"quoted\" </script>"}
				rec.Spec.Finalizers = []string{"example.com/hold"}
			}
			mergeRecord(obj, rec)
			objs[i] = obj
		}
		return objs
	}
	s.cache.Replace(bk.Key(), build("1"))
	codecs := servedCodecs(t)
	ctx := genericapirequest.WithNamespace(context.Background(), ns)
	const url = "/apis/aggregation.coder.com/v1alpha1/namespaces/team-a/coderworkspaces"

	check := func(round string) {
		t.Helper()
		got, err := s.List(ctx, &metainternalversion.ListOptions{ResourceVersion: "0"})
		if err != nil {
			t.Fatal(err)
		}
		answer, ok := got.(*workspaceList)
		if !ok {
			t.Fatalf("%s: List returned a %T", round, got)
		}
		if len(answer.Items) != n {
			t.Fatalf("%s: List returned %d items, want %d", round, len(answer.Items), n)
		}
		before, _ := s.cache.Snapshot(nil)
		plain := answer.CoderWorkspaceList.DeepCopy()
		for _, v := range []struct{ url, accept, encoding string }{
			{url, "application/json", ""},
			{url, "application/json", "gzip"},
			{url, "application/json", ""}, // the encoder's verdict is known now
			{url + "?pretty=true", "application/json", ""},
			{url, "application/yaml", ""},
		} {
			want, wantEnc := servedBodyEncoding(t, codecs, plain.DeepCopy(), v.url, v.accept, v.encoding)
			have, haveEnc := servedBodyEncoding(t, codecs, answer, v.url, v.accept, v.encoding)
			if !bytes.Equal(have, want) {
				t.Errorf("%s: %s %s (%s): the answer's %d bytes differ from the plain list's %d bytes", round, v.accept, v.url, v.encoding, len(have), len(want))
			}
			if haveEnc != wantEnc {
				t.Errorf("%s: %s %s (%s): the answer is sent with Content-Encoding %q, the plain list with %q", round, v.accept, v.url, v.encoding, haveEnc, wantEnc)
			}
			if v.encoding == "gzip" && haveEnc != "gzip" {
				t.Errorf("%s: a %d-byte answer to a client accepting gzip is sent uncompressed", round, len(have))
			}
		}
		// The compact JSON answers were spliced from the cached JSON.
		info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
		if !ok {
			t.Fatal("no JSON serializer")
		}
		id := codecs.EncoderForVersion(info.Serializer, aggv1.SchemeGroupVersion).Identifier()
		if v, ok := splices.Load(id); !ok || !v.(bool) {
			t.Errorf("%s: the JSON encoder's lists are not spliced (verdict %v, known %v)", round, v, ok)
		}
		if info.PrettySerializer != nil {
			pid := codecs.EncoderForVersion(info.PrettySerializer, aggv1.SchemeGroupVersion).Identifier()
			if v, ok := splices.Load(pid); !ok || v.(bool) {
				t.Errorf("%s: pretty JSON lists would be spliced (verdict %v, known %v)", round, v, ok)
			}
		}

		wantTable, err := s.ConvertToTable(ctx, plain, &metav1.TableOptions{})
		if err != nil {
			t.Fatal(err)
		}
		haveTable, err := s.ConvertToTable(ctx, answer, &metav1.TableOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(haveTable, wantTable) {
			t.Errorf("%s: the answer's table differs from the plain list's", round)
		}
		items, err := meta.ExtractList(answer)
		if err != nil || len(items) != n || items[0].(*aggv1.CoderWorkspace).Name != plain.Items[0].Name {
			t.Errorf("%s: meta.ExtractList of the answer: %d items, %v", round, len(items), err)
		}
		if la, err := meta.ListAccessor(answer); err != nil || la.GetResourceVersion() != plain.ResourceVersion {
			t.Errorf("%s: meta.ListAccessor of the answer: %v", round, err)
		}
		after, _ := s.cache.Snapshot(nil)
		if !reflect.DeepEqual(after, before) {
			t.Errorf("%s: encoding the answer changed the cached objects", round)
		}
	}
	check("first")

	// Coder changed every object: the answer serves the new JSON.
	s.cache.Replace(bk.Key(), build("2"))
	check("after Coder changed")
	got, _ := s.List(ctx, &metainternalversion.ListOptions{ResourceVersion: "0"})
	if body := servedBody(t, codecs, got, url, "application/json", ""); !bytes.Contains(body, []byte(`"team":"a2"`)) || bytes.Contains(body, []byte(`"team":"a1"`)) {
		t.Errorf("the answer after the change does not show the new labels")
	}

	// One object's metadata changed (a record merged), the rest did not.
	cur, ok := s.cache.Get(bk.Key(), "coder."+"acme.alice.dev-aa")
	if !ok {
		objs, _ := s.cache.Snapshot(nil)
		cur = objs[0]
	}
	w := cur.(*aggv1.CoderWorkspace)
	w.Labels["team"] = "changed"
	w.Annotations = map[string]string{"only": "this one"}
	s.cache.Upsert(bk.Key(), w)
	check("after one object changed")
	got, _ = s.List(ctx, &metainternalversion.ListOptions{ResourceVersion: "0"})
	if body := servedBody(t, codecs, got, url, "application/json", ""); !bytes.Contains(body, []byte(`"only":"this one"`)) {
		t.Errorf("the answer after one object changed does not show its new annotation")
	}

	// An empty list is encoded whole, as the handler sets its items.
	s.cache.Replace(bk.Key(), nil)
	got, err = s.List(ctx, &metainternalversion.ListOptions{ResourceVersion: "0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := meta.SetList(got, []runtime.Object{}); err != nil {
		t.Fatal(err)
	}
	plain := got.(*workspaceList).CoderWorkspaceList.DeepCopy()
	if have, want := servedBody(t, codecs, got, url, "application/json", ""), servedBody(t, codecs, plain, url, "application/json", ""); !bytes.Equal(have, want) {
		t.Errorf("empty list: served %s, want %s", have, want)
	}
}
