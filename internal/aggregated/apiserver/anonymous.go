package apiserver

import (
	"errors"
	"net/http"
	"slices"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	genericapiserver "k8s.io/apiserver/pkg/server"
)

// anonymousOnlyFor drops anonymous identities on every path but paths, so
// that unauthenticated callers of the API get 401 while kubelet probes can
// still reach the health endpoints.
func anonymousOnlyFor(inner authenticator.Request, paths []string) authenticator.Request {
	return authenticator.RequestFunc(func(req *http.Request) (*authenticator.Response, bool, error) {
		resp, ok, err := inner.AuthenticateRequest(req)
		if ok && resp.User.GetName() == user.Anonymous && !slices.Contains(paths, req.URL.Path) {
			return nil, false, err
		}
		return resp, ok, err
	})
}

// authenticationLoaded reports whether the CA bundles that verify client
// certificates and the front proxy have been read from kube-apiserver.
func authenticationLoaded(c *genericapiserver.Config) error {
	if c.SecureServing == nil || c.SecureServing.ClientCA == nil || len(c.SecureServing.ClientCA.CurrentCABundleContent()) == 0 {
		return errors.New("client CA bundle not loaded from kube-system/extension-apiserver-authentication yet")
	}
	if rh := c.Authentication.RequestHeaderConfig; rh == nil || rh.CAContentProvider == nil || len(rh.CAContentProvider.CurrentCABundleContent()) == 0 {
		return errors.New("front-proxy CA bundle not loaded from kube-system/extension-apiserver-authentication yet")
	}
	return nil
}
