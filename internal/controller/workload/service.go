package workload

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

// DefaultServicePort is the Service port when spec.service.port is unset
// (the CRDs default it too).
const DefaultServicePort = 80

// ServicePort is spec's port, or DefaultServicePort.
func ServicePort(spec coderv1alpha1.ServiceSpec) int32 {
	if spec.Port > 0 {
		return spec.Port
	}
	return DefaultServicePort
}

// Service is the Service called name in front of the pods selector
// selects, shaped by spec (type, annotations, load balancer settings)
// with the given ports.
func Service(spec coderv1alpha1.ServiceSpec, name, namespace string, labels, selector map[string]string, ports []corev1.ServicePort) *corev1.Service {
	typ := spec.Type
	if typ == "" {
		typ = corev1.ServiceTypeClusterIP
	}
	svc := &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Namespace:   namespace,
			Labels:      labels,
			Annotations: MergeMaps(spec.Annotations, nil),
		},
		Spec: corev1.ServiceSpec{
			Type:     typ,
			Selector: selector,
			Ports:    ports,
		},
	}
	if typ == corev1.ServiceTypeLoadBalancer {
		svc.Spec.LoadBalancerIP = spec.LoadBalancerIP
	}
	// The API server refuses externalTrafficPolicy on a ClusterIP Service.
	if typ == corev1.ServiceTypeNodePort || typ == corev1.ServiceTypeLoadBalancer {
		svc.Spec.ExternalTrafficPolicy = spec.ExternalTrafficPolicy
	}
	return svc
}
