package bench

import (
	"fmt"
	"math"
)

// predictionMetric is cachesync's histogram of |predicted - observed| /
// observed TTFT over the requests the gateways report.
const predictionMetric = "kvroute_cachesync_ttft_prediction_error_ratio"

// PredictionError is how well kvroute predicted time to first token over
// one stage, from cachesync's histogram before and after it.
type PredictionError struct {
	Requests int `json:"requests"`
	// Median is the median relative error (MdAPE), interpolated within the
	// histogram's bucket as Prometheus' histogram_quantile does.
	Median float64 `json:"median"`
	// Within15 is the share of requests predicted within 15%: 0.15 is a
	// bucket bound, so this is exact, and Median < 0.15 exactly when it
	// passes one half.
	Within15 float64 `json:"within_15_percent"`
}

// histogram is a cumulative Prometheus histogram.
type histogram struct {
	bounds []float64 // upper bounds, +Inf excluded
	cum    []float64 // cumulative counts per bound
	count  float64
}

// scrapeHistogram reads the named histogram from url's /metrics.
func scrapeHistogram(url, name string) (histogram, error) {
	fams, err := metricFamilies(url)
	if err != nil {
		return histogram{}, err
	}
	f := fams[name]
	if f == nil || len(f.GetMetric()) != 1 || f.GetMetric()[0].GetHistogram() == nil {
		return histogram{}, fmt.Errorf("bench: %s has no histogram %s", url, name)
	}
	h := f.GetMetric()[0].GetHistogram()
	out := histogram{count: float64(h.GetSampleCount())}
	for _, b := range h.GetBucket() {
		if math.IsInf(b.GetUpperBound(), 1) {
			continue
		}
		out.bounds = append(out.bounds, b.GetUpperBound())
		out.cum = append(out.cum, float64(b.GetCumulativeCount()))
	}
	return out, nil
}

// since is what h counted after earlier, which must have the same buckets.
func (h histogram) since(earlier histogram) histogram {
	d := histogram{bounds: h.bounds, cum: make([]float64, len(h.cum)), count: h.count - earlier.count}
	for i := range h.cum {
		d.cum[i] = h.cum[i]
		if i < len(earlier.cum) {
			d.cum[i] -= earlier.cum[i]
		}
	}
	return d
}

// predictionError summarises a stage's histogram, nil when it counted
// nothing.
func (h histogram) predictionError() *PredictionError {
	if h.count <= 0 {
		return nil
	}
	pe := &PredictionError{Requests: int(h.count), Median: h.quantile(0.5)}
	for i, b := range h.bounds {
		if b == 0.15 {
			pe.Within15 = h.cum[i] / h.count
		}
	}
	return pe
}

// quantile interpolates linearly within the bucket holding the q-th
// observation; past the last bound it answers that bound.
func (h histogram) quantile(q float64) float64 {
	rank := q * h.count
	lower, below := 0.0, 0.0
	for i, b := range h.bounds {
		if h.cum[i] >= rank {
			in := h.cum[i] - below
			if in <= 0 {
				return b
			}
			return lower + (b-lower)*(rank-below)/in
		}
		lower, below = b, h.cum[i]
	}
	return lower
}
