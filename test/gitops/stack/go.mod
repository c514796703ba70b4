module github.com/coder/coder-k8s/test/gitops/stack

go 1.26.0
