// Package admission is the aggregated API server's admission chain: the
// plugins kube-apiserver runs on writes to its own resources, which it does
// not run on the requests it proxies to an aggregated API server.
//
// The chain is k8s.io/apiserver's standard one, in kube-apiserver's order:
// NamespaceLifecycle, MutatingAdmissionPolicy (when the cluster serves
// admissionregistration.k8s.io/v1 mutatingadmissionpolicies),
// MutatingAdmissionWebhook, ValidatingAdmissionPolicy and
// ValidatingAdmissionWebhook. It reads the cluster's own configuration
// objects (webhook configurations, policies and their bindings, namespaces)
// through a controller-runtime cache, the manager's where the mode has one,
// so they are listed and watched once per process.
package admission

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/options"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// What the plugins read, cluster-wide: the namespaces (lifecycle and
// namespaceSelector) and the cluster's admission configuration.
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations;validatingwebhookconfigurations;validatingadmissionpolicies;validatingadmissionpolicybindings;mutatingadmissionpolicies;mutatingadmissionpolicybindings,verbs=get;list;watch

// Options are what the chain is built from.
type Options struct {
	// REST is the operator's connection to kube-apiserver: the plugins'
	// clients (a namespace the cache has not seen yet, policies' param
	// objects) and discovery.
	REST *rest.Config
	// Cache serves the configuration objects; it must be started by its
	// owner (the manager, or the mode's own cache).
	Cache cache.Informers
	Log   logr.Logger
}

// discoveryTimeout bounds the wait for kube-apiserver's discovery at start.
const discoveryTimeout = 30 * time.Second

// Apply installs the admission chain into c. ctx bounds the discovery of
// which policy APIs the cluster serves, and the cache's informers.
func Apply(ctx context.Context, c *genericapiserver.RecommendedConfig, o Options) error {
	if o.REST == nil || o.Cache == nil {
		return errors.New("admission: no Kubernetes connection or cache given")
	}
	cs, err := kubernetes.NewForConfig(o.REST)
	if err != nil {
		return fmt.Errorf("admission: kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(o.REST)
	if err != nil {
		return fmt.Errorf("admission: dynamic client: %w", err)
	}
	off, err := unservedPolicyPlugins(ctx, cs.Discovery())
	if err != nil {
		return err
	}
	for _, p := range off {
		o.Log.Info("admission plugin off: the cluster does not serve its API", "plugin", p)
	}
	ao := options.NewAdmissionOptions()
	ao.DisablePlugins = off
	factory := newSharedCache(ctx, cs, o.Cache, o.Log)
	// The generic server starts the factory after it starts serving and
	// reports ready once its informers have synced (informer-sync).
	c.SharedInformerFactory = factory
	if err := ao.ApplyTo(&c.Config, factory, cs, dyn, utilfeature.DefaultFeatureGate, c.EffectiveVersion); err != nil {
		return fmt.Errorf("admission: %w", err)
	}
	return nil
}

// policyAPIs maps each policy plugin onto the resource it reads.
var policyAPIs = map[string]string{
	validating.PluginName: "validatingadmissionpolicies",
	mutating.PluginName:   "mutatingadmissionpolicies",
}

// unservedPolicyPlugins returns the policy plugins whose API the cluster
// does not serve in admissionregistration.k8s.io/v1 (MutatingAdmissionPolicy
// before Kubernetes 1.36): an informer for it would never sync, and the
// plugin would refuse every request as not ready.
func unservedPolicyPlugins(ctx context.Context, d discovery.DiscoveryInterface) ([]string, error) {
	gv := admissionregistrationv1.SchemeGroupVersion.String()
	served := map[string]bool{}
	var last error
	err := wait.PollUntilContextTimeout(ctx, time.Second, discoveryTimeout, true, func(context.Context) (bool, error) {
		list, err := d.ServerResourcesForGroupVersion(gv)
		if err != nil {
			if apierrors.IsNotFound(err) {
				return true, nil // the group version itself is not served
			}
			last = err
			return false, nil
		}
		for _, r := range list.APIResources {
			served[r.Name] = true
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("admission: discover %s: %w (last error: %v)", gv, err, last)
	}
	var off []string
	for plugin, resource := range policyAPIs {
		if !served[resource] {
			off = append(off, plugin)
		}
	}
	slices.Sort(off)
	return off, nil
}
