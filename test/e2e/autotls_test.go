package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/autotls"
	"github.com/coder/coder-k8s/internal/config"
	"github.com/coder/coder-k8s/internal/testenv"
)

// With aggregatedAPIServer.autoTLS the binary makes its own CA and serving
// certificate and writes the CA into an APIService created without a
// caBundle, as the Helm chart creates it: kube-apiserver then verifies the
// server and routes aggregation.coder.com to it. No certificate material
// comes from outside.
func TestAutoTLS(t *testing.T) {
	t.Parallel()
	kubectl, err := testenv.Binary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	ctx := context.Background()
	if err := k.EnsureNamespace(ctx, aggServiceNamespace); err != nil {
		t.Fatal(err)
	}
	agg, err := aggregatorclient.NewForConfig(k.Config)
	if err != nil {
		t.Fatal(err)
	}
	apiServiceName := "v1alpha1." + aggv1.GroupName
	autoTLS := fmt.Sprintf("autoTLS: {enabled: true, namespace: %s, serviceName: %s, apiServiceName: %s}",
		aggServiceNamespace, aggServiceName, apiServiceName)
	secretName := config.Default().AggregatedAPIServer.AutoTLS.SecretName

	op := StartOperator(t, OperatorOptions{Mode: "all", Kubeconfig: k.KubeconfigPath, Aggregated: autoTLS})
	op.WaitOK(t, op.Aggregated+"/readyz")
	// The chart's APIService: no caBundle, no insecureSkipTLSVerify.
	if err := k.RegisterAPIService(ctx, testenv.APIService{
		Group: aggv1.GroupName, Version: "v1alpha1", Port: operatorPort(t, op),
		ServiceName: aggServiceName, ServiceNamespace: aggServiceNamespace,
	}); err != nil {
		t.Fatalf("APIService without caBundle: %v\noperator log:\n%s", err, op.LogTail(40))
	}

	secret := func() *corev1.Secret {
		t.Helper()
		s, err := k.Clientset.CoreV1().Secrets(aggServiceNamespace).Get(ctx, secretName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	apiService := func() *apiregistrationv1.APIService {
		t.Helper()
		s, err := agg.ApiregistrationV1().APIServices().Get(ctx, apiServiceName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// servedLeaf connects the way kube-apiserver's aggregator does: the
	// APIService's caBundle as roots, <service>.<namespace>.svc as name.
	servedLeaf := func(op *Operator) (*x509.Certificate, error) {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(apiService().Spec.CABundle) {
			return nil, errNotYet("the APIService has no caBundle")
		}
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", fmt.Sprintf("127.0.0.1:%d", operatorPort(t, op)),
			&tls.Config{RootCAs: pool, ServerName: testenv.ServiceDNSName(aggServiceName, aggServiceNamespace)})
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0], nil
	}

	var leaf *x509.Certificate
	t.Run("the APIService holds the Secret's CA and is Available", func(t *testing.T) {
		s := secret()
		for _, key := range []string{autotls.CACertKey, autotls.CAKeyKey, autotls.CABundleKey, autotls.TLSCertKey, autotls.TLSKeyKey} {
			if len(s.Data[key]) == 0 {
				t.Errorf("Secret %s/%s has no %s", aggServiceNamespace, secretName, key)
			}
		}
		svc := apiService()
		if !bytes.Equal(svc.Spec.CABundle, s.Data[autotls.CABundleKey]) || svc.Spec.InsecureSkipTLSVerify {
			t.Errorf("APIService caBundle %d bytes (Secret bundle %d), insecureSkipTLSVerify %v",
				len(svc.Spec.CABundle), len(s.Data[autotls.CABundleKey]), svc.Spec.InsecureSkipTLSVerify)
		}
		testenv.WaitFor(t, 30*time.Second, func() error {
			if c := modesAPIServiceAvailable(ctx, t, agg); c.Status != apiregistrationv1.ConditionTrue {
				return errNotYet(fmt.Sprintf("Available=%s (%s: %s)", c.Status, c.Reason, c.Message))
			}
			return nil
		})
	})

	t.Run("the served certificate is the Secret's and verifies as kube-apiserver verifies it", func(t *testing.T) {
		if leaf, err = servedLeaf(op); err != nil {
			t.Fatal(err)
		}
		stored, _ := x509.ParseCertificate(pemBody(t, secret().Data[autotls.TLSCertKey]))
		if !leaf.Equal(stored) {
			t.Error("the served certificate is not the Secret's tls.crt")
		}
	})

	t.Run("kubectl discovers the aggregated resources through kube-apiserver", func(t *testing.T) {
		out, err := runKubectl(kubectl, k, time.Minute, "", "api-resources", "--api-group", aggv1.GroupName, "-o", "name")
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range []string{"coderworkspaces." + aggv1.GroupName, "codertemplates." + aggv1.GroupName} {
			if !strings.Contains(out, r) {
				t.Errorf("api-resources does not list %s:\n%s", r, out)
			}
		}
	})

	t.Run("an aggregated-apiserver replica serves the same certificate and takes over", func(t *testing.T) {
		op2 := StartOperator(t, OperatorOptions{
			Mode: "aggregated-apiserver", Kubeconfig: k.KubeconfigPath, Aggregated: autoTLS,
			Args: []string{"--coder-url=http://127.0.0.1:1", "--coder-session-token=unused", "--coder-namespace=coder"},
		})
		op2.WaitOK(t, op2.Aggregated+"/readyz")
		leaf2, err := servedLeaf(op2)
		if err != nil {
			t.Fatal(err)
		}
		if !leaf2.Equal(leaf) {
			t.Error("the second replica serves another certificate than the first")
		}
		// Only the second replica is left; pointing the Service at it and
		// re-applying the APIService without a caBundle (as `helm upgrade`
		// or `kubectl apply` of the chart's manifest might) must end with
		// kube-apiserver routing to it, the caBundle written back.
		if code := op.Terminate(t, 30*time.Second); code != 0 {
			t.Fatalf("first replica exited with %d", code)
		}
		port := int32(operatorPort(t, op2))
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			s, err := k.Clientset.CoreV1().Services(aggServiceNamespace).Get(ctx, aggServiceName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			s.Spec.Ports[0].Port, s.Spec.Ports[0].TargetPort = port, intstr.FromInt32(port)
			_, err = k.Clientset.CoreV1().Services(aggServiceNamespace).Update(ctx, s, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		// kube-apiserver writes the status and the replica the caBundle
		// meanwhile: retry on conflicts.
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			s := apiService()
			s.Spec.Service.Port = &port
			s.Spec.CABundle = nil
			_, err := agg.ApiregistrationV1().APIServices().Update(ctx, s, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := k.WaitForDiscovery(ctx, aggv1.GroupName+"/v1alpha1", time.Minute); err != nil {
			t.Fatalf("%v\nreplica log:\n%s", err, op2.LogTail(30))
		}
		svc := apiService()
		if !bytes.Equal(svc.Spec.CABundle, secret().Data[autotls.CABundleKey]) {
			t.Errorf("APIService caBundle (%d bytes) not restored", len(svc.Spec.CABundle))
		}
		out, err := runKubectl(kubectl, k, time.Minute, "", "get", "--raw", "/apis/"+aggv1.GroupName+"/v1alpha1")
		if err != nil || !strings.Contains(out, "coderworkspaces") {
			t.Errorf("GET /apis/%s/v1alpha1 through kube-apiserver: %v\n%s", aggv1.GroupName, err, out)
		}
	})
}

// operatorPort is the port of op's aggregated API server.
func operatorPort(t testing.TB, op *Operator) int {
	t.Helper()
	port := 0
	if _, err := fmt.Sscanf(op.Aggregated, "https://127.0.0.1:%d", &port); err != nil {
		t.Fatal(err)
	}
	return port
}

// pemBody is the DER of the first PEM block of b.
func pemBody(t *testing.T, b []byte) []byte {
	t.Helper()
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatal("no PEM block")
	}
	return block.Bytes
}
