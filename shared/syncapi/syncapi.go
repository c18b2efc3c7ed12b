// Package syncapi is the HTTP contract between the filter and cachesync:
// the paths, the query parameter, the validator, the report token and the
// status codes each side must agree on. The filter builds its requests and
// reads cachesync's answers with it; cachesync serves by it.
//
//	GET  SnapshotPath?since=<generation>&epoch=<epoch>   with If-None-Match: ETag(held)
//	     200  a bundle of the parts written after since (all for since=0,
//	          an unknown or future since, or another replica's epoch);
//	          ETag: ETag(generation); EpochHeader: the replica's epoch
//	     304  the generation held is current; no body
//	     400  since is not a generation number
//	     503  no snapshot built yet (Retry-After)
//	POST ReportPath                        Authorization: Bearer(token), report batch body
//	     2xx  accepted (cachesync answers 202: it applies the batch later)
//	     400  corrupt batch; 401 missing or wrong token; 403 reports disabled;
//	     413  the batch is over a size or count limit
//
// It is linked into the Wasm filter, so it uses nothing that pulls in fmt
// or os.
package syncapi

import (
	"strconv"
	"strings"
)

// The paths cachesync serves and the filter asks by default.
const (
	SnapshotPath = "/v1/snapshot"
	ReportPath   = "/v1/reports"
)

// SinceParam names the generation the fetcher already holds.
const SinceParam = "since"

// EpochParam names the epoch of the cachesync that built the snapshot the
// fetcher holds, and EpochHeader carries the answering cachesync's epoch:
// a random name per process. Replicas of cachesync (and one restarted)
// build different histories, so a since from another epoch is answered
// with a whole snapshot, and an If-None-Match from another epoch is not
// matched.
const (
	EpochParam  = "epoch"
	EpochHeader = "x-kvroute-epoch"
)

// ValidEpoch reports whether epoch is one a fetcher may send back: 1 to 32
// lowercase hex digits, which a query needs no escaping for.
func ValidEpoch(epoch string) bool {
	if len(epoch) == 0 || len(epoch) > 32 {
		return false
	}
	for _, c := range []byte(epoch) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// TemplateParam names the chat template the fetching gateway renders
// prompts with, so that cachesync checks each engine's template against it
// (a precise index is only as good as the gateway's render of the prompt).
const TemplateParam = "template"

// AutoTemplate is the TemplateParam of a gateway that renders each model's
// requests with the template the snapshot names for the model.
const AutoTemplate = "auto"

// ContentType is the media type of snapshot bundles and report batches.
const ContentType = "application/octet-stream"

// MaxReportBytes is the largest report batch cachesync accepts by default;
// the filter keeps its batches well under it.
const MaxReportBytes = 16 << 20

// SnapshotQuery returns the request path asking for what changed after
// generation since (0: a whole snapshot), from a gateway that renders with
// the named chat template (a configuration name: letters, digits and dots,
// which need no escaping; and the filter links no net/url).
// epoch, from the answer that brought the snapshot held, is left out when
// empty (a cachesync that does not name one).
func SnapshotQuery(path string, since uint64, epoch, template string) string {
	q := path + "?" + SinceParam + "=" + strconv.FormatUint(since, 10)
	if epoch != "" {
		q += "&" + EpochParam + "=" + epoch
	}
	return q + "&" + TemplateParam + "=" + template
}

// ETag is the entity tag of a generation: its number, quoted.
func ETag(generation uint64) string {
	return `"` + strconv.FormatUint(generation, 10) + `"`
}

// Bearer is the Authorization header value carrying a report token.
func Bearer(token string) string { return "Bearer " + token }

// ParseBearer returns the token of a Bearer Authorization header; the
// scheme is matched case-insensitively, as RFC 9110 says.
func ParseBearer(header string) (token string, ok bool) {
	scheme, cred, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(cred), true
}

// Snapshot answers the filter acts on.
const (
	StatusSnapshot     = 200
	StatusNotModified  = 304
	StatusUnauthorized = 401 // a token is configured and the request's is missing or wrong
)

// ReportAccepted reports whether a status answering a report batch means
// it was taken: any 2xx.
func ReportAccepted(status int) bool { return status >= 200 && status <= 299 }

// ParseStatus parses an HTTP status as the proxy hands it (":status"),
// returning false for anything but three digits.
func ParseStatus(s string) (int, bool) {
	if len(s) != 3 {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 100 {
		return 0, false
	}
	return n, true
}
