package storage

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/go-logr/logr"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apiserver/pkg/endpoints/handlers/negotiation"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	genericapiserver "k8s.io/apiserver/pkg/server"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/testenv"
)

// servedCodecs is the serializer the aggregated API server serves
// coderworkspaces with: the scheme internal/aggregated/apiserver builds,
// through genericapiserver.NewDefaultAPIGroupInfo (which turns on the
// streaming list encoders, as the server does).
func servedCodecs(t testing.TB) runtime.NegotiatedSerializer {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := aggv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	scheme.AddKnownTypes(schema.GroupVersion{Group: aggv1.GroupName, Version: runtime.APIVersionInternal},
		&aggv1.CoderWorkspace{}, &aggv1.CoderWorkspaceList{}, &aggv1.CoderTemplate{}, &aggv1.CoderTemplateList{})
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	scheme.AddUnversionedTypes(schema.GroupVersion{Version: "v1"},
		&metav1.Status{}, &metav1.APIVersions{}, &metav1.APIGroupList{}, &metav1.APIGroup{}, &metav1.APIResourceList{})
	group := genericapiserver.NewDefaultAPIGroupInfo(aggv1.GroupName, scheme, metav1.ParameterCodec, serializer.NewCodecFactory(scheme))
	return group.NegotiatedSerializer
}

// countingWriter is an http.ResponseWriter that keeps only the size of
// the body.
type countingWriter struct {
	h    http.Header
	n    int
	code int
}

func (w *countingWriter) Header() http.Header         { return w.h }
func (w *countingWriter) WriteHeader(code int)        { w.code = code }
func (w *countingWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }

// serveList writes obj as the API server's LIST handler does
// (responsewriters.WriteObjectNegotiated, JSON, gzip when accepted) and
// returns the body's size.
func serveList(t testing.TB, codecs runtime.NegotiatedSerializer, obj runtime.Object, acceptEncoding string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "/apis/aggregation.coder.com/v1alpha1/coderworkspaces", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json")
	if acceptEncoding != "" {
		req.Header.Set("Accept-Encoding", acceptEncoding)
	}
	w := &countingWriter{h: http.Header{}}
	responsewriters.WriteObjectNegotiated(codecs, negotiation.DefaultEndpointRestrictions, aggv1.SchemeGroupVersion, w, req, http.StatusOK, obj, false)
	if w.code != http.StatusOK {
		t.Fatalf("LIST answered %d", w.code)
	}
	return w.n
}

// BenchmarkWorkspaceList measures coder-k8s's own work on a LIST of
// coderworkspaces against a real coderd seeded through its echo
// provisioner: the storage's List plus the API server's encoding of the
// answer, timed alternately with coderd's own GET /api/v2/workspaces
// (same HTTP client settings, body read), and prints their ratio. With a
// resourceVersion unset the LIST reads coderd; with resourceVersion=0 it
// is answered from the watch cache. The workspace count is
// CODER_K8S_LIST_BENCH_WORKSPACES (default 300). Neither figure includes
// kube-apiserver's proxying or TLS: this is the part coder-k8s owns.
func BenchmarkWorkspaceList(b *testing.B) {
	n := 300
	if v := os.Getenv("CODER_K8S_LIST_BENCH_WORKSPACES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatalf("CODER_K8S_LIST_BENCH_WORKSPACES=%q: %v", v, err)
		}
	}
	ctx := context.Background()
	c := testenv.NewCoder(b, testenv.CoderOptions{
		ProvisionerTypes:   []codersdk.ProvisionerType{codersdk.ProvisionerTypeTerraform, codersdk.ProvisionerTypeEcho},
		ProvisionerDaemons: 4,
		DisableRateLimits:  true,
	})
	seedEchoWorkspaces(b, c, n)

	bk := backend.Backend{Namespace: "team-a", URL: c.URL,
		Client: coderapi.NewClient(c.URL, c.SessionToken, 30*time.Second, coderapi.Target{})}
	wss, err := NewWorkspaces(Options{Backends: fxProvider{backends: []backend.Backend{bk}},
		// Long enough that a list at resourceVersion 0 stays answerable
		// from the cache for the whole run.
		PollInterval: time.Hour, Log: logr.Discard()})
	if err != nil {
		b.Fatal(err)
	}
	codecs := servedCodecs(b)
	lctx := genericapirequest.WithNamespace(ctx, "team-a")
	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	coderList := func() (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL.String()+"/api/v2/workspaces", nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set(codersdk.SessionTokenHeader, c.SessionToken)
		res, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		if err != nil || res.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("coderd list: %d %v", res.StatusCode, err)
		}
		return len(body), nil
	}
	aggList := func(rv string) (int, error) {
		obj, err := wss.List(lctx, &metainternalversion.ListOptions{ResourceVersion: rv})
		if err != nil {
			return 0, err
		}
		if got := len(obj.(*workspaceList).Items); got != n {
			return 0, fmt.Errorf("LIST returned %d workspaces, want %d", got, n)
		}
		return serveList(b, codecs, obj, "gzip"), nil
	}
	// The first list reads every build's parameters once.
	if _, err := aggList(""); err != nil {
		b.Fatal(err)
	}
	for _, rv := range []string{"", "0"} {
		name := "rv=unset"
		if rv != "" {
			name = "rv=" + rv
		}
		b.Run(name, func(b *testing.B) {
			var aggTimes, coderTimes []time.Duration
			var aggSize, coderSize int
			i := 0
			for b.Loop() {
				order := []bool{true, false}
				if i%2 == 1 {
					order = []bool{false, true}
				}
				i++
				for _, agg := range order {
					start := time.Now()
					var err error
					if agg {
						aggSize, err = aggList(rv)
						aggTimes = append(aggTimes, time.Since(start))
					} else {
						coderSize, err = coderList()
						coderTimes = append(coderTimes, time.Since(start))
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			aggMed, coderMed := median(aggTimes), median(coderTimes)
			ratio := aggMed.Seconds() / coderMed.Seconds()
			b.ReportMetric(ratio, "ratio")
			b.ReportMetric(float64(aggMed.Microseconds())/1000, "list-ms")
			b.ReportMetric(float64(coderMed.Microseconds())/1000, "coderd-ms")
			fmt.Printf("storage list ratio %s=%.2f: coder-k8s List+encode median %s (%d bytes gzip), coderd GET /api/v2/workspaces median %s (%d bytes); %d workspaces, %d pairs\n",
				name, ratio, aggMed.Round(10*time.Microsecond), aggSize, coderMed.Round(10*time.Microsecond), coderSize, n, len(aggTimes))
		})
	}
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// seedEchoWorkspaces creates n workspaces of an echo template, ten
// requests at a time, and waits until every build has succeeded.
func seedEchoWorkspaces(t testing.TB, c *testenv.Coder, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	tpl, err := c.PushEchoTemplate(ctx, "echo")
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("ws-%05d", i)
	}
	if _, err := c.CreateWorkspaces(ctx, tpl, names, nil); err != nil {
		t.Fatal(err)
	}
}
