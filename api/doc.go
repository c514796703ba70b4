// Package api holds coder-k8s's API types: coder.com/v1alpha1 (the CRDs the
// controller reconciles) and aggregation.coder.com/v1alpha1 (the resources
// the aggregated API server serves).
package api
