"""Writes the msgpack event-batch fixtures of package kvevents with msgspec,
the encoder vLLM and SGLang publish with (pip install msgspec==0.22.0):

  python3 gen.py    # in this directory

Each fixture declares the engine's structs as one release declared them
(vllm/distributed/kv_events.py, sglang/srt/disaggregation/kv_events.py) and
encodes the same events with them. msgspec leaves fields holding their
default out of a map but writes every declared field into an array
(jcrist/msgspec#720). want.json holds what each fixture must decode to,
computed here from the Python objects: hashes as decimal strings of their
uint64 form (integers mod 2**64; bytes: the last 8, big-endian).
"""

import json
from typing import Any

import msgspec

Hash = int | bytes
U64 = 2**64


def schema(batch_array, event_array, stored_fields, removed_fields, batch_rank=True):
    """Builds event structs with the given fields (name, type, default or
    ... for none) in declaration order."""

    if batch_rank:
        class EventBatch(msgspec.Struct, array_like=batch_array, omit_defaults=True, gc=False):
            ts: float
            events: list[Any]
            data_parallel_rank: int | None = None
    else:
        class EventBatch(msgspec.Struct, array_like=batch_array, omit_defaults=True, gc=False):
            ts: float
            events: list[Any]

    class KVCacheEvent(msgspec.Struct, array_like=event_array, omit_defaults=True, gc=False, tag=True):
        pass

    def make(name, fields):
        ns = {"__annotations__": {}}
        for fname, ftype, default in fields:
            ns["__annotations__"][fname] = ftype
            if default is not ...:
                ns[fname] = default
        return type(name, (KVCacheEvent,), ns)

    BlockStored = make("BlockStored", stored_fields)
    BlockRemoved = make("BlockRemoved", removed_fields)
    AllBlocksCleared = make("AllBlocksCleared", [])
    return EventBatch, BlockStored, BlockRemoved, AllBlocksCleared


STORED_V08 = [("block_hashes", list[Hash], ...), ("parent_block_hash", Hash | None, ...),
              ("token_ids", list[int], ...), ("block_size", int, ...), ("lora_id", int | None, ...)]
STORED_V010 = STORED_V08 + [("medium", str | None, ...)]
STORED_LEGACY = STORED_V010 + [("lora_name", str | None, ...)]
STORED_CURRENT = STORED_LEGACY + [
    ("extra_keys", list[tuple[Any, ...] | None] | None, None), ("group_idx", int | None, None),
    ("kv_cache_spec_kind", str | None, None), ("kv_cache_spec_sliding_window", int | None, None)]
# vLLM 0.33 (first seen in forks): where a copy lives and which secondary
# offloading tier owns it, both part of a copy's identity on removal.
STORED_FORK = STORED_CURRENT + [("locality", str | None, None), ("ownership", str | None, None), ("session_id", str | None, None),
                                ("lookahead_token_ids", list[list[int]] | None, None)]
REMOVED_V08 = [("block_hashes", list[Hash], ...)]
REMOVED_LEGACY = REMOVED_V08 + [("medium", str | None, ...)]
REMOVED_CURRENT = REMOVED_LEGACY + [("group_idx", int | None, None)]
REMOVED_FORK = REMOVED_CURRENT + [("locality", str | None, None), ("ownership", str | None, None)]

BIG = 0xFEDCBA9876543210  # above 2**63: msgpack uint64
SMALL = 7  # a positive fixint


def sha(i):
    return bytes((i * 37 + k) % 256 for k in range(32))


def events(h):
    """The events every fixture encodes, as field dicts; h maps an int to
    the fixture's hash representation."""
    return [
        ("BlockStored", dict(block_hashes=[h(BIG), h(SMALL)], parent_block_hash=None, token_ids=list(range(100, 132)),
                             block_size=16, lora_id=None, medium="GPU", lora_name=None,
                             extra_keys=[None, None], group_idx=0, kv_cache_spec_kind="full_attention",
                             kv_cache_spec_sliding_window=None, locality="LOCAL")),
        ("BlockStored", dict(block_hashes=[h(3)], parent_block_hash=h(SMALL), token_ids=[0, 1, 4294967295, 5] * 4,
                             block_size=16, lora_id=2, medium="GPU", lora_name="sql-lora",
                             extra_keys=[("sql-lora", "salt-1")], group_idx=1, kv_cache_spec_kind="sliding_window",
                             kv_cache_spec_sliding_window=4096, locality="REMOTE", ownership="tier2", session_id="s")),
        ("BlockStored", dict(block_hashes=[h(4)], parent_block_hash=h(3), token_ids=[], block_size=16, lora_id=None,
                             medium="CPU", lora_name=None, extra_keys=[("mm-hash", ("img", 0), 3)])),
        ("BlockRemoved", dict(block_hashes=[h(BIG), h(4)], medium="GPU", group_idx=0, locality="LOCAL", ownership="x")),
        ("AllBlocksCleared", dict()),
    ]


def build(structs, evs):
    EventBatch, BlockStored, BlockRemoved, AllBlocksCleared = structs
    cls = {"BlockStored": BlockStored, "BlockRemoved": BlockRemoved, "AllBlocksCleared": AllBlocksCleared}
    out = []
    for tag, f in evs:
        c = cls[tag]
        out.append(c(**{k: v for k, v in f.items() if k in c.__struct_fields__}))
    return out


def u64(x):
    if isinstance(x, bytes):
        return str(int.from_bytes(x[-8:].rjust(8, b"\0"), "big"))
    return str(x % U64)


def want(structs, evs, ts, rank, token_pairs=False):
    """What the Go decoder must produce, from the Python objects."""
    out = []
    for e in build(structs, evs):
        tag = type(e).__name__
        f = {k: getattr(e, k) for k in e.__struct_fields__}
        w = {"kind": tag}
        if "block_hashes" in f:
            w["hashes"] = [u64(x) for x in f["block_hashes"]]
        if f.get("parent_block_hash") is not None:
            w["parent"] = u64(f["parent_block_hash"])
        if "token_ids" in f:
            w["tokens"] = f["token_ids"]
        w["block_size"] = f.get("block_size") or 0
        w["lora_id"] = f.get("lora_id") or 0
        w["lora_name"] = f.get("lora_name") or ""
        w["medium"] = f.get("medium") or ""
        if f.get("extra_keys") is not None:
            w["extra"] = [{"keys": [k for k in (x or ()) if isinstance(k, str)],
                           "other": sum(1 for k in (x or ()) if not isinstance(k, str))} for x in f["extra_keys"]]
        w["group"] = f.get("group_idx") or 0
        w["spec_kind"] = f.get("kv_cache_spec_kind") or ""
        w["locality"] = f.get("locality") or ""
        w["ownership"] = f.get("ownership") or ""
        out.append(w)
    return {"ts": ts, "dp_rank": rank, "events": out}


def main():
    ints = lambda i: i
    fixtures = {
        # name: (structs, hash form, dp rank)
        "vllm-map": (schema(True, False, STORED_CURRENT, REMOVED_CURRENT), ints, 0),
        "vllm-batch-map": (schema(False, False, STORED_CURRENT, REMOVED_CURRENT), ints, 3),
        "vllm-array": (schema(True, True, STORED_CURRENT, REMOVED_CURRENT), ints, 1),
        "vllm-array-bytes": (schema(True, True, STORED_CURRENT, REMOVED_CURRENT), sha, None),
        "vllm-map-bytes": (schema(True, False, STORED_CURRENT, REMOVED_CURRENT), sha, 0),
        "vllm-array-legacy": (schema(True, True, STORED_LEGACY, REMOVED_LEGACY), ints, 0),
        "vllm-array-v0.10": (schema(True, True, STORED_V010, REMOVED_LEGACY), ints, None),
        "vllm-array-fork": (schema(True, True, STORED_FORK, REMOVED_FORK), ints, 2),
        "vllm-map-fork": (schema(True, False, STORED_FORK, REMOVED_FORK), ints, 2),
        "sglang-v0.4": (schema(True, True, STORED_V08, REMOVED_V08, batch_rank=False), ints, None),
    }
    wants = {}
    enc = msgspec.msgpack.Encoder()
    for name, (structs, h, rank) in fixtures.items():
        evs = events(h)
        EventBatch = structs[0]
        kw = {"data_parallel_rank": rank} if "data_parallel_rank" in EventBatch.__struct_fields__ else {}
        batch = EventBatch(ts=1789095808.5, events=build(structs, evs), **kw)
        with open(name + ".msgpack", "wb") as f:
            f.write(enc.encode(batch))
        wants[name] = want(structs, evs, 1789095808.5, rank if rank is not None else -1)

    # SGLang with EAGLE speculative decoding sends token pairs; msgspec has
    # no struct for that here, so the payload is written from plain lists.
    pairs = [[100 + i, 101 + i] for i in range(16)]
    raw = [1789095808.5, [["BlockStored", [SMALL], None, pairs, 16, None, "GPU", None, None]], 0]
    with open("sglang-pairs.msgpack", "wb") as f:
        f.write(enc.encode(raw))
    wants["sglang-pairs"] = {"ts": 1789095808.5, "dp_rank": 0, "events": [{
        "kind": "BlockStored", "hashes": [str(SMALL)], "tokens": list(range(100, 117)), "block_size": 16, "lora_id": 0,
        "lora_name": "", "medium": "GPU", "group": 0, "spec_kind": "", "locality": "", "ownership": ""}]}

    with open("want.json", "w") as f:
        json.dump(wants, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
