// Package snapshot is the binary prefix-index and load snapshot that
// cachesync publishes and every filter worker reads on every request.
//
// A snapshot is a set of parts. The manifest carries the header, the
// endpoint table with each endpoint's load, and a reference (generation,
// checksum, size) to every other part. The index is split into 2^k shards
// by the top k bits of the block hash, plus one delta holding the entries
// changed since their shard was last written. Every part checks itself
// (checksum, generation, kind), so a reader can hold parts of different
// ages and trust each one that matches the manifest's reference.
//
// cachesync keeps the authoritative index in a Builder and calls Build each
// sync interval; the resulting Image serves bundles: the manifest plus the
// parts written after the generation a fetcher holds (AppendBundle). The
// filter's fetcher parses the bundle (ParseBundle, which checks every
// entry), confirms it completes what it holds (Bundle.Complete), and stores
// each part in Envoy shared data under Keys, the manifest and then the head
// last. Each worker keeps a View and calls View.Refresh: it reads the
// 24-byte head and, when the generation moved, the manifest and only the
// parts whose reference changed. Lookup, Prefix and the Manifest and
// Endpoint accessors read the held byte slices in place and do not allocate.
//
// # Format
//
// All integers are little-endian. Every part starts with a 24-byte header
// and ends with an 8-byte checksum:
//
//	off  size  field
//	0    4     magic "KVRS"
//	4    2     format version, 7
//	6    1     kind: 1 manifest, 2 shard, 3 delta, 4 templates
//	7    1     reserved, 0
//	8    8     generation at which the part was written
//	16   4     length of the part in bytes, header and checksum included
//	20   4     reserved, 0
//	24   ...   body
//	L-8  8     XXH64 (seed 0) of bytes [0, L-8); the part's checksum
//
// A shard or delta body is a table:
//
//	24   1        shard bits S (delta: 0)
//	25   1        directory bits D
//	26   2        reserved, 0
//	28   4        shard index (delta: 0)
//	32   4        entry count N
//	36   4        extension length X, in 2-byte units
//	40   4(2^D+1) directory: the index of the first entry of each bucket, then N
//	     8N       entries: uint32 fingerprint, uint32 value
//	     2X       extension area
//
// For a block hash h, let x = h << S: its bucket is x >> (64-D) and its
// fingerprint is the uint32 x << D >> 32. Entries are sorted by hash, so
// fingerprints rise strictly within a bucket and a lookup is one directory
// read and a binary search of a few entries on one cache line. D is chosen
// for four to eight entries per bucket. A value with bit 31 clear holds up
// to two holder codes inline, the first in bits 0-15 and the second in
// bits 16-31, 0x7FFF meaning none; both none is the empty set, a delta's
// tombstone for a removed block. A value with bit 31 set is the offset, in
// 2-byte units, of a list in the extension area: a uint16 count (3 or
// more) followed by that many codes. Each list is written once per table
// and shared by every entry with the same holders. A holder code is
// slot<<1 | tier, tier 0 for GPU and 1 for CPU (offloaded); slots are
// below MaxEndpoints, and codes in a set rise strictly by slot.
//
// The manifest body:
//
//	24   8     creation time, Unix nanoseconds
//	32   1     shard bits S, 1 to 12
//	33   3     engine slot row count R, 24-bit
//	36   4     endpoint count E
//	40   4     name count M
//	44   4     name-id count I
//	48   4     string bytes T
//	52   4     bytes of prompt text a token stands for, float32; 0 unknown
//	56   24    delta reference
//	80   24    templates reference; all zero when there are none
//	104  24·2^S shard references, by index
//	     96E   endpoint rows, by slot
//	     8M    names: uint32 offset into strings, uint16 length,
//	           uint8 kind (0 model, 1 LoRA adapter), reserved byte
//	     2I    name ids (uint16); each endpoint's list is contiguous
//	     T     strings: addresses and names
//	     192R  engine slot rows, by endpoint slot and then engine slot id
//	     16P   pin rows, by key; P is the sum of the endpoint rows' pin counts
//
// A reference is the part's generation (uint64), checksum (uint64), size
// (uint32) and entry count (uint32). An endpoint row:
//
//	0    8     since: the generation at which the endpoint took the slot
//	8    4     address offset in strings
//	12   2     address length; 0 marks a vacant slot, all of whose bytes are 0
//	14   2     name count
//	16   4     index of its first name id
//	20   1     health: 0 unknown, 1 healthy, 2 draining, 3 unhealthy
//	21   1     the chat template its engine renders with, a prompt.Template;
//	           0 (plain) when not known
//	22   1     flags: bit 0, the index shows what gateways' routing reports
//	           name from the report on (the endpoint is approximate, or
//	           cachesync counts reported blocks as pending until its KV
//	           events confirm them); the other bits 0
//	23   1     pin count: the prompt groups pinned to the endpoint, 0 to 255
//	24   4     running requests
//	28   4     waiting requests
//	32   4     in-flight prefill tokens
//	36   4     age of the load figures (running, waiting, KV-cache usage)
//	           when the manifest was created, in milliseconds, plus one;
//	           0 when not known
//	40   4     KV-cache usage, float32 in [0, 1]
//	44   4     prefill throughput, tokens/s, float32; 0 unknown
//	48   4     text blocks the index holds for the endpoint, in any tier
//	52   4     the endpoint's cache capacity in text blocks; 0 unknown
//	56   4     TTFT samples of its latency model (shared/predict)
//	60   4     ITL samples
//	64   20    TTFT coefficients, 5 float32, each finite and >= 0
//	84   8     ITL coefficients, 2 float32, likewise
//	92   4     distinct prompt prefixes (first blocks) the index holds for
//	           the endpoint that gateways routed there recently
//
// An engine slot row, one for each sequence slot of an engine whose cache
// is a prompt per slot (llama.cpp's), so that a gateway can send a request
// to the slot holding its prefix, and knows when every slot holds one:
//
//	0    2     endpoint slot
//	2    2     the engine's slot id, below 256
//	4    1     flags: bit 0, processing a request when read
//	5    1     hashes kept K, 0 (no full block) to 22
//	6    2     reserved, 0
//	8    4     tokens its request may still generate, when processing
//	12   4     full blocks of the prompt it holds, at least the K-th depth
//	16   176   the prompt's chained block hash at each of the depths 1, 2,
//	           3, 4, 6, 8, 12, 16, 24, ... 1536, 2048 blocks (each about
//	           1.5 times the one before) up to the K-th, the rest 0
//
// A pin row, one for each prompt group cachesync's planner moved to an
// endpoint (GroupKey; the policy sends the group's requests there while
// the endpoint can take them), keys strictly rising, each endpoint's rows
// as many as its pin count:
//
//	0    8     the group's key: the chained hash of its first 16 blocks
//	8    2     endpoint slot
//	10   6     reserved, 0
//
// The templates body (the chat templates of models whose engines render
// with a template kvroute has no name for, an endpoint's template byte
// prompt.Custom; what gateways on chat_template auto render those models
// with):
//
//	24   4     template count N, at most 64
//	28   4     reserved, 0
//	32   ...   N templates sorted by model, each: the model name, the Jinja
//	           source, a uint32 count of special tokens and each one's
//	           name and value sorted by name; every string a uint32
//	           length and its bytes
//
// The part is written only when the templates change, so a fetcher copies
// it once, not every interval.
//
// The head, stored under Keys.Head, is "KVRH", the version (uint16), two
// reserved bytes, the manifest's generation and its checksum: 24 bytes.
//
// A bundle, the body of the HTTP response a fetcher gets from cachesync:
//
//	0    4     magic "KVRB"
//	4    2     format version, 7
//	6    2     reserved, 0
//	8    8     generation
//	16   8     since: the generation it brings a fetcher up from; 0 for full
//	24   4     part count
//	28   4     reserved, 0
//	32   ...   parts, each a uint32 length and the part; the manifest first
//	L-8  8     XXH64 of bytes [0, L-8)
//
// A diff bundle holds the manifest and every part whose generation is
// after since; a full one holds every part.
//
// # Design decisions
//
// Why a delta. A block hash is uniform over 64 bits, so engine churn (new
// blocks stored, old ones evicted) lands uniformly over the hash ranges:
// at 4M entries and 0.31% churn per 100 ms interval (12,800 changed
// entries; 64 engines each storing and evicting about 1,000 16-token
// blocks a second), every one of 256 shards changes every interval, and
// even with 4,096 shards about 3,900 do. Shards alone save nothing: measured, a
// worker copies 37.6 MB per refresh, the whole snapshot. The delta takes
// the changes instead, and the Builder rewrites ("compacts") the shards
// with the most changes whenever the delta passes its budget. A worker then
// copies per interval the delta (about budget entries) plus the compacted
// shards (growth*entries/(2*budget) entries), least at
// budget = sqrt(growth*entries/2); the Builder tracks the growth per Build
// and sizes the budget so. Measured at 4M entries, 256 shards, per worker
// per refresh: 1.6 MB at 0.10% churn, 2.9 MB at 0.31%, 5.0 MB at 0.95%,
// against 38 MB held. Lookups probe the delta first (a tombstone hides the
// shard's entry), then the shard.
//
// Shard count. With the delta, bytes per refresh barely depend on the
// shard count; what it sets is the size of each shared-data value, how
// lumpy the per-interval copy is, and the number of reads (host calls).
// Measured at 4M entries and 0.31% churn (BenchmarkChurn -args -sweep):
//
//	shards  reads/refresh  MB/refresh (max)  shard value  held
//	16        3.6          2.80 (3.74)       2.4 MB       38.0 MB
//	64        5.4          2.83 (3.20)       590 KB       38.5 MB
//	256      12.7          2.86 (2.95)       150 KB       39.0 MB
//	1024     41.4          2.91 (2.95)        38 KB       39.9 MB
//	4096    154.8          2.98 (3.01)        10 KB       40.4 MB
//
// 256 (DefaultShardBits) is where the peak stops falling: a dozen reads a
// refresh, 150 KB values that each get copies in one go, and a cold start
// of 259 reads. Fewer shards make compaction copies lumpy and values large;
// more add reads and directory overhead for no fewer bytes.
//
// Touching only what requests need. A 2,000-block prompt's walk looks up
// about 40 hashes, which fall into about 37 random shards of 256; a worker
// serving 20 requests in an interval touches nearly all of them. So a View
// refreshes every changed part or nothing, which also keeps it consistent:
// it never mixes parts of two generations, and a failed refresh leaves the
// previous snapshot in place. The saving for an idle worker is to skip
// Refresh until it has a request to serve.
//
// Fingerprints. An entry keeps the 32 bits of its hash after the S+D bits
// its shard and bucket imply (52 bits in all at 4M entries in 256 shards),
// not all 64: 8 bytes an entry with its value instead of 12, 9.0 bytes per
// entry overall. A probe for an absent hash meets a false entry with odds
// of about 2^-30 (a few entries per bucket, each matching one fingerprint
// in 2^32); a 40-lookup walk, about one in 10^7. Two indexed hashes equal in those bits become one
// entry holding the union of their holders: a rare false hit, never a
// missed one.
//
// Checking. Bytes enter shared data once, through the fetcher, so
// ParseBundle checks everything: framing, checksums, geometry, every
// entry's order and value, every holder list. Workers reread those bytes
// every interval, so View.Refresh checks framing, checksum, geometry and
// the directory (linear in buckets, not entries), and lookups stay inside
// the bytes whatever the entries hold. A torn, truncated or corrupt part
// fails its checksum or length and is never used.
//
// Slots and generations. An endpoint keeps its slot while listed; a freed
// slot goes to the next endpoint added. That is safe because removal
// rewrites every entry naming the slot into the delta (or a compacted
// shard) of the same generation, so no reader can see the old endpoint's
// blocks under the new one. A slot that changes hands gets a new since
// generation, which tells readers to reset state they keep per slot.
// Generations only rise: seed the first from the clock
// (BuilderConfig.FirstGeneration) so that a restarted cachesync does not
// reuse them; references compare the checksum as well, and
// Bundle.Complete refuses a diff that does not fit what the fetcher holds.
package snapshot
