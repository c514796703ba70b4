package admission

import (
	"context"
	"fmt"
	"reflect"
	"sync"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/informers/admissionregistration"
	"k8s.io/client-go/informers/core"
	"k8s.io/client-go/informers/internalinterfaces"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/coder/coder-k8s/internal/kubecache"
)

// sharedCache is the informers.SharedInformerFactory the admission plugins
// are given: the informers of the kinds the process's controller-runtime
// cache holds whole (kubecache.Admission) come from that cache, so the
// process lists and watches each kind once. Every other kind (the
// mutating admission policies) falls back to a factory of its own, which
// Start starts.
type sharedCache struct {
	informers.SharedInformerFactory

	ctx   context.Context
	cache cache.Informers
	log   logr.Logger

	mu sync.Mutex
	// handedOut are the cache's informers given to plugins, for
	// WaitForCacheSync (readiness).
	handedOut map[reflect.Type]toolscache.SharedIndexInformer
}

func newSharedCache(ctx context.Context, cs kubernetes.Interface, c cache.Informers, log logr.Logger) *sharedCache {
	return &sharedCache{
		SharedInformerFactory: informers.NewSharedInformerFactory(cs, 0),
		ctx:                   ctx,
		cache:                 c,
		log:                   log,
		handedOut:             map[reflect.Type]toolscache.SharedIndexInformer{},
	}
}

// Core and Admissionregistration build their informers through this
// factory's InformerFor (the embedded factory's would use its own).
func (f *sharedCache) Core() core.Interface { return core.New(f, metav1.NamespaceAll, nil) }

func (f *sharedCache) Admissionregistration() admissionregistration.Interface {
	return admissionregistration.New(f, metav1.NamespaceAll, nil)
}

// InformerFor returns the cache's informer for obj's kind. The cache
// starts it (now, or when the cache starts); plugins wait for it to sync.
func (f *sharedCache) InformerFor(obj runtime.Object, newFunc internalinterfaces.NewInformerFunc) toolscache.SharedIndexInformer {
	typ := reflect.TypeOf(obj)
	f.mu.Lock()
	defer f.mu.Unlock()
	if inf, ok := f.handedOut[typ]; ok {
		return inf
	}
	if o, ok := obj.(client.Object); ok && cachedWhole(o) {
		got, err := f.cache.GetInformer(f.ctx, o, cache.BlockUntilSynced(false))
		if err == nil {
			if inf, ok := got.(toolscache.SharedIndexInformer); ok {
				f.handedOut[typ] = inf
				return inf
			}
			err = fmt.Errorf("the cache's informer is a %T", got)
		}
		f.log.Error(err, "admission reads this kind through an informer of its own", "kind", typ.String())
	}
	return f.SharedInformerFactory.InformerFor(obj, newFunc)
}

// cachedWhole reports whether the shared cache holds obj's kind whole
// (kubecache.Admission); it holds other kinds only in part, by label.
func cachedWhole(obj client.Object) bool {
	for _, o := range kubecache.Admission() {
		if reflect.TypeOf(o) == reflect.TypeOf(obj) {
			return true
		}
	}
	return false
}

// WaitForCacheSync reports the cache's informers handed out and the
// fallback factory's, like a factory: the generic server's informer-sync
// readiness check asks with a closed channel, for the state now.
func (f *sharedCache) WaitForCacheSync(stop <-chan struct{}) map[reflect.Type]bool {
	out := f.SharedInformerFactory.WaitForCacheSync(stop)
	f.mu.Lock()
	inf := make(map[reflect.Type]toolscache.SharedIndexInformer, len(f.handedOut))
	for typ, i := range f.handedOut {
		inf[typ] = i
	}
	f.mu.Unlock()
	for typ, i := range inf {
		out[typ] = toolscache.WaitForCacheSync(stop, i.HasSynced)
	}
	return out
}
