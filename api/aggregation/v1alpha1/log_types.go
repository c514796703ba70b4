package v1alpha1

import (
	"fmt"
	"net/url"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/runtime"
)

// CoderLogOptions are the query parameters of the log subresource of
// coderworkspaces (a build's log) and codertemplateversions (the
// version's import log), as PodLogOptions are for pods/log.
//
// +kubebuilder:object:root=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type CoderLogOptions struct {
	metav1.TypeMeta `json:",inline"`

	// Follow streams the log of a running job until the job ends; a
	// finished job's log is returned at once.
	// +optional
	Follow bool `json:"follow,omitempty"`
	// TailLines shows only the last this many lines of the log (stage
	// headers included), as kubectl logs --tail does.
	// +optional
	TailLines *int64 `json:"tailLines,omitempty"`
	// Timestamps prefixes every output line with the time coderd logged
	// it (RFC 3339, nanoseconds, UTC).
	// +optional
	Timestamps bool `json:"timestamps,omitempty"`
	// Build is the number of the workspace build whose log to show; the
	// latest build when unset. coderworkspaces only.
	// +optional
	Build *int32 `json:"build,omitempty"`
}

func addLogOptionsConversion(scheme *runtime.Scheme) error {
	return scheme.AddConversionFunc((*url.Values)(nil), (*CoderLogOptions)(nil), func(a, b any, _ conversion.Scope) error {
		return convertURLValuesToCoderLogOptions(a.(*url.Values), b.(*CoderLogOptions))
	})
}

// convertURLValuesToCoderLogOptions decodes the log subresource's query
// parameters; an unparsable value is an error (a 400) naming it.
func convertURLValuesToCoderLogOptions(in *url.Values, out *CoderLogOptions) error {
	*out = CoderLogOptions{TypeMeta: out.TypeMeta}
	boolean := func(name string, into *bool) error {
		v := in.Get(name)
		if v == "" {
			// ?follow alone means true, as for pods/log.
			*into = in.Has(name)
			return nil
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("query parameter %s: %q is not true or false", name, v)
		}
		*into = b
		return nil
	}
	if err := boolean("follow", &out.Follow); err != nil {
		return err
	}
	if err := boolean("timestamps", &out.Timestamps); err != nil {
		return err
	}
	if v := in.Get("tailLines"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("query parameter tailLines: %q is not an integer", v)
		}
		out.TailLines = &n
	}
	if v := in.Get("build"); v != "" {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil {
			return fmt.Errorf("query parameter build: %q is not a build number", v)
		}
		b := int32(n)
		out.Build = &b
	}
	return nil
}
