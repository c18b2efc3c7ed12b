package report

import (
	"errors"
	"math"
	"slices"
	"strconv"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/shared/predict"
)

func sample(n int) []Record {
	recs := make([]Record, n)
	for i := range recs {
		hs := make([]uint64, i%7)
		for j := range hs {
			hs[j] = xxhash.Sum64String(strconv.Itoa(i*100 + j))
		}
		recs[i] = Record{
			Endpoint: "10.0.0." + strconv.Itoa(i%250) + ":8000",
			Model:    []string{"", "Qwen/Qwen2.5-7B-Instruct", "m"}[i%3],
			Hashes:   hs,
			Cached:   len(hs) / 2,
			Reason:   Reasons[i%len(Reasons)],
			Output:   (i * 37) % 2000,
			Bytes:    (i * 4099) % 90000,
		}
	}
	return recs
}

// decoded is a parsed record in comparable form.
func decoded(t *testing.T, b []byte, lim Limits) []Record {
	t.Helper()
	bt, err := Parse(b, lim)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	var out []Record
	for e := range bt.Records() {
		hs := e.AppendHashes(nil)
		if len(hs) != e.NumHashes() {
			t.Fatalf("AppendHashes gave %d hashes, NumHashes %d", len(hs), e.NumHashes())
		}
		for i, h := range hs {
			if e.Hash(i) != h {
				t.Fatalf("Hash(%d) = %#x, AppendHashes has %#x", i, e.Hash(i), h)
			}
		}
		out = append(out, Record{Endpoint: string(e.Endpoint()), Model: string(e.Model()), Hashes: hs, Cached: e.Cached(), Reason: e.Reason(), Output: e.Output(), Bytes: e.Bytes()})
	}
	if len(out) != bt.Len() {
		t.Fatalf("Records yielded %d, Len %d", len(out), bt.Len())
	}
	return out
}

func sameRecords(a, b []Record) bool {
	return slices.EqualFunc(a, b, func(x, y Record) bool {
		return x.Endpoint == y.Endpoint && x.Model == y.Model && x.Cached == y.Cached && x.Reason == y.Reason && x.Output == y.Output && x.Bytes == y.Bytes &&
			len(x.Hashes) == len(y.Hashes) && (len(x.Hashes) == 0 || slices.Equal(x.Hashes, y.Hashes))
	})
}

func TestRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 2, 100} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			recs := sample(n)
			var w Writer
			for i := range recs {
				if err := w.Add(&recs[i]); err != nil {
					t.Fatal(err)
				}
			}
			b := w.Bytes()
			if w.Len() != n || w.Size() != len(b) {
				t.Fatalf("Len %d Size %d, want %d and %d", w.Len(), w.Size(), n, len(b))
			}
			if got := decoded(t, b, Limits{}); !sameRecords(got, recs) {
				t.Fatalf("decoded %+v, want %+v", got, recs)
			}
			bt, _ := Parse(b, Limits{})
			want := 0
			for _, r := range recs {
				want += len(r.Hashes)
			}
			if bt.NumHashes() != want {
				t.Fatalf("NumHashes = %d, want %d", bt.NumHashes(), want)
			}
		})
	}
}

// TestConcatenate does what the filter does: workers encode one record per
// request into a queue, a tick concatenates queued items into one batch.
func TestConcatenate(t *testing.T) {
	recs := sample(20)
	var queue [][]byte
	for i := range recs {
		item, err := AppendRecord(nil, &recs[i])
		if err != nil {
			t.Fatal(err)
		}
		queue = append(queue, item)
	}
	// Two items combined into one are still valid input.
	queue[3] = append(queue[3], queue[4]...)
	queue = slices.Delete(queue, 4, 5)

	var w Writer
	for _, item := range queue {
		if _, err := w.AddEncoded(item); err != nil {
			t.Fatal(err)
		}
	}
	if got := decoded(t, w.Bytes(), Limits{}); !sameRecords(got, recs) {
		t.Fatalf("decoded %+v, want %+v", got, recs)
	}

	// A batch flushed and reset starts over, and adding after Bytes works.
	w.Reset()
	if _, err := w.AddEncoded(queue[0]); err != nil {
		t.Fatal(err)
	}
	_ = w.Bytes()
	if err := w.Add(&recs[1]); err != nil {
		t.Fatal(err)
	}
	if got := decoded(t, w.Bytes(), Limits{}); !sameRecords(got, recs[:2]) {
		t.Fatalf("after reset: %+v", got)
	}
}

func TestAddEncodedRejects(t *testing.T) {
	good, _ := AppendRecord(nil, &Record{Endpoint: "10.0.0.1:8000", Hashes: []uint64{1, 2, 3}})
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"truncated", good[:len(good)-1]},
		{"trailing bytes", append(slices.Clone(good), 0xB1)},
		{"bad tag", append([]byte{0xB3}, good[1:]...)},
		{"batch instead of records", (&Writer{}).Bytes()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w Writer
			if err := w.Add(&Record{Endpoint: "a:1"}); err != nil {
				t.Fatal(err)
			}
			if n, err := w.AddEncoded(tc.b); err == nil || n != 0 {
				t.Fatalf("AddEncoded = %d, %v; want an error", n, err)
			}
			if w.Len() != 1 || len(decoded(t, w.Bytes(), Limits{})) != 1 {
				t.Fatal("a refused item changed the batch")
			}
		})
	}
}

func TestAppendRecordRejects(t *testing.T) {
	long := string(make([]byte, 256))
	for _, tc := range []struct {
		name string
		r    Record
	}{
		{"no endpoint", Record{}},
		{"long endpoint", Record{Endpoint: long}},
		{"long model", Record{Endpoint: "a:1", Model: long}},
		{"negative cached", Record{Endpoint: "a:1", Cached: -1}},
		{"cached over hashes", Record{Endpoint: "a:1", Hashes: []uint64{1}, Cached: 2}},
		{"too many hashes", Record{Endpoint: "a:1", Hashes: make([]uint64, MaxHashes+1)}},
		{"negative bytes", Record{Endpoint: "a:1", Bytes: -1}},
		{"too many bytes", Record{Endpoint: "a:1", Bytes: MaxBytes + 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := []byte("keep")
			got, err := AppendRecord(dst, &tc.r)
			if err == nil || string(got) != "keep" {
				t.Fatalf("AppendRecord = %q, %v; want dst unchanged and an error", got, err)
			}
		})
	}
}

// TestOutcomes checks that outcome records travel in a batch among routing
// records and come back as they went, and that figures Parse would refuse
// are refused when the record is made.
func TestOutcomes(t *testing.T) {
	want := Outcome{
		Endpoint:  "10.0.0.2:8000",
		Features:  predict.Features{Uncached: 1200, Backlog: 4096, Running: 7, Waiting: 1, Wait: 0.03125},
		Predicted: 0.25, Observed: 0.375,
	}
	var w Writer
	recs := sample(2)
	if err := w.Add(&recs[0]); err != nil {
		t.Fatal(err)
	}
	enc, err := AppendOutcome(nil, &want)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := w.AddEncoded(enc); err != nil || n != 1 {
		t.Fatalf("AddEncoded(outcome) = %d, %v", n, err)
	}
	if err := w.Add(&recs[1]); err != nil {
		t.Fatal(err)
	}
	bt, err := Parse(w.Bytes(), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []bool
	for e := range bt.Records() {
		kinds = append(kinds, e.IsOutcome())
		if !e.IsOutcome() {
			continue
		}
		got := e.Outcome()
		got.Endpoint = string(e.Endpoint())
		if got != want {
			t.Errorf("outcome %+v, want %+v", got, want)
		}
		if e.NumHashes() != 0 || len(e.Model()) != 0 {
			t.Errorf("an outcome reads as a routing record with %d hashes, model %q", e.NumHashes(), e.Model())
		}
	}
	if !slices.Equal(kinds, []bool{false, true, false}) {
		t.Errorf("records in order are outcomes %v", kinds)
	}

	for _, bad := range []Outcome{
		{},
		{Endpoint: "a:1", Observed: -1},
		{Endpoint: "a:1", Predicted: math.NaN()},
		{Endpoint: "a:1", Features: predict.Features{Backlog: math.Inf(1)}},
		{Endpoint: "a:1", Features: predict.Features{Running: 1e39}}, // infinite as a float32
		{Endpoint: "a:1", Features: predict.Features{Wait: -0.5}},
	} {
		if got, err := AppendOutcome([]byte("keep"), &bad); err == nil || string(got) != "keep" {
			t.Errorf("AppendOutcome(%+v) = %q, %v; want dst unchanged and an error", bad, got, err)
		}
	}
	// A record that lies about its figures is corrupt.
	b := slices.Clone(w.Bytes())
	at := headerSize + len(enc) - 4 // the observed TTFT, after the first record
	first, _ := AppendRecord(nil, &recs[0])
	at += len(first)
	le.PutUint32(b[at:], math.Float32bits(-1))
	if _, err := Parse(reseal(b), Limits{}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("negative observed TTFT: Parse = %v, want ErrCorrupt", err)
	}
	// Version 3 had no wait: the word was reserved, and a batch of that
	// version carrying one is corrupt; its outcomes read with no wait.
	v3 := downgrade(t, w.Bytes(), 3)
	if _, err := Parse(reseal(v3), Limits{}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a version 3 outcome with a wait: Parse = %v, want ErrCorrupt", err)
	}
	le.PutUint32(v3[headerSize+len(first)-(routeFixed-recordFixed)+4:], 0) // the outcome's wait, after the shortened record
	bt3, err := Parse(reseal(v3), Limits{})
	if err != nil {
		t.Fatalf("version 3 batch: %v", err)
	}
	for e := range bt3.Records() {
		if e.IsOutcome() {
			if got := e.Outcome(); got.Features.Wait != 0 || got.Predicted != want.Predicted {
				t.Errorf("version 3 outcome %+v", got)
			}
		}
	}
}

// reseal recomputes a batch's checksum so that a test reaches the checks
// behind it.
func reseal(b []byte) []byte {
	b = slices.Clone(b)
	if len(b) >= 8 {
		le.PutUint64(b[len(b)-8:], xxhash.Sum64(b[:len(b)-8]))
	}
	return b
}

// downgrade rewrites a batch to version v (2 to 5): its routing records
// lose the words that version lacks (output before 5, bytes before 6),
// which then read as 0. Reasons and waits are left for the caller to clear.
func downgrade(t *testing.T, b []byte, v uint16) []byte {
	t.Helper()
	bt, err := Parse(b, Limits{})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	out := slices.Clone(b[:headerSize])
	le.PutUint16(out[4:], v)
	for e := range bt.Records() {
		if e.IsOutcome() {
			out = append(out, e.b...)
			continue
		}
		out = append(out, e.b[:routeFixedOf(v)]...)
		out = append(out, e.b[routeFixed:]...)
	}
	return reseal(append(out, make([]byte, trailerSize)...))
}

// TestReadsVersion2: a batch from a gateway of the previous format (no
// reasons) is still read, so cachesync may be upgraded first.
func TestReadsVersion2(t *testing.T) {
	recs := sample(5)
	for i := range recs {
		recs[i].Reason = ""
	}
	var w Writer
	for i := range recs {
		if err := w.Add(&recs[i]); err != nil {
			t.Fatal(err)
		}
	}
	for i := range recs {
		recs[i].Output, recs[i].Bytes = 0, 0
	}
	if got := decoded(t, downgrade(t, w.Bytes(), 2), Limits{}); !sameRecords(got, recs) {
		t.Errorf("version 2 batch read as %+v", got)
	}
}

// TestReadsVersion5: a batch from a gateway before prompt bytes keeps its
// outputs, and its prompts read as of unknown length.
func TestReadsVersion5(t *testing.T) {
	recs := sample(5)
	var w Writer
	for i := range recs {
		if err := w.Add(&recs[i]); err != nil {
			t.Fatal(err)
		}
	}
	for i := range recs {
		recs[i].Bytes = 0
	}
	if got := decoded(t, downgrade(t, w.Bytes(), 5), Limits{}); !sameRecords(got, recs) {
		t.Errorf("version 5 batch read as %+v", got)
	}
}

func TestParseRejects(t *testing.T) {
	var w Writer
	recs := sample(3)
	recs[2].Hashes = []uint64{7, 8, 9, 10}
	for i := range recs {
		if err := w.Add(&recs[i]); err != nil {
			t.Fatal(err)
		}
	}
	good := slices.Clone(w.Bytes())
	rec2 := len(good) - 8 - (routeFixed + len(recs[2].Endpoint) + len(recs[2].Model) + 32)
	edit := func(f func(b []byte) []byte) []byte { return reseal(f(slices.Clone(good))) }
	for _, tc := range []struct {
		name string
		b    []byte
		lim  Limits
		want error
	}{
		{"empty", nil, Limits{}, ErrCorrupt},
		{"short", good[:20], Limits{}, ErrCorrupt},
		{"truncated", good[:len(good)-3], Limits{}, ErrCorrupt},
		{"bit flip", func() []byte { b := slices.Clone(good); b[40] ^= 1; return b }(), Limits{}, ErrCorrupt},
		{"bad magic", edit(func(b []byte) []byte { b[0] = 'X'; return b }), Limits{}, ErrCorrupt},
		{"version", edit(func(b []byte) []byte { b[4] = Version + 1; return b }), Limits{}, ErrVersion},
		{"reserved header", edit(func(b []byte) []byte { b[12] = 1; return b }), Limits{}, ErrCorrupt},
		{"count too high", edit(func(b []byte) []byte { b[8] = 4; return b }), Limits{}, ErrCorrupt},
		{"count too low", edit(func(b []byte) []byte { b[8] = 2; return b }), Limits{}, ErrCorrupt},
		{"record tag", edit(func(b []byte) []byte { b[rec2] = 0; return b }), Limits{}, ErrCorrupt},
		{"unknown reason", edit(func(b []byte) []byte { b[rec2+3] = byte(len(Reasons)); return b }), Limits{}, ErrCorrupt},
		{"a reason in version 2", edit(func(b []byte) []byte { b[4] = 2; b[rec2+3] = 1; return b }), Limits{}, ErrCorrupt},
		{"no endpoint", edit(func(b []byte) []byte { b[rec2+1] = 0; return b }), Limits{}, ErrCorrupt},
		{"cached over hashes", edit(func(b []byte) []byte { b[rec2+8] = 5; return b }), Limits{}, ErrCorrupt},
		{"output out of range", edit(func(b []byte) []byte { le.PutUint32(b[rec2+12:], MaxOutput+1); return b }), Limits{}, ErrCorrupt},
		{"bytes out of range", edit(func(b []byte) []byte { le.PutUint32(b[rec2+16:], MaxBytes+1); return b }), Limits{}, ErrCorrupt},
		{"hash count past end", edit(func(b []byte) []byte { b[rec2+4] = 5; return b }), Limits{}, ErrCorrupt},
		{"hash count huge", edit(func(b []byte) []byte { le.PutUint32(b[rec2+4:], 1<<31); return b }), Limits{MaxHashes: 1 << 30}, ErrCorrupt},
		{"too many records", good, Limits{MaxRecords: 2}, ErrLimit},
		{"too many hashes", good, Limits{MaxHashes: 3}, ErrLimit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bt, err := Parse(tc.b, tc.lim)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Parse = %v, want %v", err, tc.want)
			}
			if bt.Len() != 0 {
				t.Fatal("a rejected batch has records")
			}
		})
	}
	if _, err := Parse(good, Limits{MaxRecords: 3, MaxHashes: 4}); err != nil {
		t.Fatalf("at the limits: %v", err)
	}
}

func TestEncodeAllocs(t *testing.T) {
	r := Record{Endpoint: "10.1.2.3:8000", Model: "m", Hashes: make([]uint64, 500), Cached: 10}
	buf := make([]byte, 0, 8192)
	var w Writer
	item, _ := AppendRecord(nil, &r)
	for range 3 { // grow the writer's buffer
		_ = w.Add(&r)
		_, _ = w.AddEncoded(item)
	}
	got := testing.AllocsPerRun(100, func() {
		buf, _ = AppendRecord(buf[:0], &r)
		w.Reset()
		_ = w.Add(&r)
		_, _ = w.AddEncoded(item)
		_ = w.Bytes()
	})
	if got != 0 {
		t.Fatalf("%v allocations per record", got)
	}
	var hs []uint64
	b := w.Bytes()
	got = testing.AllocsPerRun(100, func() {
		bt, err := Parse(b, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		for e := range bt.Records() {
			hs = e.AppendHashes(hs[:0])
		}
	})
	if got != 0 {
		t.Fatalf("%v allocations per decode", got)
	}
}

// FuzzParse checks that Parse never panics, and that whatever it accepts
// reads in full and encodes back to the same bytes.
func FuzzParse(f *testing.F) {
	for _, n := range []int{0, 1, 5} {
		var w Writer
		recs := sample(n)
		for i := range recs {
			_ = w.Add(&recs[i])
		}
		f.Add(slices.Clone(w.Bytes()))
	}
	// An outcome record among routing records (what a long run found the
	// re-encoding below mishandled).
	var w Writer
	recs := sample(2)
	w.Add(&recs[1])
	o, _ := AppendOutcome(nil, &Outcome{Endpoint: "10.0.0.1:8000", Features: predict.Features{Uncached: 100, Running: 2}, Predicted: 0.5, Observed: 0.4})
	w.AddEncoded(o)
	f.Add(slices.Clone(w.Bytes()))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, raw := range [][]byte{b, reseal(b)} {
			bt, err := Parse(raw, Limits{})
			if err != nil {
				continue
			}
			var w Writer
			var hs []uint64
			for e := range bt.Records() {
				if e.IsOutcome() {
					o := e.Outcome()
					o.Endpoint = string(e.Endpoint())
					b, err := AppendOutcome(nil, &o)
					if err == nil {
						_, err = w.AddEncoded(b)
					}
					if err != nil {
						t.Fatalf("accepted outcome %+v does not encode: %v", o, err)
					}
					continue
				}
				hs = e.AppendHashes(hs[:0])
				r := Record{Endpoint: string(e.Endpoint()), Model: string(e.Model()), Hashes: hs, Cached: e.Cached(), Reason: e.Reason(), Output: e.Output(), Bytes: e.Bytes()}
				if err := w.Add(&r); err != nil {
					t.Fatalf("accepted record %+v does not encode: %v", r, err)
				}
			}
			got := slices.Clone(w.Bytes())
			if raw[4] < Version { // older versions read, the current one writes
				got = downgrade(t, got, uint16(raw[4]))
			}
			if string(got) != string(raw) {
				t.Fatalf("re-encoded batch differs:\n%x\n%x", got, raw)
			}
		}
	})
}
