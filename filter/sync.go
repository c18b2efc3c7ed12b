package main

import (
	"encoding/binary"
	"errors"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/filter/proxywasm"
	"github.com/kvroute/kvroute/filter/proxywasm/types"
	"github.com/kvroute/kvroute/shared/approx"
	"github.com/kvroute/kvroute/shared/report"
	"github.com/kvroute/kvroute/shared/snapshot"
	"github.com/kvroute/kvroute/shared/syncapi"
)

// Shared-data and queue names, scoped by Envoy to the plugin's vm_id.
const (
	snapshotPrefix = "kvroute/snapshot/"
	fetcherKey     = "kvroute/fetcher"
	reportQueue    = "kvroute/reports"
)

// One tick's report batch stays under both bounds; what does not fit waits
// in the queue for the next tick. cachesync refuses batches over 16 MiB.
const (
	maxReportsPerTick = 4096
	maxReportBytes    = 4 << 20
)

// syncer is one VM's side of the live loop. Every VM refreshes its view of
// the snapshot in shared data on its tick. One VM per Envoy, the holder of
// the fetcher lock, also fills shared data: from cachesync with an HTTP
// callout, or from its own approximate index fed by every VM's routing
// reports (local mode).
type syncer struct {
	cfg   *config
	keys  *snapshot.Keys
	view  *snapshot.View
	vm    uint64
	queue uint32
	m     *stats

	holder   bool
	fetching bool
	full     bool   // the next fetch asks for a whole snapshot
	epoch    string // of the cachesync that built the snapshot held
	fetchBuf []byte
	reports  report.Writer
	headBuf  []byte
	lockBuf  [16]byte

	local *localIndex
	// failing is set from a failed fetch until the next good one, so an
	// unreachable cachesync logs once, not every tick; refusing likewise
	// for report batches.
	failing  bool
	refusing bool
}

// fetchFailed counts a failed fetch and logs the first of a run.
func (s *syncer) fetchFailed(msg string) {
	s.m.syncErrors.Increment(1)
	if !s.failing {
		s.failing = true
		proxywasm.LogWarn("kvroute: " + msg + "; routing on the last snapshot held, or by rendezvous")
	}
}

func (s *syncer) fetchSucceeded() {
	if s.failing {
		s.failing = false
		proxywasm.LogInfo("kvroute: snapshots from cachesync are flowing again")
	}
}

func newSyncer(cfg *config, vm uint64, m *stats) (*syncer, error) {
	s := &syncer{cfg: cfg, keys: snapshot.NewKeys(snapshotPrefix), vm: vm, m: m}
	s.view = snapshot.NewView(s.keys)
	q, err := proxywasm.RegisterSharedQueue(reportQueue)
	if err != nil {
		return nil, errors.New("register the report queue: " + err.Error())
	}
	s.queue = q
	return s, nil
}

// tick runs every sync interval on every VM.
func (s *syncer) tick(now time.Time) {
	s.refresh(now)
	if !s.lock(now) {
		return
	}
	if s.cfg.cachesync == nil {
		s.localTick(now)
		return
	}
	s.forwardReports()
	if !s.fetching {
		s.fetch()
	}
}

// refresh brings the view up to shared data: a 24-byte read when nothing
// changed, otherwise the manifest and the parts that differ.
func (s *syncer) refresh(now time.Time) {
	st, err := s.view.Refresh(getShared)
	switch {
	case err == nil:
	case errors.Is(err, types.ErrorStatusNotFound), errors.Is(err, snapshot.ErrInconsistent):
		// Nothing stored yet, or the fetcher is storing: the next tick.
	default:
		s.m.syncErrors.Increment(1)
		proxywasm.LogWarn("kvroute: refresh snapshot: " + err.Error())
	}
	if st.Changed {
		s.m.refreshBytes.Increment(uint64(st.Bytes))
	}
	if m := s.view.Manifest(); m != nil {
		s.m.generation.Set(int64(m.Generation()))
		s.m.ageMillis.Set(now.Sub(m.Created()).Milliseconds())
	}
}

func getShared(key string) ([]byte, error) {
	b, _, err := proxywasm.GetSharedData(key)
	return b, err
}

// lock takes or renews the fetcher lock: one VM id and an expiry, written
// with compare-and-swap. A holder that stops renewing (its VM failed)
// loses the lock when it expires.
func (s *syncer) lock(now time.Time) bool {
	val, cas, err := proxywasm.GetSharedData(fetcherKey)
	if err != nil && !errors.Is(err, types.ErrorStatusNotFound) {
		return false
	}
	nowMs := now.UnixMilli()
	if len(val) == 16 {
		owner, expiry := binary.LittleEndian.Uint64(val), int64(binary.LittleEndian.Uint64(val[8:]))
		if owner != s.vm && expiry > nowMs {
			s.holder = false
			return false
		}
	}
	ttl := max(time.Second, 5*s.cfg.syncInterval)
	binary.LittleEndian.PutUint64(s.lockBuf[:], s.vm)
	binary.LittleEndian.PutUint64(s.lockBuf[8:], uint64(nowMs+ttl.Milliseconds()))
	if cas == 0 {
		// cas 0 would write unconditionally; a VM that lost a race to
		// create the key must not overwrite the winner.
		cas = 1
	}
	if err := proxywasm.SetSharedData(fetcherKey, s.lockBuf[:], cas); err != nil {
		s.holder = false
		return false
	}
	if !s.holder {
		proxywasm.LogInfo("kvroute: this VM now keeps the snapshot in shared data")
	}
	s.holder = true
	return true
}

// fetch asks cachesync for what changed since the generation held.
func (s *syncer) fetch() {
	c := s.cfg.cachesync
	since := uint64(0)
	if m := s.view.Manifest(); m != nil && !s.full {
		since = m.Generation()
	}
	headers := [][2]string{{":method", "GET"}, {":path", syncapi.SnapshotQuery(c.snapshotPath, since, s.epoch, s.cfg.templateName())}, {":authority", c.authority}}
	// The snapshot's hashes tell whoever reads it which prompts were sent
	// lately, so cachesync asks for the token here too.
	if c.reportToken != "" {
		headers = append(headers, [2]string{"authorization", syncapi.Bearer(c.reportToken)})
	}
	if since > 0 {
		headers = append(headers, [2]string{"if-none-match", syncapi.ETag(since)})
	}
	_, err := proxywasm.DispatchHttpCall(c.cluster, headers, nil, nil, uint32(c.timeout.Milliseconds()), s.onSnapshot)
	if err != nil {
		s.fetchFailed("fetch snapshot from cluster " + c.cluster + ": " + err.Error())
		return
	}
	s.fetching = true
}

func (s *syncer) onSnapshot(numHeaders, bodySize, _ int) {
	s.fetching = false
	if numHeaders == 0 {
		s.fetchFailed("fetch snapshot: no response from cachesync")
		return
	}
	status, epoch := callStatus()
	switch status {
	case syncapi.StatusNotModified:
		s.fetchSucceeded()
		return
	case syncapi.StatusSnapshot:
	case syncapi.StatusUnauthorized:
		s.fetchFailed("fetch snapshot: cachesync refused the token (401): set the cachesync block's report_token to one cachesync accepts")
		return
	default:
		s.fetchFailed("fetch snapshot: cachesync answered " + strconv.Itoa(status))
		return
	}
	if cap(s.fetchBuf) < bodySize {
		s.fetchBuf = make([]byte, bodySize)
	}
	body, err := proxywasm.ReadHttpCallResponseBody(s.fetchBuf[:bodySize], 0)
	if err != nil {
		s.fetchFailed("read snapshot: " + err.Error())
		return
	}
	if err := s.store(body); err != nil {
		s.fetchFailed("snapshot from cachesync rejected: " + err.Error())
		return
	}
	// The next since is in this answer's history: a replica of another
	// epoch answers it with a whole snapshot.
	s.epoch = epoch
	s.fetchSucceeded()
	s.m.fetched.Increment(uint64(len(body)))
	s.refresh(time.Now())
}

// callStatus returns the status of the callout response at hand, 0 when
// there is none or it is not a status, and the cachesync epoch it names
// ("" for none or a malformed one).
func callStatus() (status int, epoch string) {
	hs, err := proxywasm.GetHttpCallResponseHeaders()
	if err != nil {
		return 0, ""
	}
	for _, h := range hs {
		switch h[0] {
		case ":status":
			status, _ = syncapi.ParseStatus(h[1])
		case syncapi.EpochHeader:
			if syncapi.ValidEpoch(h[1]) {
				epoch = h[1]
			}
		}
	}
	return status, epoch
}

// store verifies a bundle and writes its parts to shared data, the head
// last: a reader that sees the new head finds every part it names.
func (s *syncer) store(body []byte) error {
	b, err := snapshot.ParseBundle(body)
	if err != nil {
		return err
	}
	if err := b.Complete(s.view.Manifest()); err != nil {
		s.full = true
		return err
	}
	s.full = false
	for _, p := range b.Parts() {
		if err := proxywasm.SetSharedData(s.keys.Part(p), p.Data, 0); err != nil {
			return errors.New("store " + s.keys.Part(p) + ": " + err.Error())
		}
	}
	s.headBuf = b.Manifest().AppendHead(s.headBuf[:0])
	return proxywasm.SetSharedData(s.keys.Head(), s.headBuf, 0)
}

// forwardReports sends the routing decisions every VM queued since the last
// tick to cachesync in one batch.
func (s *syncer) forwardReports() {
	s.reports.Reset()
	s.drainReports()
	c := s.cfg.cachesync
	if s.reports.Len() == 0 || c.reportToken == "" {
		return
	}
	headers := [][2]string{
		{":method", "POST"}, {":path", c.reportPath}, {":authority", c.authority},
		{"content-type", syncapi.ContentType},
		{"authorization", syncapi.Bearer(c.reportToken)},
	}
	n := s.reports.Len()
	_, err := proxywasm.DispatchHttpCall(c.cluster, headers, s.reports.Bytes(), nil, uint32(c.timeout.Milliseconds()),
		func(numHeaders, _, _ int) {
			if numHeaders == 0 {
				s.reportsFailed("no response from cachesync")
				return
			}
			if status, _ := callStatus(); !syncapi.ReportAccepted(status) {
				s.reportsFailed("cachesync refused them with status " + strconv.Itoa(status))
				return
			}
			if s.refusing {
				s.refusing = false
				proxywasm.LogInfo("kvroute: cachesync takes routing reports again")
			}
		})
	if err != nil {
		s.reportsFailed("dispatch to cluster " + c.cluster + ": " + err.Error())
		return
	}
	s.m.reported.Increment(uint64(n))
}

// reportsFailed counts a report batch that did not reach cachesync and
// logs the first of a run.
func (s *syncer) reportsFailed(why string) {
	s.m.reportErrors.Increment(1)
	if !s.refusing {
		s.refusing = true
		proxywasm.LogWarn("kvroute: routing reports lost: " + why + "; approximate engines learn nothing until they flow again")
	}
}

// drainReports moves queued report records into s.reports.
func (s *syncer) drainReports() {
	for range maxReportsPerTick {
		if s.reports.Size() >= maxReportBytes {
			return
		}
		rec, err := proxywasm.DequeueSharedQueue(s.queue)
		if err != nil {
			return
		}
		if _, err := s.reports.AddEncoded(rec); err != nil {
			s.m.reportErrors.Increment(1)
		}
	}
}

// reporting says whether decisions go anywhere: to the local index, or to
// a cachesync that accepts them (it needs the token).
func (s *syncer) reporting() bool {
	return s.cfg.cachesync == nil || s.cfg.cachesync.reportToken != ""
}

// enqueueReport queues one routing decision for the fetcher VM's tick.
func (s *syncer) enqueueReport(rec []byte) {
	if err := proxywasm.EnqueueSharedQueue(s.queue, rec); err != nil {
		s.m.reportErrors.Increment(1)
	}
}

// localIndex is local mode: the fetcher VM keeps an approximate index of
// what every VM routed where, and publishes it as a snapshot, so a single
// Envoy routes by prefix with no cachesync.
type localIndex struct {
	builder *snapshot.Builder
	index   *approx.Index
	slots   map[string]int
	hashes  []uint64
	changed bool
}

func newLocalIndex(cfg *config, now time.Time) (*localIndex, error) {
	b, err := snapshot.NewBuilder(snapshot.BuilderConfig{FirstGeneration: uint64(now.UnixNano())})
	if err != nil {
		return nil, err
	}
	li := &localIndex{builder: b, index: approx.New(), slots: map[string]int{}, changed: true}
	for _, ep := range cfg.endpoints {
		slot, err := b.SetEndpoint(snapshot.EndpointInfo{Addr: ep, Health: snapshot.HealthHealthy})
		if err != nil {
			return nil, err
		}
		if _, err := li.index.SetCapacity(slot, cfg.localBlocks, b); err != nil {
			return nil, err
		}
		li.slots[ep] = slot
	}
	return li, nil
}

func (s *syncer) localTick(now time.Time) {
	if s.local == nil {
		li, err := newLocalIndex(s.cfg, now)
		if err != nil {
			s.m.syncErrors.Increment(1)
			proxywasm.LogError("kvroute: local index: " + err.Error())
			return
		}
		s.local = li
	}
	li := s.local
	s.reports.Reset()
	s.drainReports()
	if s.reports.Len() > 0 {
		batch, err := report.Parse(s.reports.Bytes(), report.Limits{})
		if err != nil {
			s.m.reportErrors.Increment(1)
			return
		}
		for e := range batch.Records() {
			if e.IsOutcome() {
				continue
			}
			slot, ok := li.slots[string(e.Endpoint())]
			if !ok {
				continue
			}
			li.hashes = e.AppendHashes(li.hashes[:0])
			if ch, err := li.index.Touch(slot, li.hashes, li.builder); err == nil && ch.Added+ch.Evicted > 0 {
				li.changed = true
			}
		}
	}
	if !li.changed {
		return
	}
	li.changed = false
	since := uint64(0)
	if m := s.view.Manifest(); m != nil {
		since = m.Generation()
	}
	img := li.builder.Build(now)
	s.fetchBuf = img.AppendBundle(s.fetchBuf[:0], since)
	if err := s.store(s.fetchBuf); err != nil {
		s.m.syncErrors.Increment(1)
		proxywasm.LogWarn("kvroute: publish local snapshot: " + err.Error())
		return
	}
	s.refresh(now)
}
