//go:build tools

// Package tools pins chart-testing (ct).
package tools

import _ "github.com/helm/chart-testing/v3/ct"
