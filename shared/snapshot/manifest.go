package snapshot

import (
	"math"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/shared/predict"
	"github.com/kvroute/kvroute/shared/prompt"
)

const (
	manifestFixed = 104 // header, fixed fields, the delta and templates references
	endpointSize  = 96
	nameSize      = 8
	// itlAt is where an endpoint row's ITL coefficients start, after the
	// TTFT ones at 64.
	itlAt = 64 + 4*predict.NumTTFT
)

// Manifest is a parsed manifest: the snapshot's header, its endpoint table
// and the generation and checksum of every other part. It reads the bytes
// it was parsed from in place.
type Manifest struct {
	ref       ref
	created   int64
	bpt       float32
	shardBits uint8
	n, m      int
	delta     ref
	templates ref    // zero when the snapshot ships no chat templates
	shards    []byte // refSize per shard
	eps       []byte // endpointSize per endpoint
	names     []byte // nameSize per distinct name
	ids       []byte // uint16 name ids, endpoints' lists back to back
	strs      []byte
	slots     []byte // slotRowSize per engine slot row
	pins      []byte // pinRowSize per pinned group
}

// ParseManifest checks b and returns the manifest it holds. The manifest
// keeps b; b must not change afterwards.
func ParseManifest(b []byte) (*Manifest, error) {
	m := new(Manifest)
	if err := m.parse(b); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *Manifest) parse(b []byte) error {
	gen, err := checkPart(b, KindManifest)
	if err != nil {
		return err
	}
	if len(b) < manifestFixed+trailerSize {
		return corrupt("manifest: truncated")
	}
	bits := b[32]
	n, nm, nid, ns := le.Uint32(b[36:]), le.Uint32(b[40:]), le.Uint32(b[44:]), le.Uint32(b[48:])
	nslots := uint64(b[33]) | uint64(b[34])<<8 | uint64(b[35])<<16
	bpt := math.Float32frombits(le.Uint32(b[52:]))
	if !(bpt >= 0 && bpt <= MaxBytesPerToken) {
		return corrupt("manifest: bytes per token out of range")
	}
	if bits < 1 || bits > MaxShardBits || n > MaxEndpoints {
		return corrupt("manifest: bad shard bits or endpoint count")
	}
	shards := uint64(1) << bits
	epsAt := manifestFixed + refSize*shards
	if epsAt+endpointSize*uint64(n)+trailerSize > uint64(len(b)) {
		return corrupt("manifest: size does not match its counts")
	}
	npins := uint64(0)
	for i := range uint64(n) {
		npins += uint64(b[epsAt+endpointSize*i+23])
	}
	size := epsAt + endpointSize*uint64(n) + nameSize*uint64(nm) + 2*uint64(nid) + uint64(ns) + uint64(slotRowSize)*nslots + pinRowSize*npins + trailerSize
	if size != uint64(len(b)) {
		return corrupt("manifest: size does not match its counts")
	}
	*m = Manifest{ref: partRef(b, int(n)), created: int64(le.Uint64(b[24:])), bpt: bpt, shardBits: bits, n: int(n), m: int(nm), delta: readRef(b[56:]), templates: readRef(b[80:])}
	m.ref.gen = gen
	p := b[manifestFixed : len(b)-trailerSize]
	m.shards, p = p[:refSize*shards], p[refSize*shards:]
	m.eps, p = p[:endpointSize*n], p[endpointSize*n:]
	m.names, p = p[:nameSize*nm], p[nameSize*nm:]
	m.ids, p = p[:2*nid], p[2*nid:]
	m.strs, p = p[:ns], p[ns:]
	m.slots, m.pins = p[:uint64(slotRowSize)*nslots], p[uint64(slotRowSize)*nslots:]
	return m.check()
}

func (m *Manifest) check() error {
	if m.delta.gen > m.ref.gen || m.templates.gen > m.ref.gen {
		return corrupt("manifest: delta or templates newer than the manifest")
	}
	if (m.templates.gen == 0) != (m.templates == ref{}) {
		return corrupt("manifest: templates reference without a generation")
	}
	for i := 0; i < m.NumShards(); i++ {
		if m.shardRef(i).gen > m.ref.gen {
			return corrupt("manifest: shard " + strconv.Itoa(i) + " newer than the manifest")
		}
	}
	for i := 0; i < m.m; i++ {
		r := m.names[nameSize*i:]
		off, n := uint64(le.Uint32(r)), uint64(le.Uint16(r[4:]))
		if n == 0 || off+n > uint64(len(m.strs)) || r[6] > 1 || r[7] != 0 {
			return corrupt("manifest: bad name " + strconv.Itoa(i))
		}
	}
	for i := 0; i < len(m.ids); i += 2 {
		if int(le.Uint16(m.ids[i:])) >= m.m {
			return corrupt("manifest: name id out of range")
		}
	}
	for i := 0; i < m.n; i++ {
		if !m.Endpoint(i).valid(m) {
			return corrupt("manifest: bad endpoint " + strconv.Itoa(i))
		}
	}
	if err := m.checkSlots(); err != nil {
		return err
	}
	return m.checkPins()
}

// Generation returns the snapshot's generation.
func (m *Manifest) Generation() uint64 { return m.ref.gen }

// Created returns when cachesync built the snapshot; a reader compares it
// with its clock to decide whether the load figures are too old to trust.
func (m *Manifest) Created() time.Time { return time.Unix(0, m.created) }

// BytesPerToken returns how many bytes of prompt text cachesync takes a
// token to stand for (it sizes approximate indexes by it, and the filter
// estimates token counts by it); 0 when the snapshot does not say.
func (m *Manifest) BytesPerToken() float64 { return float64(m.bpt) }

// NumShards returns the number of index shards.
func (m *Manifest) NumShards() int { return 1 << m.shardBits }

func (m *Manifest) shardRef(i int) ref { return readRef(m.shards[refSize*i:]) }

// NumEndpoints returns the size of the endpoint table, vacant slots included.
func (m *Manifest) NumEndpoints() int { return m.n }

// Endpoint returns the endpoint in slot i, 0 <= i < NumEndpoints().
func (m *Manifest) Endpoint(i int) Endpoint {
	return Endpoint{r: (*[endpointSize]byte)(m.eps[endpointSize*i:]), m: m}
}

// Model returns the id of a model or adapter name for Endpoint.Serves, or -1
// if no endpoint serves it. It does not allocate.
func (m *Manifest) Model(name string) int {
	for i := 0; i < m.m; i++ {
		r := m.names[nameSize*i:]
		off, n := le.Uint32(r), le.Uint16(r[4:])
		if string(m.strs[off:off+uint32(n)]) == name { // compared in place
			return i
		}
	}
	return -1
}

// name returns name i.
func (m *Manifest) name(i int) string {
	r := m.names[nameSize*i:]
	off, n := le.Uint32(r), le.Uint16(r[4:])
	return string(m.strs[off : off+uint32(n)])
}

// Endpoint is one row of the endpoint table, read in place. The row is an
// array pointer so that field reads need no bounds checks, which Go's Wasm
// code pays dearly for on the per-endpoint loop of every decision.
type Endpoint struct {
	r *[endpointSize]byte
	m *Manifest
}

func (e Endpoint) valid(m *Manifest) bool {
	r := e.r
	addrOff, addrLen := uint64(le.Uint32(r[8:])), uint64(le.Uint16(r[12:]))
	names, idOff := uint64(le.Uint16(r[14:])), uint64(le.Uint32(r[16:]))
	if r[22] > 1 || !prompt.Template(r[21]).Known() {
		return false
	}
	if addrLen == 0 { // vacant: nothing else may be set
		for _, x := range r {
			if x != 0 {
				return false
			}
		}
		return true
	}
	if mdl := e.LatencyModel(); !mdl.Valid() {
		return false
	}
	kv, rate := float64(math.Float32frombits(le.Uint32(r[40:]))), float64(math.Float32frombits(le.Uint32(r[44:])))
	return le.Uint64(r[:]) <= m.ref.gen &&
		addrOff+addrLen <= uint64(len(m.strs)) &&
		idOff+names <= uint64(len(m.ids)/2) &&
		Health(r[20]) <= HealthUnhealthy &&
		kv >= 0 && kv <= 1 && rate >= 0 && rate <= math.MaxFloat32
}

// Template returns the chat template the endpoint's engine was found to
// render with; prompt.Plain when not known.
func (e Endpoint) Template() prompt.Template { return prompt.Template(e.r[21]) }

// ModelTemplate returns the chat template to render requests for model id
// (Model) with: the one most endpoints serving it render with
// (prompt.Tally), prompt.Plain when none is known.
func (m *Manifest) ModelTemplate(id int) prompt.Template {
	var y prompt.Tally
	for i := 0; i < m.n; i++ {
		if e := m.Endpoint(i); e.Serves(id) {
			y.Add(e.Template())
		}
	}
	return y.Winner()
}

// IndexBlocks returns the text blocks the index holds for the endpoint, in
// any tier.
func (e Endpoint) IndexBlocks() int { return int(le.Uint32(e.r[48:])) }

// Prefixes returns how many distinct prompt prefixes (a prompt's first
// block) the index holds for the endpoint that gateways routed there
// recently, each weighed by the endpoint's share of its traffic among the
// endpoints holding it, the sum rounded. Where new prefixes go decides how
// evenly the pool's traffic spreads for as long as they stay cached, and a
// block count is a poor measure of that: one tenant's unique questions
// hold as many blocks as another tenant's shared system prompt.
func (e Endpoint) Prefixes() int { return int(le.Uint32(e.r[92:])) }

// IndexCapacity returns the text blocks the endpoint's cache holds as the
// index sizes it; 0 if unknown.
func (e Endpoint) IndexCapacity() int { return int(le.Uint32(e.r[52:])) }

// LatencyModel returns the endpoint's fitted latency model; one with no
// samples when cachesync has none.
func (e Endpoint) LatencyModel() predict.Model {
	var m predict.Model
	m.TTFTSamples, m.ITLSamples = le.Uint32(e.r[56:]), le.Uint32(e.r[60:])
	for i := range m.TTFTCoef {
		m.TTFTCoef[i] = math.Float32frombits(le.Uint32(e.r[64+4*i:]))
	}
	for i := range m.ITLCoef {
		m.ITLCoef[i] = math.Float32frombits(le.Uint32(e.r[itlAt+4*i:]))
	}
	return m
}

// Vacant reports whether the slot holds no endpoint.
func (e Endpoint) Vacant() bool { return le.Uint16(e.r[12:]) == 0 }

// Since returns the generation at which the endpoint took its slot. A slot
// whose Since changed belongs to another endpoint: state a reader keeps per
// slot (in-flight counters, hysteresis) must start over.
func (e Endpoint) Since() uint64 { return le.Uint64(e.r[:]) }

func (e Endpoint) addr() []byte {
	off, n := le.Uint32(e.r[8:]), le.Uint16(e.r[12:])
	return e.m.strs[off : off+uint32(n)]
}

// Addr returns the endpoint's ip:port.
func (e Endpoint) Addr() string { return string(e.addr()) }

// AppendAddr appends the endpoint's ip:port to dst.
func (e Endpoint) AppendAddr(dst []byte) []byte { return append(dst, e.addr()...) }

// Health returns the endpoint's health.
func (e Endpoint) Health() Health { return Health(e.r[20]) }

// Serves reports whether the endpoint serves model, an id from
// Manifest.Model.
func (e Endpoint) Serves(model int) bool {
	off, n := int(le.Uint32(e.r[16:])), int(le.Uint16(e.r[14:]))
	for i := 2 * off; i < 2*(off+n); i += 2 {
		if int(le.Uint16(e.m.ids[i:])) == model {
			return true
		}
	}
	return false
}

// NumModels returns how many models and adapters the endpoint serves.
func (e Endpoint) NumModels() int { return int(le.Uint16(e.r[14:])) }

// Model returns the i-th model or adapter the endpoint serves.
func (e Endpoint) Model(i int) (name string, adapter bool) {
	id := int(le.Uint16(e.m.ids[2*(int(le.Uint32(e.r[16:]))+i):]))
	return e.m.name(id), e.m.names[nameSize*id+6] == 1
}

// Running returns the requests the engine is processing.
func (e Endpoint) Running() int { return int(le.Uint32(e.r[24:])) }

// Waiting returns the requests queued at the engine.
func (e Endpoint) Waiting() int { return int(le.Uint32(e.r[28:])) }

// PrefillTokens returns the uncached prompt tokens in flight as cachesync
// estimates them.
func (e Endpoint) PrefillTokens() int { return int(le.Uint32(e.r[32:])) }

// ShowsReports reports whether the index shows the blocks a routing report
// names from the report on (see EndpointInfo.ShowsReports).
func (e Endpoint) ShowsReports() bool { return e.r[22]&1 != 0 }

// LoadAt returns when the engine's running and waiting requests and its
// KV-cache usage were read (cachesync's last scrape of it), to the
// millisecond; ok is false when not known.
func (e Endpoint) LoadAt() (at time.Time, ok bool) {
	v := le.Uint32(e.r[36:])
	if v == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, e.m.created).Add(-time.Duration(v-1) * time.Millisecond), true
}

// KVCacheUsage returns the fraction of KV-cache blocks in use.
func (e Endpoint) KVCacheUsage() float64 { return float64(math.Float32frombits(le.Uint32(e.r[40:]))) }

// PrefillRate returns the calibrated prefill throughput in tokens per
// second, 0 if unknown.
func (e Endpoint) PrefillRate() float64 { return float64(math.Float32frombits(le.Uint32(e.r[44:]))) }

// appendManifest encodes a manifest.
func appendManifest(dst []byte, gen uint64, created time.Time, bpt float32, shardBits uint8, delta, templates ref, shards []ref, eps []epState) []byte {
	type nameKey struct {
		s       string
		adapter bool
	}
	ids := map[nameKey]int{}
	var names []nameKey
	var strs []byte
	addrOff := make([]int, len(eps))
	var epIDs []uint16
	idOff := make([]int, len(eps))
	for i := range eps {
		e := &eps[i]
		if e.vacant {
			continue
		}
		addrOff[i] = len(strs)
		strs = append(strs, e.info.Addr...)
		idOff[i] = len(epIDs)
		for _, l := range []struct {
			names   []string
			adapter bool
		}{{e.info.Models, false}, {e.info.Adapters, true}} {
			for _, n := range l.names {
				k := nameKey{n, l.adapter}
				id, ok := ids[k]
				if !ok {
					id = len(names)
					ids[k] = id
					names = append(names, k)
				}
				epIDs = append(epIDs, uint16(id))
			}
		}
	}
	nameOff := make([]int, len(names))
	for i, k := range names {
		nameOff[i] = len(strs)
		strs = append(strs, k.s...)
	}

	slotRows, nslots := appendSlotRows(nil, eps)
	pinRows, pins := appendPinRows(nil, eps)

	start := len(dst)
	dst = appendHeader(dst, KindManifest, gen)
	dst = le.AppendUint64(dst, uint64(created.UnixNano()))
	dst = append(dst, shardBits, byte(nslots), byte(nslots>>8), byte(nslots>>16))
	for _, v := range []int{len(eps), len(names), len(epIDs), len(strs)} {
		dst = le.AppendUint32(dst, uint32(v))
	}
	dst = le.AppendUint32(dst, math.Float32bits(bpt))
	dst = appendRef(dst, delta)
	dst = appendRef(dst, templates)
	for _, r := range shards {
		dst = appendRef(dst, r)
	}
	for i := range eps {
		var r [endpointSize]byte
		if e := &eps[i]; !e.vacant {
			le.PutUint64(r[0:], e.since)
			le.PutUint32(r[8:], uint32(addrOff[i]))
			le.PutUint16(r[12:], uint16(len(e.info.Addr)))
			le.PutUint16(r[14:], uint16(len(e.info.Models)+len(e.info.Adapters)))
			le.PutUint32(r[16:], uint32(idOff[i]))
			r[20] = byte(e.info.Health)
			r[21] = byte(e.info.Template)
			if e.info.ShowsReports {
				r[22] = 1
			}
			r[23] = byte(pins[i])
			le.PutUint32(r[24:], uint32(e.info.Running))
			le.PutUint32(r[28:], uint32(e.info.Waiting))
			le.PutUint32(r[32:], uint32(e.info.PrefillTokens))
			if at := e.info.LoadAt; !at.IsZero() {
				age := min(max(created.Sub(at).Milliseconds(), 0), math.MaxUint32-1)
				le.PutUint32(r[36:], uint32(age+1))
			}
			le.PutUint32(r[40:], math.Float32bits(float32(e.info.KVCacheUsage)))
			le.PutUint32(r[44:], math.Float32bits(float32(e.info.PrefillRate)))
			le.PutUint32(r[48:], uint32(e.held))
			le.PutUint32(r[52:], uint32(e.info.IndexCapacity))
			le.PutUint32(r[92:], uint32(e.prefixes))
			mdl := &e.info.Model
			le.PutUint32(r[56:], mdl.TTFTSamples)
			le.PutUint32(r[60:], mdl.ITLSamples)
			for i, c := range mdl.TTFTCoef {
				le.PutUint32(r[64+4*i:], math.Float32bits(c))
			}
			for i, c := range mdl.ITLCoef {
				le.PutUint32(r[itlAt+4*i:], math.Float32bits(c))
			}
		}
		dst = append(dst, r[:]...)
	}
	for i, k := range names {
		dst = le.AppendUint32(dst, uint32(nameOff[i]))
		dst = le.AppendUint16(dst, uint16(len(k.s)))
		kind := byte(0)
		if k.adapter {
			kind = 1
		}
		dst = append(dst, kind, 0)
	}
	for _, id := range epIDs {
		dst = le.AppendUint16(dst, id)
	}
	dst = append(dst, strs...)
	dst = append(dst, slotRows...)
	dst = append(dst, pinRows...)
	return finishPart(dst, start)
}

func appendRef(dst []byte, r ref) []byte {
	var b [refSize]byte
	r.put(b[:])
	return append(dst, b[:]...)
}
