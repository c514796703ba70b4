package testenv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	fixtureGroup   = "testenv.coder.com"
	fixtureVersion = "v1alpha1"
)

// startFixtureServer serves a one-resource API group over TLS, the way an
// aggregated API server must: its certificate names the Service, and it
// accepts proxied requests only from a client certificate issued by the
// front-proxy CA kube-apiserver publishes. Each widget list names the user
// kube-apiserver says made the request.
func startFixtureServer(t *testing.T, k *KubeAPI, dnsName string) (port int, caPEM []byte) {
	t.Helper()
	ctx := context.Background()
	auth, err := k.Clientset.CoreV1().ConfigMaps("kube-system").Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("read extension-apiserver-authentication: %v", err)
	}
	proxyCAs := x509.NewCertPool()
	if !proxyCAs.AppendCertsFromPEM([]byte(auth.Data["requestheader-client-ca-file"])) {
		t.Fatalf("kube-apiserver publishes no front-proxy CA: %v", auth.Data)
	}

	ca, err := NewCA("fixture-ca")
	if err != nil {
		t.Fatal(err)
	}
	serving, err := ca.ServingCert([]string{dnsName}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(serving.CertPEM, serving.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}

	gv := fixtureGroup + "/" + fixtureVersion
	mux := http.NewServeMux()
	mux.HandleFunc("GET /apis/"+gv, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, metav1.APIResourceList{
			TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
			GroupVersion: gv,
			APIResources: []metav1.APIResource{{Name: "widgets", Namespaced: true, Kind: "Widget", Verbs: metav1.Verbs{"list"}}},
		})
	})
	mux.HandleFunc("GET /apis/"+gv+"/namespaces/{ns}/widgets", func(w http.ResponseWriter, r *http.Request) {
		if len(r.TLS.VerifiedChains) == 0 {
			http.Error(w, "not from the front proxy", http.StatusUnauthorized)
			return
		}
		writeJSON(w, map[string]any{
			"kind": "WidgetList", "apiVersion": gv, "metadata": map[string]any{},
			"items": []any{map[string]any{
				"kind": "Widget", "apiVersion": gv,
				"metadata": map[string]any{"name": "for-" + r.Header.Get("X-Remote-User"), "namespace": r.PathValue("ns")},
			}},
		})
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		// The refused-certificate case makes handshakes fail on purpose.
		ErrorLog: log.New(io.Discard, "", 0),
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{cert},
			ClientCAs:    proxyCAs,
			ClientAuth:   tls.VerifyClientCertIfGiven,
			MinVersion:   tls.VersionTLS12,
		},
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port, ca.CertPEM
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func TestKubeAPI(t *testing.T) {
	k := NewKubeAPI(t, KubeAPIOptions{})
	ctx := context.Background()

	t.Run("serves the Kubernetes API and reports its real version", func(t *testing.T) {
		v, err := k.Clientset.Discovery().ServerVersion()
		if err != nil {
			t.Fatal(err)
		}
		if v.GitVersion != "v1.36.3" {
			t.Errorf("kube-apiserver reports %s, want v1.36.3 (run `make tools`)", v.GitVersion)
		}
		if _, err := k.Clientset.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
			t.Errorf("get namespace default: %v", err)
		}
	})

	t.Run("serves the project's CRDs", func(t *testing.T) {
		root, err := RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		files, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no CRDs in config/crd/bases (%v)", err)
		}
		list, err := k.Clientset.Discovery().ServerResourcesForGroupVersion("coder.com/v1alpha1")
		if err != nil {
			t.Fatalf("discovery of coder.com/v1alpha1: %v", err)
		}
		served := map[string]bool{}
		for _, r := range list.APIResources {
			served[r.Name] = true
		}
		for _, f := range files {
			// config/crd/bases/coder.com_<plural>.yaml
			plural := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "coder.com_"), ".yaml")
			if !served[plural] {
				t.Errorf("CRD %s is not served (served: %v)", plural, served)
			}
		}
	})

	t.Run("routes an aggregated API through the APIService with a caBundle", func(t *testing.T) {
		const svcName, svcNS = "fixture", "fixture-system"
		port, ca := startFixtureServer(t, k, ServiceDNSName(svcName, svcNS))
		err := k.RegisterAPIService(ctx, APIService{
			Group: fixtureGroup, Version: fixtureVersion, Port: port, CABundle: ca,
			ServiceName: svcName, ServiceNamespace: svcNS,
		})
		if err != nil {
			t.Fatal(err)
		}
		list, err := k.Clientset.Discovery().ServerResourcesForGroupVersion(fixtureGroup + "/" + fixtureVersion)
		if err != nil || len(list.APIResources) != 1 || list.APIResources[0].Name != "widgets" {
			t.Fatalf("discovery through kube-apiserver: %v %+v", err, list)
		}

		// A request through kube-apiserver arrives over the front proxy
		// with the caller's identity.
		body, err := k.Clientset.RESTClient().Get().AbsPath("/apis", fixtureGroup, fixtureVersion, "namespaces", "default", "widgets").DoRaw(ctx)
		if err != nil {
			t.Fatalf("list widgets through kube-apiserver: %v", err)
		}
		var widgets struct {
			Items []struct {
				Metadata metav1.ObjectMeta `json:"metadata"`
			} `json:"items"`
		}
		if err := json.Unmarshal(body, &widgets); err != nil {
			t.Fatal(err)
		}
		if len(widgets.Items) != 1 || widgets.Items[0].Metadata.Name != "for-admin" {
			t.Errorf("aggregated server saw %s, want the request made as user admin", body)
		}
	})

	t.Run("a certificate not valid for the Service name is refused", func(t *testing.T) {
		const svcName, svcNS = "wrongname", "fixture-system"
		port, ca := startFixtureServer(t, k, "localhost")
		err := k.RegisterAPIService(ctx, APIService{
			Group: "wrong." + fixtureGroup, Version: fixtureVersion, Port: port, CABundle: ca,
			ServiceName: svcName, ServiceNamespace: svcNS, Timeout: 10 * time.Second,
		})
		if err == nil {
			t.Fatal("kube-apiserver accepted a serving certificate that does not name the Service")
		}
		if !strings.Contains(err.Error(), "certificate") {
			t.Errorf("registration failed for another reason than the certificate: %v", err)
		}
	})

	t.Run("the kubeconfig file works for kubectl", func(t *testing.T) {
		kubectl, err := Binary("kubectl")
		if err != nil {
			t.Fatal(err)
		}
		r, err := k.Kubectl(kubectl).Run(ctx, "", "get", "namespace", "default", "-o", "name")
		if err != nil || strings.TrimSpace(r.Combined) != "namespace/default" {
			t.Fatalf("kubectl get namespace default: %v: %s", err, r.Combined)
		}
	})
}

// Without the binaries the error tells the user how to get them.
func TestKubeAPIMissingBinary(t *testing.T) {
	t.Setenv("CODER_K8S_BIN_DIR", t.TempDir())
	_, err := StartKubeAPI(context.Background(), KubeAPIOptions{})
	if err == nil || !strings.Contains(err.Error(), "make tools") || !strings.Contains(err.Error(), "kube-apiserver") {
		t.Fatalf("error = %v, want one naming kube-apiserver and `make tools`", err)
	}
}
