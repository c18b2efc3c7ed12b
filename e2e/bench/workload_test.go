package bench

import "testing"

// TestClientHoldsNoRequestBack checks that on every rate stage of every
// workload a single client worker may have all the stage's requests in
// flight at once: a cap that binds turns the open loop closed, and the
// requests it holds back queue where TTFT does not see them.
func TestClientHoldsNoRequestBack(t *testing.T) {
	const stageSeconds = 15
	for _, w := range append(Workloads, sharedFraction(30, []float64{2, 4, 8, 96})) {
		if w.Concurrency != nil {
			continue
		}
		for i, rate := range w.Rates {
			load := w.config(Model, "http://127.0.0.1:1", "tok", "out", "trace.csv", i, stageSeconds)["load"].(map[string]any)
			if got, n := load["worker_max_concurrency"].(int), traceRequests(rate, stageSeconds); got < n {
				t.Errorf("%s at %v req/s: a worker may have %d requests in flight of the stage's %d", w.Name, rate, got, n)
			}
		}
	}
}
