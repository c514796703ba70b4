//go:build tools

// Package tools pins Coder's Terraform provider, which the test stack's
// OpenTofu installs from the filesystem mirror bin/tfproviders.
package tools

import _ "github.com/coder/terraform-provider-coder/v2"
