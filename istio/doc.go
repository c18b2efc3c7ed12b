// Package istio holds kvroute's Istio install (kvroute.yaml, gateway.yaml).
// There is no cluster to apply them to here, so its tests validate them:
// strictly typed against Istio's and Envoy's API types, consistent with one
// another, and, rebuilt into the Envoy configuration the patches produce,
// served by real Envoy with the real module.
package istio
