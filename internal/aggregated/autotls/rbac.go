package autotls

// What the Rotator needs. The Secret's name is configurable, so these
// markers cannot name it; a chart should grant them in a Role in the
// Secret's namespace restricted by resourceNames to that Secret: get,
// update, and list/watch (the Rotator lists and watches with the field
// selector metadata.name=<secretName>, which RBAC authorizes against
// resourceNames). create cannot be restricted by resourceNames (the name
// is not known when the request is authorized), so it needs its own rule
// without resourceNames, or the chart pre-creates the Secret (any type,
// empty data) and drops create. The APIService's name is fixed by the API:
// it must be <version>.<group>, so its rule names it.
//
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=apiregistration.k8s.io,resources=apiservices,resourceNames=v1alpha1.aggregation.coder.com,verbs=get;list;watch;update
