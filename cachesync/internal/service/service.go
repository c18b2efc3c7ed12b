// Package service is cachesync's HTTP API; the snapshot and report
// endpoints follow the contract in shared/syncapi:
//
//	GET  /v1/snapshot?since=<generation>  the latest snapshot as a transport bundle (bearer token)
//	POST /v1/reports                      routing reports from gateways (bearer token)
//	GET  /metrics                         Prometheus metrics
//	GET  /healthz                         the process is alive
//	GET  /readyz                          discovery has run and a snapshot exists (and notes)
//	GET  /status                          an operator's page: engines, snapshot, decisions
//
// A snapshot response carries the parts written after the generation the
// fetcher holds (all of them for since=0, an unknown or a future
// generation), with the generation as its ETag; If-None-Match naming the
// current generation is answered 304 without a body. Encoded bundles are
// kept for the current generation, so that many gateways polling every
// interval cost one encoding per distinct since.
//
// Reports feed the approximate index that every gateway routes on, so
// they require a shared token: without one configured the endpoint is
// disabled, and a stranger cannot poison the index. The snapshot requires
// the same token when one is configured: its block hashes let whoever
// reads it test whether a guessed prompt prefix was sent lately, a
// membership oracle across tenants. Several tokens may be accepted at once
// (SetTokens), so that gateways move to a new one without a restart.
package service

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute/cachesync/internal/index"
	"github.com/kvroute/kvroute/shared/report"
	"github.com/kvroute/kvroute/shared/snapshot"
	"github.com/kvroute/kvroute/shared/syncapi"
)

// Defaults for Config.
const (
	// DefaultMaxReportBytes fits a full batch of DefaultMaxRecords records
	// of 125 blocks (8 KB prompts); longer prompts fill it with fewer.
	DefaultMaxReportBytes = syncapi.MaxReportBytes
	DefaultShutdownGrace  = 10 * time.Second
)

// maxCachedBundles bounds the bundles kept for one generation: fetchers
// mostly hold the previous generation or nothing, so a few distinct since
// values cover them.
const maxCachedBundles = 8

// Config configures a Server.
type Config struct {
	// Index is the snapshot source and the report sink; required.
	Index *index.Index
	// Tokens are the bearer tokens gateways may present with reports and
	// snapshot requests. None disables the report endpoint (403) and
	// leaves the snapshot open to whoever reaches the port.
	Tokens []string
	// MaxReportBytes bounds a report body (413 beyond); 0 means
	// DefaultMaxReportBytes.
	MaxReportBytes int64
	// ReportLimits bound the records of a batch and the hashes of a
	// record (413 beyond). Keep MaxHashes at least the filters' block cap.
	ReportLimits report.Limits
	// Registry is served at /metrics and receives the server's metrics;
	// the daemon's other components register theirs in it. Nil means a
	// new registry with the Go runtime and process collectors.
	Registry *prometheus.Registry
	// Discovered is closed once engine discovery has run for the first
	// time; /readyz waits for it. Nil means no wait.
	Discovered <-chan struct{}
	// Notes, when set, returns lines /readyz adds to its answer: what a
	// ready daemon is doing less well than it could (an engine routed
	// approximately, and why).
	Notes func() []string
	// Engines, when set, returns the engines' rows for GET /status.
	Engines func() []EngineStatus
	// Peers are the other replicas' API addresses (host:port): every
	// report batch a gateway sends is forwarded to each, so that every
	// replica's approximate index learns every gateway's decisions.
	Peers []string
	// CustomTemplates are the names (prompt.Jinja.Name) of the chat
	// templates cachesync holds as source: gateways naming one are checked
	// against it as prompt.Custom (GatewayCustom says which).
	CustomTemplates []string
	// ShutdownGrace bounds how long Serve waits for requests in flight
	// when its context ends; 0 means DefaultShutdownGrace.
	ShutdownGrace time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Server serves the API. Its Handler is safe for concurrent use.
type Server struct {
	ix         *index.Index
	tokens     atomic.Pointer[[][sha256.Size]byte] // digests; none: reports disabled, snapshot open
	maxBody    int64
	limits     report.Limits
	reg        *prometheus.Registry
	discovered <-chan struct{}
	grace      time.Duration
	log        *slog.Logger
	m          metrics
	cache      bundleCache
	mux        *http.ServeMux
	templates  gatewayTemplates
	notes      func() []string
	engines    func() []EngineStatus
	// epoch names this process's snapshot history (syncapi.EpochParam).
	epoch     string
	peers     []*peer
	peerToken atomic.Pointer[string] // presented to peers: the first token
	pm        peerMetrics
}

type metrics struct {
	requests    *prometheus.CounterVec
	sent        prometheus.Counter
	batches     prometheus.Counter
	reportBytes prometheus.Counter
	rejects     *prometheus.CounterVec
}

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Index == nil {
		return nil, errors.New("service: no index")
	}
	s := &Server{
		ix:         cfg.Index,
		maxBody:    cfg.MaxReportBytes,
		limits:     cfg.ReportLimits,
		reg:        cfg.Registry,
		discovered: cfg.Discovered,
		grace:      cfg.ShutdownGrace,
		log:        cfg.Logger,
		notes:      cfg.Notes,
		engines:    cfg.Engines,
		epoch:      newEpoch(),
		pm:         newPeerMetrics(),
		templates:  gatewayTemplates{customs: slices.Clone(cfg.CustomTemplates)},
	}
	for _, a := range cfg.Peers {
		s.peers = append(s.peers, &peer{addr: a, batches: make(chan []byte, peerQueue)})
	}
	s.SetTokens(cfg.Tokens...)
	if s.maxBody == 0 {
		s.maxBody = DefaultMaxReportBytes
	}
	if s.maxBody < 0 {
		return nil, errors.New("service: negative report size limit")
	}
	if s.grace <= 0 {
		s.grace = DefaultShutdownGrace
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.reg == nil {
		s.reg = prometheus.NewRegistry()
		s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	s.m = metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "snapshot_requests_total",
			Help: "Snapshot requests by result: full, delta, not_modified, unavailable, bad_request, unauthorized.",
		}, []string{"result"}),
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "snapshot_sent_bytes_total", Help: "Bytes of snapshot bundles sent.",
		}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "report_batches_total", Help: "Report batches accepted.",
		}),
		reportBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "report_bytes_total", Help: "Bytes of report batches accepted.",
		}),
		rejects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "report_rejects_total",
			Help: "Report requests refused by reason: disabled, unauthorized, method, too_large, over_limit, corrupt.",
		}, []string{"reason"}),
	}
	for _, c := range []prometheus.Collector{s.m.requests, s.m.sent, s.m.batches, s.m.reportBytes, s.m.rejects, s.pm.forwarded} {
		if err := s.reg.Register(c); err != nil {
			return nil, err
		}
	}
	s.mux = http.NewServeMux()
	s.mux.HandleFunc(syncapi.SnapshotPath, s.snapshot)
	s.mux.HandleFunc(syncapi.ReportPath, s.reports)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { text(w, http.StatusOK, "ok") })
	s.mux.HandleFunc("GET /readyz", s.readyz)
	s.mux.HandleFunc("GET /status", s.status)
	return s, nil
}

// Registry returns the registry /metrics serves.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Handler returns the API's handler.
func (s *Server) Handler() http.Handler { return s.mux }

// Serve serves the API on ln until ctx ends, then shuts down gracefully:
// it stops accepting, lets requests in flight finish for up to the
// configured grace, and returns nil. Any other failure is returned.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second, // a full bundle to a slow fetcher
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.runPeers(ctx)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.grace)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}

func text(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, msg+"\n")
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	if s.discovered != nil {
		select {
		case <-s.discovered:
		default:
			text(w, http.StatusServiceUnavailable, "discovery has not run yet")
			return
		}
	}
	if s.ix.Image() == nil {
		text(w, http.StatusServiceUnavailable, "no snapshot built yet")
		return
	}
	msg := "ready"
	if s.notes != nil {
		for _, n := range s.notes() {
			msg += "\n" + n
		}
	}
	text(w, http.StatusOK, msg)
}

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		text(w, http.StatusMethodNotAllowed, "use GET")
		return
	}
	if len(*s.tokens.Load()) > 0 && !s.authorized(r.Header.Get("Authorization")) {
		s.m.requests.WithLabelValues("unauthorized").Inc()
		w.Header().Set("WWW-Authenticate", `Bearer realm="kvroute"`)
		text(w, http.StatusUnauthorized, "missing or wrong bearer token")
		return
	}
	query := r.URL.Query()
	if name := query.Get(syncapi.TemplateParam); name != "" {
		s.templates.saw(name, time.Now())
	}
	var since uint64
	// A since from another epoch (a replica, or this process's
	// predecessor) names a generation of another history: whatever it
	// is, the fetcher needs everything.
	sameHistory := true
	if e := query.Get(syncapi.EpochParam); e != "" && e != s.epoch {
		sameHistory = false
	}
	if q := query.Get(syncapi.SinceParam); q != "" {
		var err error
		if since, err = strconv.ParseUint(q, 10, 64); err != nil {
			s.m.requests.WithLabelValues("bad_request").Inc()
			text(w, http.StatusBadRequest, "since must be a generation number")
			return
		}
	}
	im := s.ix.Image()
	if im == nil {
		s.m.requests.WithLabelValues("unavailable").Inc()
		w.Header().Set("Retry-After", "1")
		text(w, http.StatusServiceUnavailable, "no snapshot built yet")
		return
	}
	etag := syncapi.ETag(im.Generation())
	h := w.Header()
	h.Set("ETag", etag)
	h.Set(syncapi.EpochHeader, s.epoch)
	h.Set("Cache-Control", "no-cache")
	if !sameHistory {
		since = 0
	}
	if sameHistory && noneMatch(r.Header.Get("If-None-Match"), etag) {
		s.m.requests.WithLabelValues("not_modified").Inc()
		w.WriteHeader(http.StatusNotModified)
		return
	}
	if since > im.Generation() {
		since = 0 // a generation from the future: a restarted cachesync
	}
	body := s.cache.get(im, since)
	result := "delta"
	if since == 0 {
		result = "full"
	}
	s.m.requests.WithLabelValues(result).Inc()
	s.m.sent.Add(float64(len(body)))
	h.Set("Content-Type", syncapi.ContentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = w.Write(body)
}

// noneMatch reports whether an If-None-Match header matches etag, by the
// weak comparison RFC 9110 prescribes for it.
func noneMatch(header, etag string) bool {
	for tag := range strings.SplitSeq(header, ",") {
		tag = strings.TrimSpace(tag)
		if tag == "*" || strings.TrimPrefix(tag, "W/") == etag {
			return true
		}
	}
	return false
}

// bundleCache keeps the bundles encoded for the current generation, one
// per since, each encoded once however many requests ask at the same time.
type bundleCache struct {
	mu      sync.Mutex
	gen     uint64
	bundles map[uint64]*bundle
}

type bundle struct {
	once sync.Once
	body []byte
}

func (c *bundleCache) get(im *snapshot.Image, since uint64) []byte {
	c.mu.Lock()
	switch gen := im.Generation(); {
	case gen > c.gen:
		c.gen, c.bundles = gen, make(map[uint64]*bundle)
	case gen < c.gen: // the image was replaced meanwhile
		c.mu.Unlock()
		return encode(im, since)
	}
	b := c.bundles[since]
	if b == nil {
		if len(c.bundles) >= maxCachedBundles {
			c.mu.Unlock()
			return encode(im, since)
		}
		b = new(bundle)
		c.bundles[since] = b
	}
	c.mu.Unlock()
	b.once.Do(func() { b.body = encode(im, since) })
	return b.body
}

func encode(im *snapshot.Image, since uint64) []byte {
	var dst []byte
	if since == 0 {
		dst = make([]byte, 0, im.Size()+64*1024)
	}
	return im.AppendBundle(dst, since)
}

func (s *Server) reject(w http.ResponseWriter, r *http.Request, code int, reason, msg string) {
	s.m.rejects.WithLabelValues(reason).Inc()
	s.log.Debug("report refused", "reason", reason, "remote", r.RemoteAddr, "detail", msg)
	text(w, code, msg)
}

func (s *Server) reports(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		s.reject(w, r, http.StatusMethodNotAllowed, "method", "use POST")
		return
	}
	if len(*s.tokens.Load()) == 0 {
		s.reject(w, r, http.StatusForbidden, "disabled", "reports are disabled: cachesync has no report token")
		return
	}
	if !s.authorized(r.Header.Get("Authorization")) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="kvroute"`)
		s.reject(w, r, http.StatusUnauthorized, "unauthorized", "missing or wrong bearer token")
		return
	}
	if r.ContentLength > s.maxBody {
		s.reject(w, r, http.StatusRequestEntityTooLarge, "too_large", "report over "+strconv.FormatInt(s.maxBody, 10)+" bytes")
		return
	}
	body, err := readBody(w, r, s.maxBody)
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			s.reject(w, r, http.StatusRequestEntityTooLarge, "too_large", "report over "+strconv.FormatInt(s.maxBody, 10)+" bytes")
			return
		}
		s.reject(w, r, http.StatusBadRequest, "corrupt", "reading the report: "+err.Error())
		return
	}
	bt, err := report.Parse(body, s.limits)
	switch {
	case errors.Is(err, report.ErrLimit):
		s.reject(w, r, http.StatusRequestEntityTooLarge, "over_limit", err.Error())
		return
	case err != nil:
		s.reject(w, r, http.StatusBadRequest, "corrupt", err.Error())
		return
	}
	from := r.Header.Get(ForwardedHeader)
	if from == s.epoch {
		w.WriteHeader(http.StatusAccepted) // our own, come back: applied already
		return
	}
	s.ix.Report(bt)
	if from == "" {
		s.forward(body)
	}
	s.m.batches.Inc()
	s.m.reportBytes.Add(float64(len(body)))
	w.WriteHeader(http.StatusAccepted)
}

// SetTokens replaces the accepted bearer tokens; empty ones are ignored.
// Requests already past their check are not affected.
func (s *Server) SetTokens(tokens ...string) {
	sums := make([][sha256.Size]byte, 0, len(tokens))
	for _, t := range tokens {
		if t != "" {
			sums = append(sums, sha256.Sum256([]byte(t)))
		}
	}
	s.tokens.Store(&sums)
	for _, t := range tokens {
		if t != "" {
			s.peerToken.Store(&t)
			break
		}
	}
}

// authorized checks an Authorization header against every accepted token
// in constant time: both sides are hashed first, so not even the length
// leaks, and every token is compared, so neither does which one matched.
func (s *Server) authorized(header string) bool {
	cred, ok := syncapi.ParseBearer(header)
	if !ok {
		return false
	}
	sum := sha256.Sum256([]byte(cred))
	match := 0
	for _, t := range *s.tokens.Load() {
		match |= subtle.ConstantTimeCompare(sum[:], t[:])
	}
	return match == 1
}

// readBody reads at most limit bytes of the request body, in one
// allocation when the client declared its length.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	body := http.MaxBytesReader(w, r.Body, limit)
	if r.ContentLength < 0 {
		return io.ReadAll(body)
	}
	b := make([]byte, r.ContentLength)
	if _, err := io.ReadFull(body, b); err != nil {
		return nil, err
	}
	return b, nil
}
