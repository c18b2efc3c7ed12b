// Package report encodes the routing-decision reports a gateway sends to
// cachesync: which endpoint a prompt was routed to, and the prompt's chained
// block hashes. cachesync feeds them to its approximate prefix index (and so
// does the filter itself when it runs without cachesync), so that a prefix
// one gateway routed is known to every gateway.
//
// A batch is a header, records back to back and a checksum over all of it:
//
//	batch:  "KVRP" | u16 version | u16 0 | u32 records | u32 0 | record... | u64 XXH64(everything before)
//	record: u8 recordTag | u8 len(endpoint) | u8 len(model) | u8 reason | u32 hashes | u32 cached |
//	        u32 output | u32 bytes | endpoint | model | hashes x u64
//	outcome: u8 outcomeTag | u8 len(endpoint) | u16 0 | f32 wait | u32 0 | endpoint |
//	        f32 uncached | f32 backlog | f32 running | f32 waiting | f32 predicted TTFT | f32 observed TTFT
//
// A routing record says where a prompt went, how many tokens the request
// asked to generate (cachesync's move planner learns each prefix's decode
// load from them) and how long its rendered prompt is in bytes (set against
// the engines' prompt-token counters, cachesync learns how many bytes a
// token stands for); an outcome record, sent once
// the request's first token is out, what its time to first token was
// against what the policy predicted from the terms it saw (shared/predict),
// for cachesync to fit the endpoint's latency model.
//
// All integers are little-endian. A record is self-delimited and carries no
// checksum of its own, so a gateway encodes one record per request
// (AppendRecord), queues the bytes, and a periodic task concatenates queued
// records into a batch (Writer.AddEncoded) at the cost of a copy.
//
// Parse checks the whole batch (checksum, every length, every limit) before
// any record is read, so a corrupt or truncated batch is rejected entirely,
// never half applied.
package report

import (
	"encoding/binary"
	"errors"
	"iter"
	"math"
	"slices"
	"strconv"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/shared/errdetail"
	"github.com/kvroute/kvroute/shared/predict"
)

// Version is the batch format version this package writes. It reads
// versions 2 to 5 too, the same format without reasons (version 2: the
// byte was 0), without an outcome's wait (before 4: the word was 0),
// without a routing record's output word (before 5) and without its bytes
// word (before 6), so that gateways may be upgraded after cachesync.
const Version = 6

// Reasons are the decision reasons a record can carry, by their code; ""
// (code 0) is a record that does not say. They are the filter's reason
// names (the policy's and its own fallbacks').
var Reasons = [...]string{"", "affinity", "saturated-release", "least-load", "fallback", "rendezvous", "response", "moved"}

func reasonCode(name string) (byte, bool) {
	for i, r := range Reasons {
		if r == name {
			return byte(i), true
		}
	}
	return 0, false
}

const (
	magic       = "KVRP"
	headerSize  = 16
	trailerSize = 8
	recordFixed = 12
	// outputFixed is a routing record's fixed part in version 5: the
	// output word follows the cached count. From version 6 on (routeFixed)
	// the bytes word follows that.
	outputFixed = 16
	routeFixed  = 20
	// recordTag and outcomeTag open every record: a record queued by a
	// module built against another format is refused before it reaches a
	// batch.
	recordTag  = 0xB1
	outcomeTag = 0xB2
	// outcomeBody is an outcome record's six float32s.
	outcomeBody = 24
)

// MaxName is the longest endpoint address or model name a record carries.
const MaxName = 255

// MaxHashes is the most hashes a record can carry whatever the limits:
// enough for 64 MiB of prompt text at 64-byte blocks.
const MaxHashes = 1 << 20

// Default limits: DefaultMaxHashes matches the block cap of shared/blockhash
// (128k-token prompts), and DefaultMaxRecords covers a gateway routing
// 100k requests per second with a 100 ms report interval.
const (
	DefaultMaxRecords = 16384
	DefaultMaxHashes  = 8192
)

var le = binary.LittleEndian

// Errors returned by the decoder; wrapped errors carry the detail (test with
// errors.Is).
var (
	// ErrCorrupt reports a batch or record that is truncated, fails its
	// checksum or breaks a rule of the format.
	ErrCorrupt = errors.New("report: corrupt")
	// ErrVersion reports a batch in a format version this package does not
	// read.
	ErrVersion = errors.New("report: unsupported format version")
	// ErrLimit reports a well-formed batch that exceeds the reader's
	// Limits.
	ErrLimit = errors.New("report: over limit")
)

func corrupt(msg string) error { return errdetail.New(ErrCorrupt, msg) }

// Limits bound what a reader accepts. The zero value means the defaults.
type Limits struct {
	MaxRecords int // records per batch; <= 0 means DefaultMaxRecords
	MaxHashes  int // hashes per record; <= 0 means DefaultMaxHashes, and never more than MaxHashes
}

func (l Limits) records() int {
	if l.MaxRecords <= 0 {
		return DefaultMaxRecords
	}
	return l.MaxRecords
}

func (l Limits) hashes() int {
	if l.MaxHashes <= 0 {
		return DefaultMaxHashes
	}
	return min(l.MaxHashes, MaxHashes)
}

// Record is one routing decision.
type Record struct {
	Endpoint string   // the chosen endpoint's ip:port
	Model    string   // the requested model or adapter, informational
	Hashes   []uint64 // the prompt's chained block hashes, prefix first
	Cached   int      // leading hashes the policy found cached at Endpoint
	Reason   string   // why Endpoint was chosen: one of Reasons
	// Output is how many tokens the request asked to generate (its
	// max_tokens), 0 to MaxOutput; 0 when it did not say.
	Output int
	// Bytes is the length of the rendered prompt, 0 to MaxBytes; 0 when
	// not known. Hashes may cover less of it (a gateway caps them).
	Bytes int
}

// MaxOutput is the most output tokens a record carries.
const MaxOutput = 1 << 24

// MaxBytes is the longest prompt, in bytes, a record carries: as many as
// MaxHashes covers.
const MaxBytes = MaxHashes * 64

// AppendRecord appends r, encoded, to dst. It refuses an empty or overlong
// endpoint, an overlong model, more than MaxHashes hashes, a Cached count
// outside 0..len(Hashes), and an Output or Bytes out of range; dst is then
// returned unchanged.
func AppendRecord(dst []byte, r *Record) ([]byte, error) {
	switch {
	case len(r.Endpoint) == 0 || len(r.Endpoint) > MaxName:
		return dst, errors.New("report: endpoint must have 1 to 255 bytes")
	case len(r.Model) > MaxName:
		return dst, errors.New("report: model must have at most 255 bytes")
	case len(r.Hashes) > MaxHashes:
		return dst, errors.New("report: more than " + strconv.Itoa(MaxHashes) + " hashes")
	case r.Cached < 0 || r.Cached > len(r.Hashes):
		return dst, errors.New("report: cached count outside 0..hashes")
	case r.Output < 0 || r.Output > MaxOutput:
		return dst, errors.New("report: output tokens outside 0.." + strconv.Itoa(MaxOutput))
	case r.Bytes < 0 || r.Bytes > MaxBytes:
		return dst, errors.New("report: prompt bytes outside 0.." + strconv.Itoa(MaxBytes))
	}
	reason, ok := reasonCode(r.Reason)
	if !ok {
		return dst, errors.New("report: unknown reason " + strconv.Quote(r.Reason))
	}
	dst = append(dst, recordTag, byte(len(r.Endpoint)), byte(len(r.Model)), reason)
	dst = le.AppendUint32(dst, uint32(len(r.Hashes)))
	dst = le.AppendUint32(dst, uint32(r.Cached))
	dst = le.AppendUint32(dst, uint32(r.Output))
	dst = le.AppendUint32(dst, uint32(r.Bytes))
	dst = append(dst, r.Endpoint...)
	dst = append(dst, r.Model...)
	for _, h := range r.Hashes {
		dst = le.AppendUint64(dst, h)
	}
	return dst, nil
}

// Outcome is what a routed request's first token took.
type Outcome struct {
	Endpoint string
	// Features are the terms the policy saw for the endpoint.
	Features predict.Features
	// Predicted and Observed are the time to first token the policy
	// expected and the one the gateway saw, in seconds.
	Predicted, Observed float64
}

// AppendOutcome appends o, encoded, to dst. It refuses an empty or overlong
// endpoint and a figure that is negative or not finite as a float32 (which
// would make Parse refuse the whole batch), and returns dst unchanged.
func AppendOutcome(dst []byte, o *Outcome) ([]byte, error) {
	if len(o.Endpoint) == 0 || len(o.Endpoint) > MaxName {
		return dst, errors.New("report: endpoint must have 1 to 255 bytes")
	}
	f := &o.Features
	vs := [...]float64{f.Uncached, f.Backlog, f.Running, f.Waiting, o.Predicted, o.Observed}
	for _, v := range vs {
		if !validFigure(float32(v)) {
			return dst, errors.New("report: outcome figure negative or not finite")
		}
	}
	if !validFigure(float32(f.Wait)) {
		return dst, errors.New("report: outcome figure negative or not finite")
	}
	dst = append(dst, outcomeTag, byte(len(o.Endpoint)), 0, 0)
	dst = le.AppendUint32(dst, math.Float32bits(float32(f.Wait)))
	dst = append(dst, 0, 0, 0, 0)
	dst = append(dst, o.Endpoint...)
	for _, v := range vs {
		dst = le.AppendUint32(dst, math.Float32bits(float32(v)))
	}
	return dst, nil
}

func validFigure(v float32) bool { return v >= 0 && v <= math.MaxFloat32 }

// recordSize checks the record at the start of b against the format and
// maxHashes and returns its size and hash count.
func recordSize(b []byte, maxHashes int, version uint16) (size, hashes int, err error) {
	if len(b) < recordFixed {
		return 0, 0, corrupt("record truncated")
	}
	if b[0] == outcomeTag {
		if b[1] == 0 || b[2]|b[3] != 0 || le.Uint32(b[8:]) != 0 || (version < 4 && le.Uint32(b[4:]) != 0) ||
			!validFigure(math.Float32frombits(le.Uint32(b[4:]))) {
			return 0, 0, corrupt("bad outcome record")
		}
		size = recordFixed + int(b[1]) + outcomeBody
		if size > len(b) {
			return 0, 0, corrupt("record truncated")
		}
		for i := size - outcomeBody; i < size; i += 4 {
			if !validFigure(math.Float32frombits(le.Uint32(b[i:]))) {
				return 0, 0, corrupt("outcome figure negative or not finite")
			}
		}
		return size, 0, nil
	}
	if b[0] != recordTag {
		return 0, 0, corrupt("bad record tag")
	}
	if int(b[3]) >= len(Reasons) || (version < 3 && b[3] != 0) {
		return 0, 0, corrupt("bad reason code")
	}
	fixed := routeFixedOf(version)
	if len(b) < fixed {
		return 0, 0, corrupt("record truncated")
	}
	if fixed >= outputFixed && le.Uint32(b[12:]) > MaxOutput {
		return 0, 0, corrupt("output tokens out of range")
	}
	if fixed >= routeFixed && le.Uint32(b[16:]) > MaxBytes {
		return 0, 0, corrupt("prompt bytes out of range")
	}
	ep, model := int(b[1]), int(b[2])
	n, cached := le.Uint32(b[4:]), le.Uint32(b[8:])
	if ep == 0 {
		return 0, 0, corrupt("record without endpoint")
	}
	if cached > n {
		return 0, 0, corrupt("cached count over hash count")
	}
	if uint64(n) > uint64(maxHashes) {
		if n > MaxHashes {
			return 0, 0, corrupt("hash count " + strconv.FormatUint(uint64(n), 10) + " out of range")
		}
		return 0, 0, errdetail.New(ErrLimit, "record with "+strconv.FormatUint(uint64(n), 10)+" hashes, limit "+strconv.Itoa(maxHashes))
	}
	size = fixed + ep + model + 8*int(n)
	if size > len(b) {
		return 0, 0, corrupt("record truncated")
	}
	return size, int(n), nil
}

// routeFixedOf returns the size of a routing record's fixed part in a
// batch of the version.
func routeFixedOf(version uint16) int {
	switch {
	case version < 5:
		return recordFixed
	case version == 5:
		return outputFixed
	}
	return routeFixed
}

// Writer collects records into one batch. The zero value is an empty batch
// ready to use; a Writer reuses its buffer after Reset.
type Writer struct {
	buf []byte // header space, then the records
	n   int
}

// Reset empties the batch, keeping its buffer.
func (w *Writer) Reset() {
	w.buf = w.buf[:0]
	w.n = 0
}

func (w *Writer) start() {
	if len(w.buf) == 0 {
		w.buf = append(w.buf, make([]byte, headerSize)...)
	}
}

// Add encodes r into the batch; see AppendRecord for what it refuses.
func (w *Writer) Add(r *Record) error {
	w.start()
	b, err := AppendRecord(w.buf, r)
	if err != nil {
		return err
	}
	w.buf = b
	w.n++
	return nil
}

// AddEncoded adds records that AppendRecord encoded, back to back in b, and
// returns how many. It checks every record (within the format's MaxHashes)
// and adds nothing if any is malformed or b ends inside one.
func (w *Writer) AddEncoded(b []byte) (int, error) {
	n := 0
	for p := b; len(p) > 0; n++ {
		size, _, err := recordSize(p, MaxHashes, Version)
		if err != nil {
			return 0, err
		}
		p = p[size:]
	}
	w.start()
	w.buf = append(w.buf, b...)
	w.n += n
	return n, nil
}

// Len returns the number of records in the batch.
func (w *Writer) Len() int { return w.n }

// Size returns the size of the encoded batch, what Bytes returns.
func (w *Writer) Size() int { return max(len(w.buf), headerSize) + trailerSize }

// Bytes returns the encoded batch. It stays valid until the next call on w;
// records may be added afterwards.
func (w *Writer) Bytes() []byte {
	w.start()
	copy(w.buf, magic)
	le.PutUint16(w.buf[4:], Version)
	le.PutUint16(w.buf[6:], 0)
	le.PutUint32(w.buf[8:], uint32(w.n))
	le.PutUint32(w.buf[12:], 0)
	out := le.AppendUint64(w.buf, xxhash.Sum64(w.buf))
	return out[:len(out):len(out)]
}

// Batch is a parsed batch, read in place from the bytes given to Parse.
type Batch struct {
	recs   []byte
	n      int
	hashes int
	fixed  int // a routing record's fixed part in this batch's version
}

// Parse checks b as a batch within lim and returns it. The batch keeps b;
// b must not change while the batch is used.
func Parse(b []byte, lim Limits) (Batch, error) {
	if len(b) < headerSize+trailerSize {
		return Batch{}, corrupt("batch truncated at " + strconv.Itoa(len(b)) + " bytes")
	}
	if string(b[:4]) != magic {
		return Batch{}, corrupt("bad magic")
	}
	v := le.Uint16(b[4:])
	if v > Version || v < 2 {
		return Batch{}, errdetail.New(ErrVersion, "version "+strconv.Itoa(int(v)))
	}
	end := len(b) - trailerSize
	if xxhash.Sum64(b[:end]) != le.Uint64(b[end:]) {
		return Batch{}, corrupt("checksum mismatch")
	}
	if le.Uint16(b[6:]) != 0 || le.Uint32(b[12:]) != 0 {
		return Batch{}, corrupt("reserved header bytes set")
	}
	n := le.Uint32(b[8:])
	if uint64(n) > uint64(lim.records()) {
		return Batch{}, errdetail.New(ErrLimit, strconv.FormatUint(uint64(n), 10)+" records, limit "+strconv.Itoa(lim.records()))
	}
	bt := Batch{recs: b[headerSize:end], n: int(n), fixed: routeFixedOf(v)}
	p, maxHashes := bt.recs, lim.hashes()
	for i := 0; i < bt.n; i++ {
		size, h, err := recordSize(p, maxHashes, v)
		if err != nil {
			return Batch{}, inRecord(i, err)
		}
		bt.hashes += h
		p = p[size:]
	}
	if len(p) != 0 {
		return Batch{}, corrupt("bytes after the last record")
	}
	return bt, nil
}

// inRecord names record i in err's detail.
func inRecord(i int, err error) error { return errdetail.Prefix("record "+strconv.Itoa(i)+": ", err) }

// Len returns the number of records.
func (b Batch) Len() int { return b.n }

// NumHashes returns the number of hashes over all records.
func (b Batch) NumHashes() int { return b.hashes }

// Records yields the records in order.
func (b Batch) Records() iter.Seq[Entry] {
	return func(yield func(Entry) bool) {
		p := b.recs
		for range b.n {
			// Parse checked every record, so the sizes hold.
			fixed := b.fixed
			size := fixed + int(p[1]) + int(p[2]) + 8*int(le.Uint32(p[4:]))
			if p[0] == outcomeTag {
				fixed = recordFixed
				size = fixed + int(p[1]) + outcomeBody
			}
			if !yield(Entry{b: p[:size:size], fixed: fixed}) {
				return
			}
			p = p[size:]
		}
	}
}

// Entry is one record of a parsed batch, read in place.
type Entry struct {
	b     []byte
	fixed int // the size of its fixed part
}

// IsOutcome reports whether the entry is an outcome record (Outcome), not
// a routing record (Model, Cached, the hashes).
func (e Entry) IsOutcome() bool { return e.b[0] == outcomeTag }

// Outcome returns an outcome record's figures; the endpoint is left empty
// (read it with Endpoint).
func (e Entry) Outcome() Outcome {
	off := recordFixed + int(e.b[1])
	v := func(i int) float64 { return float64(math.Float32frombits(le.Uint32(e.b[off+4*i:]))) }
	return Outcome{
		Features: predict.Features{Uncached: v(0), Backlog: v(1), Running: v(2), Waiting: v(3),
			Wait: float64(math.Float32frombits(le.Uint32(e.b[4:])))},
		Predicted: v(4), Observed: v(5),
	}
}

// Endpoint returns the endpoint's ip:port. The slice aliases the batch.
func (e Entry) Endpoint() []byte { return e.b[e.fixed : e.fixed+int(e.b[1])] }

// Model returns the model name. The slice aliases the batch.
func (e Entry) Model() []byte {
	off := e.fixed + int(e.b[1])
	return e.b[off : off+int(e.b[2])]
}

// Reason returns the record's reason, one of Reasons ("" when it does
// not say).
func (e Entry) Reason() string { return Reasons[e.b[3]] }

// ReasonCode returns the record's reason as its index in Reasons.
func (e Entry) ReasonCode() int { return int(e.b[3]) }

// Cached returns how many leading hashes the policy found cached.
func (e Entry) Cached() int { return int(le.Uint32(e.b[8:])) }

// NumHashes returns the number of hashes; 0 for an outcome record.
func (e Entry) NumHashes() int {
	if e.IsOutcome() {
		return 0
	}
	return int(le.Uint32(e.b[4:]))
}

// Hash returns hash i, 0 <= i < NumHashes().
func (e Entry) Hash(i int) uint64 { return le.Uint64(e.b[e.hashOff()+8*i:]) }

func (e Entry) hashOff() int { return e.fixed + int(e.b[1]) + int(e.b[2]) }

// Output returns how many tokens the request asked to generate; 0 when the
// record does not say (an outcome record, or a batch before version 5).
func (e Entry) Output() int {
	if e.IsOutcome() || e.fixed < outputFixed {
		return 0
	}
	return int(le.Uint32(e.b[12:]))
}

// Bytes returns the rendered prompt's length in bytes; 0 when the record
// does not say (an outcome record, or a batch before version 6).
func (e Entry) Bytes() int {
	if e.IsOutcome() || e.fixed < routeFixed {
		return 0
	}
	return int(le.Uint32(e.b[16:]))
}

// AppendHashes appends the record's hashes, prefix first, to dst.
func (e Entry) AppendHashes(dst []uint64) []uint64 {
	dst = slices.Grow(dst, e.NumHashes())
	for p := e.b[e.hashOff():]; len(p) >= 8; p = p[8:] {
		dst = append(dst, le.Uint64(p))
	}
	return dst
}
