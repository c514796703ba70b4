//go:build tools

// Package tools pins the helm CLI used by chart tests and ct.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
