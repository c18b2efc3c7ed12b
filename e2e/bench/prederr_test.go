package bench

import (
	"math"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func TestPredictionError(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: predictionMetric, Buckets: []float64{0.05, 0.1, 0.15, 0.25, 0.5, 1, 2, 5}})
	reg.MustRegister(h)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	// Before the stage: errors that must not count in it.
	for range 50 {
		h.Observe(3)
	}
	before, err := scrapeHistogram(srv.URL, predictionMetric)
	if err != nil {
		t.Fatal(err)
	}
	// The stage: 30 within 5%, 30 between 10% and 15%, 40 between 25% and 50%.
	for range 30 {
		h.Observe(0.02)
	}
	for range 30 {
		h.Observe(0.12)
	}
	for range 40 {
		h.Observe(0.3)
	}
	after, err := scrapeHistogram(srv.URL, predictionMetric)
	if err != nil {
		t.Fatal(err)
	}
	pe := after.since(before).predictionError()
	if pe == nil || pe.Requests != 100 {
		t.Fatalf("stage's error %+v, want 100 requests", pe)
	}
	if pe.Within15 != 0.6 {
		t.Errorf("within 15%%: %v, want 0.6", pe.Within15)
	}
	// The 50th of 100 is the 20th of 30 in (0.1, 0.15]: 0.1 + 0.05·20/30.
	if want := 0.1 + 0.05*20/30; math.Abs(pe.Median-want) > 1e-9 {
		t.Errorf("median %v, want %v", pe.Median, want)
	}
	if before.since(before).predictionError() != nil {
		t.Error("a stage with no routed requests has an error figure")
	}
	if _, err := scrapeHistogram(srv.URL, "no_such_histogram"); err == nil {
		t.Error("a missing histogram scraped without an error")
	}
	if _, err := scrapeHistogram("http://127.0.0.1:1", predictionMetric); err == nil {
		t.Error("a dead cachesync scraped without an error")
	}
}
