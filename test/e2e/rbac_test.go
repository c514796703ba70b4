package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/coder/coder-k8s/internal/testenv"
	"github.com/coder/coder-k8s/internal/testenv/chartrbac"
)

// assertChartIdentity checks that op authenticates, through the kubeconfig
// file the binary reads, as the chart's ServiceAccount with its token alone,
// and that this identity is not a cluster admin.
func assertChartIdentity(t *testing.T, op *Operator) {
	t.Helper()
	id := op.Identity
	if id == nil {
		t.Fatal("the operator runs without the chart's identity")
	}
	raw, err := clientcmd.LoadFromFile(id.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	for name, a := range raw.AuthInfos {
		if a.Token == "" || a.TokenFile != "" || len(a.ClientCertificateData) > 0 || a.ClientCertificate != "" || a.Username != "" || a.Exec != nil || a.AuthProvider != nil {
			t.Errorf("kubeconfig user %q holds a credential other than one token", name)
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", id.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview as the operator: %v", err)
	}
	if got := review.Status.UserInfo.Username; got != id.Username {
		t.Errorf("kube-apiserver sees the operator as %q, want %q", got, id.Username)
	}
	if !strings.HasPrefix(id.Username, "system:serviceaccount:") || slices.Contains(review.Status.UserInfo.Groups, "system:masters") {
		t.Errorf("the operator is %q in groups %v, want a ServiceAccount outside system:masters", id.Username, review.Status.UserInfo.Groups)
	}
	// kubectl auth can-i '*' '*' --all-namespaces
	sar, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: "*", Group: "*", Resource: "*",
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sar.Status.Allowed {
		t.Errorf("the operator's identity %s may do anything (can-i '*' '*' is yes)", id.Username)
	}
}

// TestOperatorRunsWithTheChartRBAC shows that the binary's permissions are
// exactly the RBAC the chart renders: it authenticates as the chart's
// ServiceAccount, is no cluster admin, and without one rule of the chart it
// cannot do what that rule is for, until the chart's RBAC is applied again.
func TestOperatorRunsWithTheChartRBAC(t *testing.T) {
	t.Parallel()
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	ctx := context.Background()

	t.Run("all mode authenticates as the chart's ServiceAccount and is no cluster admin", func(t *testing.T) {
		op := StartOperator(t, OperatorOptions{Mode: "all", Kubeconfig: k.KubeconfigPath})
		op.WaitOK(t, op.Health+"/readyz")
		op.WaitOK(t, op.Aggregated+"/readyz")
		op.WaitOK(t, op.MCP+"/readyz")
		assertChartIdentity(t, op)
		// Every object the chart's RBAC for mode all consists of.
		release := strings.TrimPrefix(op.Identity.Username, "system:serviceaccount:"+op.Identity.Namespace+":")
		want := []string{
			"ServiceAccount " + aggServiceNamespace + "/" + release,
			"ClusterRole " + release + "-manager",
			"ClusterRoleBinding " + release + "-manager",
			"ClusterRole " + release + "-aggregated",
			"ClusterRoleBinding " + release + "-aggregated",
			"ClusterRole " + release + "-admission",
			"ClusterRoleBinding " + release + "-admission",
			"ClusterRole " + release + "-mcp",
			"ClusterRoleBinding " + release + "-mcp",
			"ClusterRole " + release + "-workspace-bind",
			"ClusterRoleBinding " + release + "-workspace-bind",
			"ClusterRole " + release + "-workspace",
			"ClusterRole " + release + "-workspace-deployments",
			"Role default/" + release + "-leader-election",
			"RoleBinding default/" + release + "-leader-election",
			"ClusterRoleBinding " + release + "-auth-delegator",
			"RoleBinding kube-system/" + release + "-auth-reader",
			"ClusterRole " + release + "-workspace-user",
			"ClusterRole " + release + "-template-author",
			"ClusterRole " + release + "-organization-admin",
			"ClusterRole " + release + "-user-admin",
			"ClusterRole " + release + "-aggregated-view",
			"ClusterRole " + release + "-aggregated-edit",
		}
		got := slices.Sorted(slices.Values(op.Identity.Objects))
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("applied %q, want %q", got, want)
		}
	})

	t.Run("without the chart's rule to create its Lease the controller never leads", func(t *testing.T) {
		lease := "coder-k8s-rbac-check"
		dropped := 0
		opts := OperatorOptions{
			Mode: "controller", Kubeconfig: k.KubeconfigPath, LeaseName: lease, ExpectForbidden: true,
			LeaderElection: "leaseDuration: 6s, renewDeadline: 4s, retryPeriod: 1s",
			EditRBAC: func(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
				for _, o := range objs {
					if o.GetKind() != "Role" || !strings.HasSuffix(o.GetName(), "-leader-election") {
						continue
					}
					var r rbacv1.Role
					if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &r); err != nil {
						t.Fatal(err)
					}
					r.Rules = slices.DeleteFunc(r.Rules, func(rule rbacv1.PolicyRule) bool {
						drop := slices.Equal(rule.Resources, []string{"leases"}) && slices.Equal(rule.Verbs, []string{"create"})
						if drop {
							dropped++
						}
						return drop
					})
					m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&r)
					if err != nil {
						t.Fatal(err)
					}
					o.Object = m
				}
				return objs
			},
		}
		op := StartOperator(t, opts)
		if dropped != 1 {
			t.Fatalf("the chart's leader-election Role has %d rules creating leases, want 1", dropped)
		}
		assertChartIdentity(t, op)
		forbidden := fmt.Sprintf(`leases.coordination.k8s.io is forbidden: User "%s" cannot create resource "leases" in API group "coordination.k8s.io" in the namespace "default"`,
			op.Identity.Username)
		testenv.WaitFor(t, 30*time.Second, func() error {
			for _, line := range forbiddenRequests(t, op.LogPath, op.Identity.Username, k.KubeconfigPath) {
				if strings.Contains(line, forbidden) {
					return nil
				}
			}
			return errNotYet("the operator's log does not report " + forbidden)
		})
		if _, err := k.Clientset.CoordinationV1().Leases("default").Get(ctx, lease, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("Lease %s exists although the operator may not create it (get: %v)", lease, err)
		}

		// The chart's RBAC as rendered, applied again (as `helm upgrade`
		// would): the same process now takes the Lease.
		admin, err := clientcmd.BuildConfigFromFlags("", k.KubeconfigPath)
		if err != nil {
			t.Fatal(err)
		}
		opts.EditRBAC = nil
		values := map[string]any{
			"mode": "controller",
			"config": map[string]any{"controller": map[string]any{"leaderElection": map[string]any{
				"leaseName": lease, "namespace": "default",
			}}},
		}
		_, err = chartrbac.Grant(ctx, admin, chartrbac.Options{
			Release: op.Identity.ServiceAccount, Namespace: op.Identity.Namespace, Values: values,
			KubeconfigPath: t.TempDir() + "/unused-kubeconfig",
		})
		if err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 60*time.Second, func() error {
			l, err := k.Clientset.CoordinationV1().Leases("default").Get(ctx, lease, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
				return errNotYet("Lease has no holder")
			}
			return nil
		})
		// The refusal in the log is now one kube-apiserver no longer
		// repeats, so the check every StartOperator makes at the end
		// passes over it.
		if refused := forbiddenRequests(t, op.LogPath, op.Identity.Username, k.KubeconfigPath); len(refused) > 0 {
			t.Errorf("refusals still reported after the chart's RBAC was restored: %q", refused)
		}
	})
}
