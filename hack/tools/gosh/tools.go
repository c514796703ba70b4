//go:build tools

// Package tools pins mvdan.cc/sh's gosh, the POSIX shell (a Go
// interpreter) of the test stack's Coder image.
package tools

import _ "mvdan.cc/sh/v3/cmd/gosh"
