package report

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// benchRecords is a batch's worth of routing decisions: 1000 requests with
// prompts of 125 blocks (8 KB of text) each.
func benchRecords() []Record {
	rng := rand.New(rand.NewPCG(1, 2))
	recs := make([]Record, 1000)
	for i := range recs {
		hs := make([]uint64, 125)
		for j := range hs {
			hs[j] = rng.Uint64()
		}
		recs[i] = Record{Endpoint: "10.0.0." + strconv.Itoa(i%64) + ":8000", Model: "Qwen/Qwen2.5-7B-Instruct", Hashes: hs, Cached: 60}
	}
	return recs
}

// BenchmarkEncode measures what a filter worker does per request (encode its
// record) plus what the tick does per record (copy it into the batch).
func BenchmarkEncode(b *testing.B) {
	recs := benchRecords()
	var w Writer
	item := make([]byte, 0, 2048)
	b.ReportAllocs()
	for b.Loop() {
		w.Reset()
		for i := range recs {
			item, _ = AppendRecord(item[:0], &recs[i])
			if _, err := w.AddEncoded(item); err != nil {
				b.Fatal(err)
			}
		}
		_ = w.Bytes()
	}
	b.SetBytes(int64(w.Size()))
	b.ReportMetric(float64(len(recs))*float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkDecode measures what cachesync does per report batch: check it
// and read every record's hashes.
func BenchmarkDecode(b *testing.B) {
	recs := benchRecords()
	var w Writer
	for i := range recs {
		_ = w.Add(&recs[i])
	}
	body := w.Bytes()
	hs := make([]uint64, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		bt, err := Parse(body, Limits{})
		if err != nil {
			b.Fatal(err)
		}
		for e := range bt.Records() {
			hs = e.AppendHashes(hs[:0])
		}
	}
	b.SetBytes(int64(len(body)))
	b.ReportMetric(float64(len(recs))*float64(b.N)/b.Elapsed().Seconds(), "records/s")
}
