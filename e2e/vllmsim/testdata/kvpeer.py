"""A libzmq peer for the simulator's KV events, as a vLLM consumer sees them.

  kvpeer.py sub ENDPOINT TOPIC ENCODING SEED   SUB (pyzmq, libzmq) until stdin closes
  kvpeer.py replay ENDPOINT START ENCODING     DEALER: one replay request, then exit

Every message received is printed as one JSON line: the frames, the payload
decoded with msgpack, whether msgspec, decoding into vLLM's own event structs
(vllm/distributed/kv_events.py) and encoding them again, gives back the very
same bytes, and for BlockStored events whether each block hash equals vLLM's
sha256_cbor (cbor2 + hashlib, as vllm/utils/hashing.py computes it).
ENCODING is the simulator's: map, array, array-legacy, or batch-map.
"""

import hashlib
import json
import sys
import threading
from typing import Any

try:
    import cbor2
    import msgpack
    import msgspec
    import zmq
except ImportError as e:  # the Go test turns this into "run make setup"
    print(f"kvpeer: {e}; install e2e/requirements.txt", file=sys.stderr)
    sys.exit(3)

Hash = int | bytes


def schema(encoding: str):
    """vLLM's event structs for one wire encoding."""
    batch_array = encoding != "batch-map"
    event_array = encoding in ("array", "array-legacy")

    class EventBatch(msgspec.Struct, array_like=batch_array, omit_defaults=True, gc=False):
        ts: float
        events: list[Any]
        data_parallel_rank: int | None = None

    class KVCacheEvent(msgspec.Struct, array_like=event_array, omit_defaults=True, gc=False, tag=True):
        pass

    if encoding == "array-legacy":

        class BlockStored(KVCacheEvent):
            block_hashes: list[Hash]
            parent_block_hash: Hash | None
            token_ids: list[int]
            block_size: int
            lora_id: int | None
            medium: str | None
            lora_name: str | None

        class BlockRemoved(KVCacheEvent):
            block_hashes: list[Hash]
            medium: str | None

    else:

        class BlockStored(KVCacheEvent):
            block_hashes: list[Hash]
            parent_block_hash: Hash | None
            token_ids: list[int]
            block_size: int
            lora_id: int | None
            medium: str | None
            lora_name: str | None
            extra_keys: list[tuple[Any, ...] | None] | None = None
            group_idx: int | None = None
            kv_cache_spec_kind: str | None = None
            kv_cache_spec_sliding_window: int | None = None

        class BlockRemoved(KVCacheEvent):
            block_hashes: list[Hash]
            medium: str | None
            group_idx: int | None = None

    class AllBlocksCleared(KVCacheEvent):
        pass

    class KVEventBatch(EventBatch):
        events: list[BlockStored | BlockRemoved | AllBlocksCleared]

    return KVEventBatch


def jsonable(v):
    if isinstance(v, bytes):
        return {"hex": v.hex()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    return v


class HashChecker:
    """Recomputes block hashes as vLLM's sha256_cbor does, following chains
    across events by remembering the full hash behind each published one."""

    def __init__(self, seed: str):
        self.none_hash = hashlib.sha256(cbor2.dumps(seed, canonical=True)).digest()
        self.full = {}

    @staticmethod
    def key(h: Hash):
        return h if isinstance(h, int) else bytes(h)

    def check(self, ev: dict) -> list:
        hashes, tokens = ev["block_hashes"], ev["token_ids"]
        if not tokens:  # CPU-tier stores carry no tokens
            return []
        bs = ev["block_size"]
        extra = ev.get("extra_keys") or [None] * len(hashes)
        parent = ev["parent_block_hash"]
        prev = self.none_hash if parent is None else self.full.get(self.key(parent))
        ok = []
        for i, h in enumerate(hashes):
            if prev is None:
                ok.append(None)  # parent seen before we subscribed
                continue
            x = extra[i]
            full = hashlib.sha256(
                cbor2.dumps((prev, tuple(tokens[i * bs:(i + 1) * bs]), tuple(x) if x is not None else None), canonical=True)
            ).digest()
            published = int.from_bytes(full, "big") & ((1 << 64) - 1) if isinstance(h, int) else full
            ok.append(published == (h if isinstance(h, int) else bytes(h)))
            self.full[self.key(h)] = full
            prev = full
        return ok


def report(frames, batch_type, checker=None):
    out = {"frames": len(frames)}
    if len(frames) == 3:
        topic, seq, payload = frames
        out["topic"] = topic.decode()
    else:  # replay reply without the topic frame
        seq, payload = frames[-2], frames[-1]
    out["seq"] = int.from_bytes(seq, "big", signed=True)
    if payload:
        decoded = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        out["batch"] = jsonable(decoded)
        typed = msgspec.msgpack.decode(payload, type=batch_type)
        out["msgspec_same_bytes"] = msgspec.msgpack.encode(typed) == payload
        if checker is not None:
            events = decoded["events"] if isinstance(decoded, dict) else decoded[1]
            checks = []
            for ev in events:
                if isinstance(ev, list):
                    if ev[0] != "BlockStored":
                        continue
                    names = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys"]
                    ev = dict(zip(names, ev[1:]))
                elif ev.get("type") != "BlockStored":
                    continue
                checks.extend(checker.check(ev))
            out["hash_ok"] = checks
    print(json.dumps(out), flush=True)


def sub(endpoint, topic, encoding, seed):
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, topic.encode())
    s.connect(endpoint)
    batch_type = schema(encoding)
    checker = HashChecker(seed)
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    print(json.dumps({"ready": True}), flush=True)
    while not done.is_set():
        if s.poll(100):
            report(s.recv_multipart(), batch_type, checker)
    s.close(linger=0)


def replay(endpoint, start, encoding):
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.connect(endpoint)
    s.send_multipart([b"", int(start).to_bytes(8, "big")])
    batch_type = schema(encoding)
    while True:
        if not s.poll(10000):
            print(json.dumps({"error": "replay timed out"}), flush=True)
            sys.exit(1)
        frames = s.recv_multipart()
        if frames[0] != b"":
            print(json.dumps({"error": "missing empty delimiter frame"}), flush=True)
            sys.exit(1)
        frames = frames[1:]
        report(frames, batch_type)
        if frames[-2] == b"\xff" * 8:
            break
    s.close(linger=0)


if __name__ == "__main__":
    if sys.argv[1] == "sub":
        sub(*sys.argv[2:6])
    else:
        replay(*sys.argv[2:5])
