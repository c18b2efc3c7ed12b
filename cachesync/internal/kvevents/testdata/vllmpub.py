"""A stand-in for vLLM's ZmqEventPublisher on libzmq (pyzmq) and msgspec,
for package kvevents' interop test. It follows vllm/distributed/kv_events.py:
a PUB socket sends [topic, seq (8 bytes, big-endian), msgspec payload], a
ROUTER socket, polled in the same loop, replays buffered batches from a
requested seq and then the end marker (seq -1, empty payload).

  vllmpub.py bind|connect:ENDPOINT topic|notopic

bind: the PUB binds a free loopback port; connect: it connects to ENDPOINT
(the subscriber binds). topic: replay replies carry the topic frame (vLLM
>= 0.26), notopic: they do not. The first line printed is JSON with the
endpoints; then stdin takes commands, each answered with a JSON line:

  publish N   publish N batches
  drop N      take N sequence numbers and buffer the batches, sending none
              (as a full high-water mark drops them)
"""

import json
import select
import sys
from collections import deque
from typing import Any

try:
    import msgspec
    import zmq
except ImportError as e:
    print(f"vllmpub: {e}; install e2e/requirements.txt", file=sys.stderr)
    sys.exit(3)


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


END_SEQ = (-1).to_bytes(8, "big", signed=True)
TOPIC = b"kv@py"


def main():
    mode, shape = sys.argv[1], sys.argv[2]
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.set_hwm(100_000)
    if mode == "bind":
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        pub_ep = f"tcp://127.0.0.1:{port}"
    else:
        pub_ep = mode.split(":", 1)[1]
        pub.connect(pub_ep)
    router = ctx.socket(zmq.ROUTER)
    rport = router.bind_to_random_port("tcp://127.0.0.1")
    print(json.dumps({"pub": pub_ep, "replay": f"tcp://127.0.0.1:{rport}"}), flush=True)

    enc = msgspec.msgpack.Encoder()
    buffer = deque(maxlen=10_000)
    seq = 0

    def batch(s):
        ev = BlockStored(block_hashes=[s], parent_block_hash=None, token_ids=[1, 2], block_size=2,
                         lora_id=None, medium="GPU", lora_name=None, group_idx=0, kv_cache_spec_kind="full_attention")
        return enc.encode(EventBatch(ts=1.0, events=[ev], data_parallel_rank=0))

    while True:
        if router.poll(0):
            frame = router.recv_multipart()
            if len(frame) == 3:
                client, _, start = frame
                start = int.from_bytes(start, "big")
                for s, payload in buffer:
                    if s >= start:
                        seq_bytes = s.to_bytes(8, "big")
                        if shape == "topic":
                            router.send_multipart((client, b"", TOPIC, seq_bytes, payload))
                        else:
                            router.send_multipart((client, b"", seq_bytes, payload))
                if shape == "topic":
                    router.send_multipart((client, b"", TOPIC, END_SEQ, b""))
                else:
                    router.send_multipart((client, b"", END_SEQ, b""))
        ready, _, _ = select.select([sys.stdin], [], [], 0.01)
        if not ready:
            continue
        line = sys.stdin.readline()
        if not line:
            return
        cmd, n = line.split()
        for _ in range(int(n)):
            payload = batch(seq)
            buffer.append((seq, payload))
            if cmd == "publish":
                pub.send_multipart((TOPIC, seq.to_bytes(8, "big"), payload))
            seq += 1
        print(json.dumps({"ok": line.strip(), "seq": seq}), flush=True)


if __name__ == "__main__":
    main()
