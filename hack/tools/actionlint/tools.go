//go:build tools

// Package tools pins actionlint, which `make lint` runs on
// .github/workflows. A module of its own, so its dependencies cannot
// upgrade the other tools'.
package tools

import _ "github.com/rhysd/actionlint/cmd/actionlint"
