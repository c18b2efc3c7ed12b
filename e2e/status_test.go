package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/net/html"

	"github.com/kvroute/kvroute/e2e/vllmsim"
)

// chromium is the headless browser the status page is tested in: Debian's
// chromium, which make setup installs (KVROUTE_CHROMIUM overrides).
func chromium(t *testing.T) string {
	t.Helper()
	path := os.Getenv("KVROUTE_CHROMIUM")
	if path == "" {
		path = "chromium"
	}
	p, err := exec.LookPath(path)
	if err != nil {
		t.Fatalf("no %s: run make setup, which installs Debian's chromium (%v)", path, err)
	}
	return p
}

// browse runs headless Chromium on url with args and returns its output.
func browse(t *testing.T, url string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--user-data-dir=" + t.TempDir()}, append(args, url)...)
	cmd := exec.CommandContext(ctx, chromium(t), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
	}
	return out
}

// metrics scrapes a Prometheus endpoint into its families.
func metrics(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return parseMetrics(t, b)
}

func parseMetrics(t *testing.T, b []byte) map[string]*dto.MetricFamily {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

var selectorLabel = regexp.MustCompile(`(\w+)="([^"]*)"`)

// sample finds the one sample of the selector name{label="v",...} whose
// labels include the selector's, and returns its value (a histogram's:
// its count).
func sample(fams map[string]*dto.MetricFamily, selector string) (float64, bool) {
	name, labels, _ := strings.Cut(selector, "{")
	fam := fams[name]
	if fam == nil {
		return 0, false
	}
	want := selectorLabel.FindAllStringSubmatch(labels, -1)
	found, value := 0, 0.0
	for _, m := range fam.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		ok := true
		for _, w := range want {
			ok = ok && have[w[1]] == w[2]
		}
		if !ok {
			continue
		}
		found++
		switch {
		case m.Gauge != nil:
			value = m.Gauge.GetValue()
		case m.Counter != nil:
			value = m.Counter.GetValue()
		case m.Histogram != nil:
			value = float64(m.Histogram.GetSampleCount())
		}
	}
	return value, found == 1
}

// cells returns the status page's numbers: each data-metric cell's
// selector and value, as the browser built the document.
func cells(t *testing.T, dom []byte) map[string]string {
	t.Helper()
	doc, err := html.Parse(bytes.NewReader(dom))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var walk func(n *html.Node)
	walk = func(n *html.Node) {
		var metric, value string
		for _, a := range n.Attr {
			switch a.Key {
			case "data-metric":
				metric = a.Val
			case "data-value":
				value = a.Val
			}
		}
		if metric != "" {
			out[metric] = value
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	return out
}

// TestStatusPageInChromium: cachesync's status page, rendered by a real
// headless browser while a gateway routes through it, shows the engines,
// the snapshot and the decisions with the numbers /metrics has.
func TestStatusPageInChromium(t *testing.T) {
	es := startEngines(t, 2, vllmsim.Config{NumGPUBlocks: 512, TimeScale: 0.05})
	cs := startCachesync(t, "127.0.0.1:0", es, true)
	g := cachesyncGateway(t, es, cs.addr, nil)
	const requests = 12
	for i := range requests {
		system := "Team " + strconv.Itoa(i%3) + " handbook. " + strings.Repeat("Be kind and precise. ", 30)
		if code, _ := post(t, g.client, g.url, simChat(system, "question "+strconv.Itoa(i), 2)); code != http.StatusOK {
			t.Fatalf("request %d: %d", i, code)
		}
		time.Sleep(50 * time.Millisecond)
	}
	base := "http://" + cs.addr
	waitFor(t, 15*time.Second, "every decision reported and the engines idle", func() bool {
		fams := metrics(t, base+"/metrics")
		total := 0.0
		if f := fams["kvroute_cachesync_decisions_total"]; f != nil {
			for _, m := range f.Metric {
				total += m.Counter.GetValue()
			}
		}
		running := 0.0
		for _, e := range es {
			v, _ := sample(fams, `kvroute_cachesync_engine_requests{engine="`+e.Addr()+`",state="running"}`)
			running += v
		}
		return total == requests && running == 0
	})
	time.Sleep(2 * time.Second) // a snapshot build and a scrape after the last change

	before := metrics(t, base+"/metrics")
	dom := browse(t, base+"/status", "--dump-dom")
	after := metrics(t, base+"/metrics")
	got := cells(t, dom)
	for _, e := range es {
		for _, sel := range []string{
			`kvroute_cachesync_engine_requests{engine="` + e.Addr() + `",state="running"}`,
			`kvroute_cachesync_engine_index_blocks{engine="` + e.Addr() + `"}`,
			`kvroute_cachesync_engine_prefixes{engine="` + e.Addr() + `"}`,
			`kvroute_cachesync_engine_prefill_rate_tokens_per_second{engine="` + e.Addr() + `"}`,
		} {
			if _, ok := got[sel]; !ok {
				t.Errorf("the page has no cell for %s", sel)
			}
		}
	}
	if _, ok := got[`kvroute_cachesync_decisions_total{reason="affinity"}`]; !ok {
		t.Error("the page shows no affinity decisions")
	}
	for sel, text := range got {
		v, err := strconv.ParseFloat(text, 64)
		if err != nil {
			t.Errorf("%s: page value %q", sel, text)
			continue
		}
		b, okB := sample(before, sel)
		a, okA := sample(after, sel)
		// A gauge that moves with time (an engine's decode demand decays)
		// reads, on a page rendered between the two reads, between them.
		between := okA && okB && min(a, b) <= v && v <= max(a, b)
		if !okB && !okA {
			t.Errorf("%s: on the page (%v), not in /metrics", sel, v)
		} else if !(okB && v == b) && !(okA && v == a) && !between {
			t.Errorf("%s: page %v, /metrics %v then %v", sel, v, b, a)
		}
	}
	if blocks, _ := sample(after, `kvroute_cachesync_index_entries`); blocks == 0 {
		t.Error("an empty index after the requests")
	}
	if !bytes.Contains(dom, []byte("precise")) || bytes.Count(dom, []byte("data-engine=")) != len(es) {
		t.Errorf("the page does not list the %d precise engines", len(es))
	}

	shot := filepath.Join(t.TempDir(), "status.png")
	browse(t, base+"/status", "--screenshot="+shot, "--window-size=1400,900", "--hide-scrollbars")
	png, err := os.ReadFile(shot)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) || len(png) < 10_000 {
		t.Fatalf("screenshot: %d bytes, %v", len(png), err)
	}
	if dst := os.Getenv("KVROUTE_STATUS_SCREENSHOT"); dst != "" {
		os.WriteFile(dst, png, 0o644)
	}

	// The Grafana dashboard asks only for series these processes export.
	envoyStats, err := g.envoy.PrometheusStats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	dashboardSeries(t, parseMetrics(t, envoyStats), after)
}

// seriesName finds the metric names in a PromQL expression.
var seriesName = regexp.MustCompile(`\b(?:envoy_wasm_)?kvroute_[a-z_]+\b`)

// dashboardSeries checks that every series grafana/kvroute.json queries is
// one Envoy or cachesync exports (a histogram by its _bucket series).
func dashboardSeries(t *testing.T, envoy, cachesync map[string]*dto.MetricFamily) {
	t.Helper()
	b, err := os.ReadFile("../grafana/kvroute.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	queried := 0
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			for _, name := range seriesName.FindAllString(target.Expr, -1) {
				queried++
				base := strings.TrimSuffix(name, "_bucket")
				fam := envoy[base]
				if fam == nil {
					fam = cachesync[base]
				}
				if fam == nil || (base != name && fam.GetType() != dto.MetricType_HISTOGRAM) {
					t.Errorf("panel %q queries %s, which neither Envoy nor cachesync exports", p.Title, name)
				}
			}
		}
	}
	if queried < 30 {
		t.Errorf("the dashboard queries %d series", queried)
	}
}
