// Package kvevents receives the KV-cache events of vLLM and SGLang engines
// over ZeroMQ and decodes them.
//
// An engine (one per data-parallel rank) publishes on a PUB socket one
// message per batch of events: [topic, seq (8 bytes, big-endian), msgpack
// EventBatch]. seq counts from 0 per engine process. A Subscriber follows one
// engine: it subscribes, decodes each batch, and hands batches to a Handler
// strictly in sequence order. When batches go missing it asks the engine's
// replay socket (a ROUTER) for them; when that cannot fill the gap, or the
// engine restarted, it tells the Handler to forget the engine (Reset) and
// starts again from what it can get.
//
// The Decoder reads every encoding engines have shipped: the batch as a
// positional array [ts, events, data_parallel_rank] (or [ts, events] from
// older SGLang) or as a map; events as positional arrays tagged by their
// first element, of any length at least their mandatory fields (releases
// declared more fields over time), or as maps tagged by "type"; block hashes
// as integers or as bytes; token ids flat or, from SGLang with speculative
// decoding, as overlapping pairs. Unknown fields, map keys and event types
// are skipped.
package kvevents

import "strconv"

// Kind is the type of a KV-cache event.
type Kind uint8

// The event kinds.
const (
	// BlockStored: blocks entered the cache (of the tier in Medium).
	BlockStored Kind = iota + 1
	// BlockRemoved: blocks left the cache (of the tier in Medium).
	BlockRemoved
	// AllBlocksCleared: the engine dropped its whole prefix cache.
	AllBlocksCleared
)

var kindNames = [...]string{BlockStored: "BlockStored", BlockRemoved: "BlockRemoved", AllBlocksCleared: "AllBlocksCleared"}

// String returns the event's tag, e.g. "BlockStored".
func (k Kind) String() string {
	if k > 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Event is one decoded event. Fields an event does not carry are zero. Its
// slices belong to the Decoder and stay valid until its next Decode.
type Event struct {
	Kind Kind
	// Hashes are the blocks' hashes: integers as sent (vLLM sends the low
	// 64 bits of its hash), byte hashes as their last 8 bytes, big-endian.
	Hashes []uint64
	// Parent is the hash of the block before Hashes[0]; HasParent is false
	// when the chain starts at the root.
	Parent    uint64
	HasParent bool
	// Tokens are the token ids of all blocks, concatenated (BlockStored).
	// Offloading connectors send none for stores to a lower tier.
	Tokens    []uint32
	BlockSize int
	// LoRAID is the adapter's id, 0 for none (deprecated by vLLM in favour
	// of LoRAName, the adapter's name, "" for none).
	LoRAID   int64
	LoRAName string
	// Medium is the storage tier, e.g. "GPU" or "CPU"; "" when not sent.
	Medium string
	// Extra has one entry per block when the engine sent extra_keys: what
	// besides the tokens went into the block's hash.
	Extra []Extra
	// Group is the KV-cache group (hybrid models), 0 when not sent.
	Group int
	// SpecKind is the group's kind, e.g. "full_attention"; "" when not sent.
	SpecKind string
	// Locality is "LOCAL" or "REMOTE" relative to the publisher where an
	// engine sends it, else "".
	Locality string
	// Ownership names the secondary offloading tier that sent the event
	// (vLLM 0.33's tiered offloading, e.g. "kvcr"); "" for the primary.
	Ownership string
}

// Extra is one block's extra hash keys.
type Extra struct {
	// Keys are the string keys: vLLM puts the LoRA name on every block of
	// an adapter's request and the cache salt on its first block.
	Keys []string
	// Other counts keys of other types (multimodal feature identifiers,
	// prompt-embedding hashes).
	Other int
}

// Batch is one EventBatch with its sequence number.
type Batch struct {
	Seq uint64
	// TS is the engine's wall-clock time in seconds.
	TS float64
	// DPRank is the data-parallel rank the engine stamped, -1 when none.
	DPRank int
	Events []Event
}
