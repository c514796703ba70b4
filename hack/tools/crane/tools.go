//go:build tools

// Package tools pins crane, which the release workflow pushes bin/image
// (the OCI image layout `make image` writes) with. The same
// go-containerregistry as hack/image's, in a module of its own so that its
// dependencies cannot move the project's.
package tools

import _ "github.com/google/go-containerregistry/cmd/crane"
