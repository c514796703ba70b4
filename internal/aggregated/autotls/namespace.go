package autotls

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// PodNamespaceEnv is the environment variable the chart sets from the
// downward API (metadata.namespace).
const PodNamespaceEnv = "POD_NAMESPACE"

// serviceAccountNamespaceFile is where the kubelet mounts the pod's
// namespace with its service account token.
const serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// ResolveNamespace returns configured, or when it is empty the pod's own
// namespace: $POD_NAMESPACE, else the service account's namespace file.
func ResolveNamespace(configured string) (string, error) {
	return resolveNamespace(configured, os.Getenv, os.ReadFile)
}

func resolveNamespace(configured string, getenv func(string) string, readFile func(string) ([]byte, error)) (string, error) {
	if configured != "" {
		return configured, nil
	}
	if ns := strings.TrimSpace(getenv(PodNamespaceEnv)); ns != "" {
		return ns, nil
	}
	b, err := readFile(serviceAccountNamespaceFile)
	if ns := strings.TrimSpace(string(b)); err == nil && ns != "" {
		return ns, nil
	}
	if err == nil {
		err = errors.New("empty")
	}
	return "", fmt.Errorf("namespace is empty and the pod's namespace is unknown ($%s is unset, %s: %v): set aggregatedAPIServer.autoTLS.namespace or %s",
		PodNamespaceEnv, serviceAccountNamespaceFile, err, PodNamespaceEnv)
}
