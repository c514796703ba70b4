package e2e

import (
	"context"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/scheme"
	"github.com/coder/coder-k8s/internal/testenv"
)

// A user adopts an existing coderd with a CoderControlPlane; the running
// operator sets up its own user and token and reports it in status.
func TestAdoptExistingCoderd(t *testing.T) {
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	coder := testenv.NewCoder(t, testenv.CoderOptions{})
	c := startAdopting(t, k, coder)
	ctx := context.Background()
	ccp := &coderv1alpha1.CoderControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: "coder", Namespace: "coder"},
		Spec: coderv1alpha1.CoderControlPlaneSpec{
			ExternalURL: coder.URL.String(),
			OperatorAccess: coderv1alpha1.OperatorAccessSpec{
				OwnerTokenSecretRef: &coderv1alpha1.SecretKeyReference{Name: "owner", Key: "token"},
			},
		},
	}
	if err := c.Create(ctx, ccp); err != nil {
		t.Fatal(err)
	}

	waitFor(t, 60*time.Second, func() error {
		if err := c.Get(ctx, types.NamespacedName{Namespace: "coder", Name: "coder"}, ccp); err != nil {
			return err
		}
		if !apimeta.IsStatusConditionTrue(ccp.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady) {
			return errNotYet("OperatorAccessReady is not True: " + conditionSummary(ccp.Status.Conditions))
		}
		return nil
	})
	if ccp.Status.URL != coder.URL.String() || ccp.Status.ObservedGeneration != ccp.Generation {
		t.Errorf("status url=%q observedGeneration=%d (generation %d)", ccp.Status.URL, ccp.Status.ObservedGeneration, ccp.Generation)
	}

	t.Run("the token in the referenced Secret works", func(t *testing.T) {
		oc, err := coderapi.ForControlPlane(ctx, c, ccp, 5*time.Second, "e2e")
		if err != nil {
			t.Fatal(err)
		}
		me, err := oc.User(ctx, codersdk.Me)
		if err != nil {
			t.Fatalf("coderd rejects the operator token: %v", err)
		}
		if me.Username != ccp.Status.OperatorUser {
			t.Errorf("token user %q, status says %q", me.Username, ccp.Status.OperatorUser)
		}
	})

	t.Run("kubectl shows the access column", func(t *testing.T) {
		kubectl, err := testenv.Binary("kubectl")
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(kubectl, "--kubeconfig", k.KubeconfigPath, "get", "ccp", "-n", "coder").CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl get ccp: %v\n%s", err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) != 2 || !strings.Contains(lines[1], coder.URL.String()) || !strings.Contains(lines[1], "True") {
			t.Errorf("kubectl get ccp:\n%s", out)
		}
	})
}

// A coderd that accepts connections and never answers holds each call for
// the full Coder request timeout; other control planes must not wait for it.
func TestHungCoderdDoesNotBlockOthers(t *testing.T) {
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	coder := testenv.NewCoder(t, testenv.CoderOptions{})
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hung.Close() })
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			conn, err := hung.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, conn)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})

	c := startAdopting(t, k, coder)
	ctx := context.Background()
	owner := coderv1alpha1.OperatorAccessSpec{OwnerTokenSecretRef: &coderv1alpha1.SecretKeyReference{Name: "owner", Key: "token"}}
	// Several hung control planes first, so they occupy reconcile workers.
	for i := range 3 {
		ccp := &coderv1alpha1.CoderControlPlane{
			ObjectMeta: metav1.ObjectMeta{Name: "hung-" + strconv.Itoa(i), Namespace: "coder"},
			Spec:       coderv1alpha1.CoderControlPlaneSpec{ExternalURL: "http://" + hung.Addr().String(), OperatorAccess: owner},
		}
		if err := c.Create(ctx, ccp); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	good := &coderv1alpha1.CoderControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: "good", Namespace: "coder"},
		Spec:       coderv1alpha1.CoderControlPlaneSpec{ExternalURL: coder.URL.String(), OperatorAccess: owner},
	}
	if err := c.Create(ctx, good); err != nil {
		t.Fatal(err)
	}
	// Well inside the 30s Coder request timeout the hung ones are held for.
	waitFor(t, 20*time.Second, func() error {
		if err := c.Get(ctx, types.NamespacedName{Namespace: "coder", Name: "good"}, good); err != nil {
			return err
		}
		if !apimeta.IsStatusConditionTrue(good.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady) {
			return errNotYet(conditionSummary(good.Status.Conditions))
		}
		return nil
	})
	t.Logf("healthy control plane ready after %s next to 3 hung ones", time.Since(start).Round(time.Millisecond))
}

// startAdopting runs the operator in all mode and prepares namespace
// "coder" with Secret "owner" holding the owner token of coder, as a user
// adopting an existing coderd would.
func startAdopting(t *testing.T, k *testenv.KubeAPI, coder *testenv.Coder) client.Client {
	t.Helper()
	op := StartOperator(t, OperatorOptions{Mode: "all", Kubeconfig: k.KubeconfigPath})
	op.WaitOK(t, op.Health+"/readyz")
	ctx := context.Background()
	c, err := client.New(k.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "coder"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: "coder"},
		Data:       map[string][]byte{"token": []byte(coder.SessionToken)},
	}); err != nil {
		t.Fatal(err)
	}
	return c
}

func conditionSummary(conds []metav1.Condition) string {
	var parts []string
	for _, c := range conds {
		parts = append(parts, c.Type+"="+string(c.Status)+" ("+c.Reason+": "+c.Message+")")
	}
	if len(parts) == 0 {
		return "no conditions"
	}
	return strings.Join(parts, "; ")
}
