// Package scheme builds the runtime.Scheme shared by every component's
// Kubernetes clients and caches.
package scheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

// New returns a scheme with the built-in Kubernetes types and coder-k8s's
// own: the CRDs and, for clients of the aggregated API, its types.
func New() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(coderv1alpha1.AddToScheme(s))
	utilruntime.Must(aggv1.AddToScheme(s))
	return s
}
