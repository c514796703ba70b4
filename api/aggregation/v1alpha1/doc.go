// Package v1alpha1 holds the aggregation.coder.com/v1alpha1 types that the
// aggregated API server serves: CoderWorkspace and CoderTemplate, views of
// Coder objects whose storage is coderd, not etcd.
//
// +kubebuilder:object:generate=true
// +k8s:openapi-gen=true
// +k8s:openapi-model-package=com.coder.aggregation.v1alpha1
// +groupName=aggregation.coder.com
package v1alpha1
