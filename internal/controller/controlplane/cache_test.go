package controlplane

import (
	"testing"

	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/controllertest"
	"github.com/coder/coder-k8s/internal/kubecache"
)

// TestChildrenAreInTheCache: the manager caches only objects matching
// kubecache.Selector. Every child this reconciler builds matches it, and
// so does every child the previous operator wrote (the upgrade
// fixtures), or their changes and deletions would go unnoticed after an
// upgrade.
func TestChildrenAreInTheCache(t *testing.T) {
	sel := kubecache.Selector()
	for _, fixture := range []string{"default", "full"} {
		for _, m := range readFixture[[]map[string]any](t, fixture+".children.json") {
			meta, _ := m["metadata"].(map[string]any)
			set := labels.Set{}
			if l, ok := meta["labels"].(map[string]any); ok {
				for k, v := range l {
					set[k], _ = v.(string)
				}
			}
			if !sel.Matches(set) {
				t.Errorf("%s: previous %s %v is not selected by %s (labels %v)", fixture, m["kind"], meta["name"], sel, set)
			}
		}

		ccp := newControlPlane("ns", "coder")
		ccp.Spec = readFixture[coderv1alpha1.CoderControlPlaneSpec](t, fixture+".spec.json")
		children := []client.Object{desiredServiceAccount(ccp), desiredDeployment(ccp, DefaultImage, DefaultClusterDomain), desiredService(ccp)}
		// The full fixture asks for extraRules, which is refused now: its
		// RoleBinding to the default ClusterRole stands for the bindings.
		ccp.Spec.WorkspaceRBAC.ExtraRules = nil
		policy := DefaultWorkspaceRBACPolicy()
		policy.ExtraNamespaces = map[string][]string{ccp.Namespace: ccp.Spec.WorkspaceRBAC.ExtraNamespaces}
		plan, err := policy.plan(ccp)
		if err != nil {
			t.Fatalf("%s: %v", fixture, err)
		}
		for _, rb := range plan.bindings(ccp) {
			children = append(children, rb)
		}
		if exp := ccp.Spec.Expose; exp != nil && exp.Ingress != nil {
			children = append(children, desiredIngress(ccp))
		}
		ccp.Spec.Expose = &coderv1alpha1.ExposeSpec{HTTPRoute: &coderv1alpha1.HTTPRouteSpec{ParentRefs: []coderv1alpha1.GatewayReference{{Name: "gw"}}}}
		children = append(children, desiredHTTPRoute(ccp))
		controllertest.CheckCached(t, children...)
	}
}
