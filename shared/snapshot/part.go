package snapshot

import (
	"encoding/binary"
	"errors"
	"strconv"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/shared/errdetail"
)

// Version is the format version this package writes and the only one it
// reads.
const Version = 8

const (
	partMagic   = "KVRS"
	headerSize  = 24
	trailerSize = 8
)

var le = binary.LittleEndian

// Kind says what a part holds.
type Kind uint8

// The kinds of part.
const (
	KindManifest  Kind = 1 // header, endpoint table and the references to every other part
	KindShard     Kind = 2 // the prefix index for one hash range, as of its last compaction
	KindDelta     Kind = 3 // index entries changed since their shard's last compaction
	KindTemplates Kind = 4 // the chat templates of models the engines render with no template kvroute names
)

// String returns the kind's name.
func (k Kind) String() string {
	switch k {
	case KindManifest:
		return "manifest"
	case KindShard:
		return "shard"
	case KindDelta:
		return "delta"
	case KindTemplates:
		return "templates"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Errors returned by the decoders; wrapped errors carry the detail.
var (
	// ErrCorrupt reports bytes that are truncated, fail their checksum or
	// break a structural rule. Nothing of such a part is used.
	ErrCorrupt = errors.New("snapshot: corrupt")
	// ErrVersion reports a part or bundle in a format version this package
	// does not read.
	ErrVersion = errors.New("snapshot: unsupported format version")
	// ErrInconsistent reports parts that are each valid but do not belong
	// together: a shard or delta whose generation or checksum differs from
	// what the manifest lists. In shared data it means the fetcher is in
	// the middle of an update; retry later.
	ErrInconsistent = errors.New("snapshot: parts do not match the manifest")
)

func corrupt(msg string) error      { return errdetail.New(ErrCorrupt, msg) }
func inconsistent(msg string) error { return errdetail.New(ErrInconsistent, msg) }

// ref identifies one part: its generation and checksum, with its size and
// entry count for accounting. The manifest stores one per shard and one for
// the delta, 24 bytes each.
type ref struct {
	gen, sum uint64
	size     uint32
	entries  uint32
}

const refSize = 24

func (r ref) put(b []byte) {
	le.PutUint64(b[0:], r.gen)
	le.PutUint64(b[8:], r.sum)
	le.PutUint32(b[16:], r.size)
	le.PutUint32(b[20:], r.entries)
}

func readRef(b []byte) ref {
	return ref{gen: le.Uint64(b[0:]), sum: le.Uint64(b[8:]), size: le.Uint32(b[16:]), entries: le.Uint32(b[20:])}
}

// same reports whether two references name the same part bytes.
func (r ref) same(o ref) bool { return r.gen == o.gen && r.sum == o.sum && r.size == o.size }

// appendHeader starts a part of the given kind; finishPart fills in its
// length and appends the checksum.
func appendHeader(dst []byte, k Kind, gen uint64) []byte {
	dst = append(dst, partMagic...)
	dst = le.AppendUint16(dst, Version)
	dst = append(dst, byte(k), 0)
	dst = le.AppendUint64(dst, gen)
	dst = le.AppendUint32(dst, 0) // length, set by finishPart
	dst = le.AppendUint32(dst, 0)
	return dst
}

// finishPart completes the part that starts at dst[start:].
func finishPart(dst []byte, start int) []byte {
	le.PutUint32(dst[start+16:], uint32(len(dst)-start+trailerSize))
	return le.AppendUint64(dst, xxhash.Sum64(dst[start:]))
}

// checkPart verifies the framing of a part: magic, version, kind, length
// and checksum. It returns the part's generation.
func checkPart(b []byte, k Kind) (uint64, error) {
	if len(b) < headerSize+trailerSize {
		return 0, corrupt(k.String() + ": truncated at " + strconv.Itoa(len(b)) + " bytes")
	}
	if string(b[:4]) != partMagic {
		return 0, corrupt(k.String() + ": bad magic")
	}
	if v := le.Uint16(b[4:]); v != Version {
		return 0, errdetail.New(ErrVersion, k.String()+": version "+strconv.Itoa(int(v)))
	}
	if Kind(b[6]) != k {
		return 0, corrupt("want a " + k.String() + ", have a " + Kind(b[6]).String())
	}
	if b[7] != 0 || le.Uint32(b[20:]) != 0 {
		return 0, corrupt(k.String() + ": reserved header bytes set")
	}
	if n := le.Uint32(b[16:]); uint64(n) != uint64(len(b)) {
		return 0, corrupt(k.String() + ": length " + strconv.Itoa(len(b)) + ", header says " + strconv.FormatUint(uint64(n), 10))
	}
	if xxhash.Sum64(b[:len(b)-trailerSize]) != le.Uint64(b[len(b)-trailerSize:]) {
		return 0, corrupt(k.String() + ": checksum mismatch")
	}
	return le.Uint64(b[8:]), nil
}

// partRef returns the reference of a part whose framing has been checked
// or that this package just encoded.
func partRef(b []byte, entries int) ref {
	return ref{gen: le.Uint64(b[8:]), sum: le.Uint64(b[len(b)-trailerSize:]), size: uint32(len(b)), entries: uint32(entries)}
}
