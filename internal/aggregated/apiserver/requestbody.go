package apiserver

import (
	"errors"
	"io"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// withBodyErrorsAsBadRequest makes a request body that cannot be read (a
// malformed chunked encoding, a connection cut mid-body) a 400:
// k8s.io/apiserver answers any error that is not a Kubernetes status with
// a 500, which would blame the server for the client's bytes.
func withBodyErrorsAsBadRequest(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = badRequestBody{r.Body}
		}
		next.ServeHTTP(w, r)
	})
}

type badRequestBody struct{ io.ReadCloser }

func (b badRequestBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = apierrors.NewBadRequest("read the request body: " + err.Error())
	}
	return n, err
}
