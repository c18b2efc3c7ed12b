package service

import (
	"bytes"
	"cmp"
	"html/template"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// EngineStatus is one engine's row on the status page. The daemon fills it
// from the same state its per-engine metrics read, and every number on the
// page names the metric it matches (data-metric), so the two can be
// checked against each other.
type EngineStatus struct {
	Addr, Name string
	Kind       string // vllm, sglang, llamacpp
	Health     string
	Precise    bool   // indexed from KV events; else from routing reports
	Template   string // the chat template it renders with, as checked
	Agreement  string // the check's verdict: agrees, disagrees at byte N, unchecked
	Rate       float64
	Calibrated bool
	Running    int
	Waiting    int
	KVUsage    float64
	// IndexBlocks are its entries in the latest snapshot's index.
	IndexBlocks int
	// Prefixes are the prefixes it holds that gateways recently routed
	// there, in the latest snapshot (snapshot.Endpoint.Prefixes).
	Prefixes int
	// DecodeDemand is the output tokens per second that the requests
	// gateways routed to it recently asked for (cachesync/internal/demand).
	DecodeDemand float64
}

// StatusRefresh is how often the status page reloads itself.
const StatusRefresh = 5 * time.Second

var statusPage = template.Must(template.New("status").Funcs(template.FuncMap{
	"pct":  func(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) },
	"num":  func(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) },
	"secs": func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) },
	"ms":   func(d time.Duration) string { return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 1, 64) },
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{{.Refresh}}">
<title>kvroute cachesync</title>
<style>
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin-bottom:1.5em}
th,td{border:1px solid #ccc;padding:.3em .6em;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}
.bad{color:#b00}.warn{color:#a60}
</style></head><body>
<h1>kvroute cachesync</h1>
<p>{{len .Engines}} engines; page built {{.Now.Format "2006-01-02 15:04:05 MST"}}, reloads every {{.Refresh}} s.</p>
<h2>Engines</h2>
<table id="engines">
<tr><th class="l">engine</th><th class="l">name</th><th class="l">kind</th><th class="l">health</th><th class="l">mode</th><th class="l">template</th><th class="l">template check</th>
<th>prefill rate (tokens/s)</th><th>running</th><th>waiting</th><th>KV cache used (%)</th><th>index entries</th><th>prefixes</th><th>decode demand (tokens/s)</th></tr>
{{range .Engines}}<tr data-engine="{{.Addr}}">
<td class="l">{{.Addr}}</td><td class="l">{{.Name}}</td><td class="l">{{.Kind}}</td>
<td class="l{{if ne .Health "healthy"}} bad{{end}}">{{.Health}}</td>
<td class="l{{if not .Precise}} warn{{end}}">{{if .Precise}}precise{{else}}approximate{{end}}</td>
<td class="l">{{.Template}}</td><td class="l">{{.Agreement}}</td>
<td data-metric='kvroute_cachesync_engine_prefill_rate_tokens_per_second{engine="{{.Addr}}"}' data-value="{{num .Rate}}">{{printf "%.0f" .Rate}}{{if not .Calibrated}} (default){{end}}</td>
<td data-metric='kvroute_cachesync_engine_requests{engine="{{.Addr}}",state="running"}' data-value="{{.Running}}">{{.Running}}</td>
<td data-metric='kvroute_cachesync_engine_requests{engine="{{.Addr}}",state="waiting"}' data-value="{{.Waiting}}">{{.Waiting}}</td>
<td data-metric='kvroute_cachesync_engine_kv_cache_usage_ratio{engine="{{.Addr}}"}' data-value="{{num .KVUsage}}">{{pct .KVUsage}}</td>
<td data-metric='kvroute_cachesync_engine_index_blocks{engine="{{.Addr}}"}' data-value="{{.IndexBlocks}}">{{.IndexBlocks}}</td>
<td data-metric='kvroute_cachesync_engine_prefixes{engine="{{.Addr}}"}' data-value="{{.Prefixes}}">{{.Prefixes}}</td>
<td data-metric='kvroute_cachesync_engine_decode_demand_tokens_per_second{engine="{{.Addr}}"}' data-value="{{num .DecodeDemand}}">{{printf "%.0f" .DecodeDemand}}</td>
</tr>{{end}}
</table>
<h2>Snapshot</h2>
<table id="snapshot">
<tr><th class="l">generation</th><td data-metric="kvroute_cachesync_snapshot_generation" data-value="{{.Stats.Generation}}">{{.Stats.Generation}}</td></tr>
<tr><th class="l">size (bytes)</th><td data-metric="kvroute_cachesync_snapshot_bytes" data-value="{{.Stats.Size}}">{{.Stats.Size}}</td></tr>
<tr><th class="l">index entries</th><td data-metric="kvroute_cachesync_index_entries" data-value="{{.Stats.Entries}}">{{.Stats.Entries}}</td></tr>
<tr><th class="l">built</th><td>{{if .Stats.Built.IsZero}}not yet{{else}}{{secs .Age}} s ago, in {{ms .Stats.BuildTime}} ms{{end}}</td></tr>
</table>
<h2>Routing decisions the gateways reported</h2>
<table id="decisions">
<tr><th class="l">reason</th><th>requests</th><th>share (%)</th></tr>
{{range .Decisions}}<tr><td class="l">{{.Reason}}</td><td data-metric='kvroute_cachesync_decisions_total{reason="{{.Reason}}"}' data-value="{{.Count}}">{{.Count}}</td><td>{{pct .Share}}</td></tr>
{{end}}</table>
</body></html>
`))

type decisionRow struct {
	Reason string
	Count  uint64
	Share  float64
}

// status serves the operator's page: the engines, the snapshot and the
// decisions, server-rendered, reloading itself.
func (s *Server) status(w http.ResponseWriter, _ *http.Request) {
	var engines []EngineStatus
	if s.engines != nil {
		engines = s.engines()
	}
	slices.SortFunc(engines, func(a, b EngineStatus) int { return strings.Compare(a.Addr, b.Addr) })
	st := s.ix.Stats()
	var rows []decisionRow
	var total uint64
	for reason, n := range s.ix.Decisions() {
		rows = append(rows, decisionRow{Reason: reason, Count: n})
		total += n
	}
	for i := range rows {
		if total > 0 {
			rows[i].Share = float64(rows[i].Count) / float64(total)
		}
	}
	// Most frequent first; ties by name.
	slices.SortFunc(rows, func(a, b decisionRow) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), strings.Compare(a.Reason, b.Reason))
	})
	now := time.Now()
	var buf bytes.Buffer
	err := statusPage.Execute(&buf, map[string]any{
		"Engines": engines, "Stats": st, "Age": now.Sub(st.Built), "Decisions": rows, "Now": now.UTC(),
		"Refresh": int(StatusRefresh / time.Second),
	})
	if err != nil {
		s.log.Error("status page", "err", err)
		text(w, http.StatusInternalServerError, "status page failed")
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(buf.Bytes())
}
