package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// ErrMalformed reports a payload that is not an EventBatch. Decode errors
// wrap it.
var ErrMalformed = errors.New("kvevents: malformed event batch")

// maxDepth bounds the nesting of values the decoder skips: events nest four
// deep; anything much deeper is not an event batch.
const maxDepth = 16

// maxIntern bounds the strings a Decoder keeps to avoid allocating them
// again (media, LoRA names, spec kinds); cache salts vary per request and
// are allocated once the table is full. Only strings up to maxInternLen
// bytes are kept: a cache salt is a client's string, and 1,024 of a
// client's megabyte salts would pin a gigabyte for the process's life (a
// long fuzz run found the table holding 1.4 GB).
const (
	maxIntern    = 1024
	maxInternLen = 128
)

// Decoder decodes EventBatch payloads, reusing its memory from one batch to
// the next. It is not safe for concurrent use.
type Decoder struct {
	r       bytes.Reader
	payload []byte // what r reads
	d       *msgpack.Decoder
	buf     []byte
	events  []Event
	hashes  []uint64
	tokens  []uint32
	extras  []Extra
	keys    []string
	intern  map[string]string
	// Unknown counts events of types this package does not know, skipped.
	Unknown uint64
}

// NewDecoder returns a Decoder.
func NewDecoder() *Decoder {
	d := &Decoder{intern: make(map[string]string)}
	d.d = msgpack.NewDecoder(&d.r)
	return d
}

// Decode decodes one payload into b (b.Seq is left alone). b's events and
// their slices stay valid until the next Decode. On error b holds no events.
func (d *Decoder) Decode(payload []byte, b *Batch) error {
	d.r.Reset(payload)
	d.payload = payload
	d.d.Reset(&d.r)
	d.events, d.hashes, d.tokens, d.extras, d.keys = d.events[:0], d.hashes[:0], d.tokens[:0], d.extras[:0], d.keys[:0]
	b.TS, b.DPRank, b.Events = 0, -1, nil
	if err := d.batch(b); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if d.r.Len() != 0 {
		return fmt.Errorf("%w: %d bytes after the batch", ErrMalformed, d.r.Len())
	}
	b.Events = d.events
	return nil
}

func (d *Decoder) batch(b *Batch) error {
	c, err := d.d.PeekCode()
	if err != nil {
		return err
	}
	if isMap(c) {
		n, err := d.length(d.d.DecodeMapLen())
		if err != nil {
			return err
		}
		events := false
		for range n {
			key, err := d.str()
			if err != nil {
				return fmt.Errorf("batch key: %w", err)
			}
			switch string(key) {
			case "ts":
				b.TS, err = d.d.DecodeFloat64()
			case "events":
				events, err = true, d.eventList()
			case "data_parallel_rank":
				b.DPRank, err = d.optInt()
			default:
				err = d.skip(0)
			}
			if err != nil {
				return fmt.Errorf("batch %s: %w", key, err)
			}
		}
		if !events {
			return errors.New("batch map without events")
		}
		return nil
	}
	n, err := d.length(d.d.DecodeArrayLen())
	if err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	if n < 2 {
		return fmt.Errorf("batch array of %d elements, want [ts, events, ...]", n)
	}
	if b.TS, err = d.d.DecodeFloat64(); err != nil {
		return fmt.Errorf("batch ts: %w", err)
	}
	if err := d.eventList(); err != nil {
		return err
	}
	if n >= 3 {
		if b.DPRank, err = d.optInt(); err != nil {
			return fmt.Errorf("batch data_parallel_rank: %w", err)
		}
	}
	return d.skipN(n - 3)
}

func (d *Decoder) eventList() error {
	n, err := d.length(d.d.DecodeArrayLen())
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	for i := range n {
		d.events = append(d.events, Event{})
		ev := &d.events[len(d.events)-1]
		if err := d.event(ev); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
		if ev.Kind == 0 {
			d.events = d.events[:len(d.events)-1]
			d.Unknown++
		}
	}
	return nil
}

// Field numbers, shared by both event kinds: a name in a map, a position
// in an array.
const (
	fNone = iota
	fHashes
	fParent
	fTokens
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroup
	fSpecKind
	fLocality
	fOwnership
)

// Positions after the tag in array-encoded events, in declaration order
// (vllm/distributed/kv_events.py; SGLang's structs are a prefix of these).
var (
	storedFields  = []int{fHashes, fParent, fTokens, fBlockSize, fLoRAID, fMedium, fLoRAName, fExtraKeys, fGroup, fSpecKind, fNone, fLocality, fOwnership}
	removedFields = []int{fHashes, fMedium, fGroup, fLocality, fOwnership}
)

// Mandatory fields after the tag.
const (
	storedMin  = 4 // block_hashes, parent_block_hash, token_ids, block_size
	removedMin = 1 // block_hashes
)

var fieldNames = map[string]int{
	"block_hashes":       fHashes,
	"parent_block_hash":  fParent,
	"token_ids":          fTokens,
	"block_size":         fBlockSize,
	"lora_id":            fLoRAID,
	"medium":             fMedium,
	"lora_name":          fLoRAName,
	"extra_keys":         fExtraKeys,
	"group_idx":          fGroup,
	"kv_cache_spec_kind": fSpecKind,
	"locality":           fLocality,
	"ownership":          fOwnership,
}

var kinds = map[string]Kind{"BlockStored": BlockStored, "BlockRemoved": BlockRemoved, "AllBlocksCleared": AllBlocksCleared}

func (d *Decoder) event(ev *Event) error {
	c, err := d.d.PeekCode()
	if err != nil {
		return err
	}
	if isMap(c) {
		return d.mapEvent(ev)
	}
	n, err := d.length(d.d.DecodeArrayLen())
	if err != nil {
		return err
	}
	if n < 1 {
		return errors.New("empty event array")
	}
	tag, err := d.str()
	if err != nil {
		return fmt.Errorf("tag: %w", err)
	}
	ev.Kind = kinds[string(tag)]
	var fields []int
	switch ev.Kind {
	case BlockStored:
		fields = storedFields
		if n-1 < storedMin {
			return fmt.Errorf("BlockStored with %d fields, want at least %d", n-1, storedMin)
		}
	case BlockRemoved:
		fields = removedFields
		if n-1 < removedMin {
			return fmt.Errorf("BlockRemoved with %d fields, want at least %d", n-1, removedMin)
		}
	}
	for i := range n - 1 {
		f := fNone
		if i < len(fields) {
			f = fields[i]
		}
		if err := d.field(ev, f); err != nil {
			return fmt.Errorf("%s field %d: %w", ev.Kind, i+1, err)
		}
	}
	return nil
}

func (d *Decoder) mapEvent(ev *Event) error {
	n, err := d.length(d.d.DecodeMapLen())
	if err != nil {
		return err
	}
	var seen [fOwnership + 1]bool
	tagged := false
	for range n {
		key, err := d.str()
		if err != nil {
			return fmt.Errorf("event key: %w", err)
		}
		if string(key) == "type" {
			tag, err := d.str()
			if err != nil {
				return fmt.Errorf("type: %w", err)
			}
			ev.Kind, tagged = kinds[string(tag)], true
			continue
		}
		f := fieldNames[string(key)]
		seen[f] = true
		if err := d.field(ev, f); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
	}
	switch {
	case !tagged:
		return errors.New("event map without type")
	case ev.Kind == BlockStored && !(seen[fHashes] && seen[fTokens]):
		return errors.New("BlockStored without block_hashes or token_ids")
	case ev.Kind == BlockRemoved && !seen[fHashes]:
		return errors.New("BlockRemoved without block_hashes")
	}
	return nil
}

func (d *Decoder) field(ev *Event, f int) error {
	var err error
	switch f {
	case fHashes:
		start := len(d.hashes)
		err = d.list(func() error {
			h, err := d.hash()
			d.hashes = append(d.hashes, h)
			return err
		})
		ev.Hashes = d.hashes[start:len(d.hashes):len(d.hashes)]
	case fParent:
		if d.isNil() {
			ev.HasParent = false
			return d.d.DecodeNil()
		}
		ev.Parent, err = d.hash()
		ev.HasParent = err == nil
	case fTokens:
		err = d.tokenList(ev)
	case fBlockSize:
		var n int
		n, err = d.optInt()
		ev.BlockSize = max(n, 0)
	case fLoRAID:
		if d.isNil() {
			return d.d.DecodeNil()
		}
		ev.LoRAID, err = d.d.DecodeInt64()
	case fMedium:
		ev.Medium, err = d.optStr()
	case fLoRAName:
		ev.LoRAName, err = d.optStr()
	case fExtraKeys:
		err = d.extraKeys(ev)
	case fGroup:
		var n int
		n, err = d.optInt()
		ev.Group = max(n, 0)
	case fSpecKind:
		ev.SpecKind, err = d.optStr()
	case fLocality:
		ev.Locality, err = d.optStr()
	case fOwnership:
		ev.Ownership, err = d.optStr()
	default:
		err = d.skip(0)
	}
	return err
}

// hash reads an integer hash, or a byte hash as its last 8 bytes
// big-endian (shorter ones left-padded with zeros), as vLLM converts its
// hashes to integers.
func (d *Decoder) hash() (uint64, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return 0, err
	}
	if msgpcode.IsBin(c) || msgpcode.IsString(c) {
		b, err := d.str()
		if err != nil {
			return 0, err
		}
		if len(b) > 8 {
			b = b[len(b)-8:]
		}
		var h [8]byte
		copy(h[8-len(b):], b)
		return binary.BigEndian.Uint64(h[:]), nil
	}
	if !isInt(c) {
		return 0, fmt.Errorf("block hash of msgpack type %#x", c)
	}
	// Negative integers (from publishers with signed hashes) keep their
	// two's complement bits.
	return d.d.DecodeUint64()
}

// tokenList reads token ids: flat, or SGLang's overlapping pairs
// [[t0, t1], [t1, t2], ...], flattened to t0, t1, t2, ...
func (d *Decoder) tokenList(ev *Event) error {
	start := len(d.tokens)
	n, err := d.length(d.d.DecodeArrayLen())
	if err != nil {
		return err
	}
	if n < 0 {
		return errors.New("null where a list belongs")
	}
	// Token lists are most of a batch: read unsigned integers straight
	// from the payload, and leave anything else to the decoder.
	p := d.payload[len(d.payload)-d.r.Len():]
	i, used := 0, 0
	for ; i < n; i++ {
		t, w := uintAt(p[used:])
		if w == 0 {
			break
		}
		d.tokens = append(d.tokens, t)
		used += w
	}
	if _, err := d.r.Seek(int64(used), io.SeekCurrent); err != nil {
		return err
	}
	pairs := 0
	for ; i < n; i++ {
		if err := d.tokenElem(&pairs); err != nil {
			return fmt.Errorf("[%d]: %w", i, err)
		}
	}
	ev.Tokens = d.tokens[start:len(d.tokens):len(d.tokens)]
	return nil
}

// uintAt reads a msgpack unsigned integer of at most 32 bits from the start
// of p and returns it and its width, or a width of 0 for anything else.
func uintAt(p []byte) (uint32, int) {
	if len(p) == 0 {
		return 0, 0
	}
	switch c := p[0]; {
	case c <= msgpcode.PosFixedNumHigh:
		return uint32(c), 1
	case c == msgpcode.Uint8 && len(p) >= 2:
		return uint32(p[1]), 2
	case c == msgpcode.Uint16 && len(p) >= 3:
		return uint32(binary.BigEndian.Uint16(p[1:])), 3
	case c == msgpcode.Uint32 && len(p) >= 5:
		return binary.BigEndian.Uint32(p[1:]), 5
	}
	return 0, 0
}

// tokenElem reads one element of a token list the slow way: any integer
// encoding, or a pair; pairs counts the pairs read so far, as only the
// first one contributes both its tokens.
func (d *Decoder) tokenElem(pairs *int) error {
	c, err := d.d.PeekCode()
	if err != nil {
		return err
	}
	if !isArray(c) {
		t, err := d.token()
		d.tokens = append(d.tokens, t)
		return err
	}
	n, err := d.length(d.d.DecodeArrayLen())
	if err != nil {
		return err
	}
	if n < 2 {
		return fmt.Errorf("token pair of %d elements", n)
	}
	for j := range 2 {
		t, err := d.token()
		if err != nil {
			return err
		}
		if *pairs == 0 || j == 1 {
			d.tokens = append(d.tokens, t)
		}
	}
	*pairs++
	return d.skipN(n - 2)
}

func (d *Decoder) token() (uint32, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return 0, err
	}
	if !isInt(c) {
		return 0, fmt.Errorf("token id of msgpack type %#x", c)
	}
	t, err := d.d.DecodeUint64()
	if err == nil && t > math.MaxUint32 {
		err = fmt.Errorf("token id %d out of range", int64(t))
	}
	return uint32(t), err
}

// extraKeys reads extra_keys: None, or one entry per block, None or a tuple.
func (d *Decoder) extraKeys(ev *Event) error {
	if d.isNil() {
		return d.d.DecodeNil()
	}
	start := len(d.extras)
	err := d.list(func() error {
		x := Extra{}
		if d.isNil() {
			d.extras = append(d.extras, x)
			return d.d.DecodeNil()
		}
		k := len(d.keys)
		err := d.list(func() error {
			c, err := d.d.PeekCode()
			if err != nil {
				return err
			}
			if !msgpcode.IsString(c) {
				x.Other++
				return d.skip(0)
			}
			s, err := d.optStr()
			d.keys = append(d.keys, s)
			return err
		})
		x.Keys = d.keys[k:len(d.keys):len(d.keys)]
		d.extras = append(d.extras, x)
		return err
	})
	ev.Extra = d.extras[start:len(d.extras):len(d.extras)]
	return err
}

// list calls elem for every element of an array.
func (d *Decoder) list(elem func() error) error {
	n, err := d.length(d.d.DecodeArrayLen())
	if err != nil {
		return err
	}
	if n < 0 {
		return errors.New("null where a list belongs")
	}
	for i := range n {
		if err := elem(); err != nil {
			return fmt.Errorf("[%d]: %w", i, err)
		}
	}
	return nil
}

// length checks a container length against what is left of the payload,
// every element taking at least a byte.
func (d *Decoder) length(n int, err error) (int, error) {
	if err != nil {
		return 0, err
	}
	if n > d.r.Len() {
		return 0, fmt.Errorf("length %d exceeds the %d bytes left", n, d.r.Len())
	}
	return n, nil
}

// str reads a string or bytes into the decoder's scratch space.
func (d *Decoder) str() ([]byte, error) {
	n, err := d.d.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, errors.New("null where a string belongs")
	}
	if n > d.r.Len() {
		return nil, fmt.Errorf("string of %d bytes exceeds the %d bytes left", n, d.r.Len())
	}
	if cap(d.buf) < n {
		d.buf = make([]byte, n)
	}
	d.buf = d.buf[:n]
	return d.buf, d.d.ReadFull(d.buf)
}

// optStr reads a string or None (""), interning it.
func (d *Decoder) optStr() (string, error) {
	if d.isNil() {
		return "", d.d.DecodeNil()
	}
	b, err := d.str()
	if err != nil {
		return "", err
	}
	if s, ok := d.intern[string(b)]; ok {
		return s, nil
	}
	s := string(b)
	if len(d.intern) < maxIntern && len(s) <= maxInternLen {
		d.intern[s] = s
	}
	return s, nil
}

// optInt reads an int or None (-1).
func (d *Decoder) optInt() (int, error) {
	if d.isNil() {
		return -1, d.d.DecodeNil()
	}
	c, err := d.d.PeekCode()
	if err != nil {
		return 0, err
	}
	if !isInt(c) {
		return 0, fmt.Errorf("msgpack type %#x where an int belongs", c)
	}
	n, err := d.d.DecodeInt64()
	if n < math.MinInt32 || n > math.MaxInt32 {
		return 0, fmt.Errorf("int %d out of range", n)
	}
	return int(n), err
}

func (d *Decoder) isNil() bool {
	c, err := d.d.PeekCode()
	return err == nil && c == msgpcode.Nil
}

// skip skips one value, refusing to nest deeper than maxDepth.
func (d *Decoder) skip(depth int) error {
	if depth > maxDepth {
		return errors.New("values nest too deep")
	}
	c, err := d.d.PeekCode()
	if err != nil {
		return err
	}
	var n int
	switch {
	case isArray(c):
		n, err = d.length(d.d.DecodeArrayLen())
	case isMap(c):
		n, err = d.length(d.d.DecodeMapLen())
		n *= 2
	case msgpcode.IsString(c) || msgpcode.IsBin(c):
		return d.skipBytes(d.d.DecodeBytesLen())
	case msgpcode.IsExt(c):
		_, size, err := d.d.DecodeExtHeader()
		return d.skipBytes(size, err)
	default:
		return d.d.Skip() // a scalar: its size is in its code
	}
	if err != nil {
		return err
	}
	for range n {
		if err := d.skip(depth + 1); err != nil {
			return err
		}
	}
	return nil
}

// skipBytes passes over the n bytes of a string, binary or extension
// value whose header was read, after checking that the payload holds them.
// msgpack's own Skip reads a declared length into its scratch buffer,
// which a long run of hostile payloads grew past a gigabyte.
func (d *Decoder) skipBytes(n int, err error) error {
	if err != nil {
		return err
	}
	if n < 0 || n > d.r.Len() {
		return fmt.Errorf("value of %d bytes exceeds the %d bytes left", n, d.r.Len())
	}
	_, err = d.r.Seek(int64(n), io.SeekCurrent)
	return err
}

func (d *Decoder) skipN(n int) error {
	for range n {
		if err := d.skip(0); err != nil {
			return err
		}
	}
	return nil
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || c >= msgpcode.Uint8 && c <= msgpcode.Int64
}
