package main

import (
	"slices"
	"testing"
)

func TestBehind(t *testing.T) {
	main := map[string]built{
		"golang.org/x/net":             {version: "v0.57.0"},
		"google.golang.org/grpc":       {version: "v1.82.1"},
		"k8s.io/client-go":             {version: "v0.36.3"},
		"github.com/hashicorp/hcl/v2":  {version: "v2.24.0"},
		"go.uber.org/zap":              {version: "v1.27.0"},
		"github.com/spf13/cobra":       {version: "v1.10.2"},
		"go.opentelemetry.io/otel/sdk": {version: "v1.44.0"},
	}
	tool := map[string]built{
		"golang.org/x/net":             {version: "v0.49.0"},                 // behind: raised
		"google.golang.org/grpc":       {version: "v1.82.1"},                 // same
		"k8s.io/client-go":             {version: "v0.32.3"},                 // kept by prefix
		"github.com/hashicorp/hcl/v2":  {version: "v2.20.1", replaced: true}, // the tool's replace pins it
		"go.uber.org/zap":              {version: "v1.28.0"},                 // the tool's is newer
		"github.com/only/tool":         {version: "v1.0.0"},                  // not in the main module
		"go.opentelemetry.io/otel/sdk": {version: "v1.40.0"},                 // behind: raised
	}
	got := behind(tool, main, []string{"k8s.io/", "sigs.k8s.io/"})
	want := []module{{"go.opentelemetry.io/otel/sdk", "v1.44.0"}, {"golang.org/x/net", "v0.57.0"}}
	if !slices.Equal(got, want) {
		t.Errorf("behind = %v, want %v", got, want)
	}
}
