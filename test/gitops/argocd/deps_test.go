package argocd

import (
	_ "github.com/argoproj/gitops-engine/pkg/cache"
	_ "github.com/argoproj/gitops-engine/pkg/diff"
	_ "github.com/argoproj/gitops-engine/pkg/engine"
	_ "github.com/argoproj/gitops-engine/pkg/health"
	_ "github.com/argoproj/gitops-engine/pkg/sync"
)
