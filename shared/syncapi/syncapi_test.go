package syncapi

import "testing"

func TestReportAccepted(t *testing.T) {
	for _, tc := range []struct {
		status int
		want   bool
	}{
		{200, true}, {202, true}, {204, true}, {299, true},
		{199, false}, {300, false}, {304, false}, {400, false}, {401, false}, {403, false}, {413, false}, {503, false},
	} {
		if got := ReportAccepted(tc.status); got != tc.want {
			t.Errorf("ReportAccepted(%d) = %v, want %v", tc.status, got, tc.want)
		}
	}
}

func TestParseStatus(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"202", 202, true}, {"304", 304, true}, {"", 0, false}, {"20", 0, false}, {"2020", 0, false},
		{"abc", 0, false}, {"099", 0, false}, {"+20", 0, false},
	} {
		got, ok := ParseStatus(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParseStatus(%q) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestBearerRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		header string
		token  string
		ok     bool
	}{
		{Bearer("s3cret"), "s3cret", true},
		{"bearer s3cret", "s3cret", true},
		{"BEARER  s3cret ", "s3cret", true},
		{"Basic czNjcmV0", "", false},
		{"Bearer", "", false},
		{"", "", false},
	} {
		got, ok := ParseBearer(tc.header)
		if got != tc.token || ok != tc.ok {
			t.Errorf("ParseBearer(%q) = %q, %v; want %q, %v", tc.header, got, ok, tc.token, tc.ok)
		}
	}
}

func TestSnapshotQueryAndETag(t *testing.T) {
	if got := SnapshotQuery(SnapshotPath, 42, "1f2e", "llama3"); got != "/v1/snapshot?since=42&epoch=1f2e&template=llama3" {
		t.Errorf("SnapshotQuery with an epoch = %q", got)
	}
	if got := SnapshotQuery(SnapshotPath, 42, "", "llama3"); got != "/v1/snapshot?since=42&template=llama3" {
		t.Errorf("SnapshotQuery = %q", got)
	}
	if got := ETag(42); got != `"42"` {
		t.Errorf("ETag = %q", got)
	}
}

func TestValidEpoch(t *testing.T) {
	for epoch, want := range map[string]bool{"0123456789abcdef": true, "": false, "12&x=1": false, "ABC": false, "0123456789abcdef0123456789abcdef0": false} {
		if got := ValidEpoch(epoch); got != want {
			t.Errorf("ValidEpoch(%q) = %v", epoch, got)
		}
	}
}
