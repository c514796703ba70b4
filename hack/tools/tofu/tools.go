//go:build tools

// Package tools pins OpenTofu, installed as `terraform` for coderd's
// provisioner in the test stack.
package tools

import _ "github.com/opentofu/opentofu/cmd/tofu"
