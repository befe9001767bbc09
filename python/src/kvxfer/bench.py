# SPDX-License-Identifier: Apache-2.0
"""Numbers for the Python binding (run with Debian's /usr/bin/python3):

  python3 -m kvxfer.bench compare [--perf build/bench/kvxfer-perf] [--requests 6] [-m write] [-t tcp]
      Replays the same trace requests (same model layout, block size, pool, concurrency, mode,
      transport, back to back) twice in one run: first with the C driver `kvxfer-perf trace
      --local --no-verify`, then driven from Python through kvxfer.Engine (producer in a child
      process, consumer here; WRITE: remote_blocks sent by a kvxfer.Notifier, as the vLLM
      connector's scheduler half sends it). Prints both throughputs for the same bytes and
      their ratio.
  python3 -m kvxfer.bench connector [--requests 2] [-m write] [--standin python/tests]
      A producer and a consumer vLLM instance (the tests' stand-in, one process each) driven
      through KvxferConnector with the model's KV geometry, one trace request at a time (the
      bench plays the proxy); prints bytes, wall time, per-request latency, then the same
      requests with `kvxfer-perf trace --local` at concurrency 1 and the ratio. The connector
      run includes the stand-in's per-block "compute" (a pattern fill) and its step loop.
  python3 -m kvxfer.bench overhead [--calls 2000]
      Per-call cost, in microseconds, of submitting (read / serve / announce / write_begin +
      layer_ready + seal) and of completion polling (empty poll, poll per completion in
      bursts, wait(0) on the eventfd), on two tcp engines in this process.

Results are ratios and per-call costs on this machine in this run; nothing here asserts a
speed.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import multiprocessing as mp
import os
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from .engine import CplKind, CplStatus, Engine, EngineParams, LayerSpec, Mode, Notifier, Peer, Role

REPO = Path(__file__).resolve().parents[3]  # python/src/kvxfer -> repository root (source tree runs)


# ---------------------------------------------------------------- trace and model
def load_model(csv_path: Path, name: str) -> dict[str, int]:
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            if row["model"] == name:
                return {"layers": int(row["num_layers"]), "heads": int(row["num_kv_heads"] or 0),
                        "head_dim": int(row["head_dim"] or 0), "mla": int(row["mla_latent_dim"] or 0)}
    raise SystemExit(f"--model: {name} not in {csv_path}")


def load_trace(path: Path, n: int, block: int) -> list[int]:
    """Blocks per request: ceil(input_length / block) for the first n Mooncake JSONL lines."""
    out = []
    with open(path) as f:
        for line in f:
            if n and len(out) >= n:
                break
            if line.strip():
                out.append(math.ceil(json.loads(line)["input_length"] / block))
    return out


def make_layers(model: dict[str, int], pool: int, block: int, fill: bool) -> tuple[list[Any], LayerSpec]:
    import torch
    if model["mla"]:
        shape: tuple[int, ...] = (pool, block, model["mla"])
        spec = LayerSpec(block, 1, model["mla"], True)
    else:
        shape = (2, pool, block, model["heads"], model["head_dim"])
        spec = LayerSpec(block, model["heads"], model["head_dim"])
    layers = []
    for i in range(model["layers"]):
        t = torch.empty(shape, dtype=torch.int16)  # 2-byte elements, as bf16
        t.fill_(i + 1 if fill else 0)
        layers.append(t)
    return layers, spec


def engine_for(role: Role, mode: Mode, transport: str, pool: int, conc: int) -> Engine:
    return Engine(EngineParams(role=role, mode=mode, transport=transport, handshake_port=0, notify_port=0,
                               max_transfers=max(8, 2 * conc), max_blocks=pool, transfer_timeout_ms=120000,
                               defer_timeout_ms=180000))


# ---------------------------------------------------------------- Python-driven replay
def _producer(conn: Any, model: dict[str, int], pool: int, block: int, mode: Mode, transport: str,
              conc: int, fill: bool) -> None:
    """Child: the producer engine; executes the parent's serve/write commands. With fill, the
    producer first writes every block it will send, layer by layer (kvxfer-perf trace fills
    them with a hashed pattern, which costs more per byte than this constant fill)."""
    import torch
    layers, spec = make_layers(model, pool, block, fill=True)
    e = engine_for(Role.PRODUCER, mode, transport, pool, conc)
    for i, t in enumerate(layers):
        e.register_tensor(f"layer.{i}", t, spec)
    e.start()
    conn.send(e.ports())
    sel = selectors.DefaultSelector()
    sel.register(conn.fileno(), selectors.EVENT_READ, "cmd")
    sel.register(e.fileno(), selectors.EVENT_READ, "cpl")
    nl = len(layers)
    while True:
        for key, _ in sel.select():
            if key.data == "cpl":
                for c in e.poll(64):
                    if c[1] == CplKind.BLOCKS_RELEASED:
                        conn.send(("released", c[0]))
                    elif c[2] == CplStatus.DONE:
                        conn.send(("done", c[0], c[4]))
                continue
            cmd = conn.recv()
            if cmd[0] == "stop":
                e.close()
                conn.send(("stopped",))
                return
            if cmd[0] == "peer":
                peer = Peer(*cmd[1])
            elif cmd[0] in ("write", "serve"):
                tid, blocks = cmd[1], cmd[2]
                idx = torch.tensor(blocks, dtype=torch.long)
                if cmd[0] == "serve":  # READ: the prefill computed every layer first
                    if fill:
                        for layer, t in enumerate(layers):
                            t.index_fill_(0 if model["mla"] else 1, idx, (layer + len(blocks)) % 32749)
                    e.serve(tid, blocks)
                    conn.send(("served", tid))
                    continue
                e.write_begin(tid, blocks, peer)
                for layer, t in enumerate(layers):
                    if fill:  # "compute" the layer: write every byte that will move, like C's fill
                        t.index_fill_(0 if model["mla"] else 1, idx, (layer + len(blocks)) % 32749)
                    e.layer_ready(tid, layer)
                e.seal(tid, nl)


def replay_python(model: dict[str, int], reqs: list[int], pool: int, block: int, mode: Mode, transport: str,
                  conc: int, fill: bool) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_producer, args=(child, model, pool, block, mode, transport, conc, fill),
                       daemon=True)
    proc.start()
    child.close()  # the producer's death then reads as EOF here
    layers, spec = make_layers(model, pool, block, fill=False)
    d = engine_for(Role.CONSUMER, mode, transport, pool, conc)
    for i, t in enumerate(layers):
        d.register_tensor(f"layer.{i}", t, spec)
    d.start()
    if not conn.poll(300):
        raise SystemExit("producer did not start")
    p_peer = Peer("127.0.0.1", *conn.recv())
    conn.send(("peer", tuple(Peer("127.0.0.1", *d.ports()))))
    # WRITE: remote_blocks comes from a Notifier, as the connector's scheduler half sends it;
    # the consumer engine only awaits write_done (announce notified=True).
    nt = Notifier(EngineParams(role=Role.CONSUMER, mode=Mode.WRITE, max_blocks=pool)) if mode == Mode.WRITE else None
    free_d, free_p = list(range(pool)), list(range(pool))
    held: dict[str, tuple[list[int], list[int]]] = {}
    inflight: set[str] = set()
    pending = list(enumerate(reqs))
    moved, p_moved, failures = 0, 0, 0
    sel = selectors.DefaultSelector()
    sel.register(conn.fileno(), selectors.EVENT_READ, "p")
    sel.register(d.fileno(), selectors.EVENT_READ, "d")
    t0 = time.perf_counter()
    while pending or inflight or len(free_p) < pool:
        while pending and len(inflight) < conc and min(len(free_d), len(free_p)) >= pending[0][1]:
            i, n = pending.pop(0)
            tid = f"tx-py-{i}"
            db, pb = free_d[:n], free_p[:n]
            del free_d[:n], free_p[:n]
            held[tid] = (db, pb)
            inflight.add(tid)
            if mode == Mode.WRITE:
                nt.announce(tid, db, p_peer)
                d.announce(tid, db, p_peer, True)
                conn.send(("write", tid, pb))
            else:  # READ: D reads once P served (after its prefill wrote the blocks)
                conn.send(("serve", tid, pb))
        events = sel.select(300)
        if not events and not proc.is_alive():
            raise SystemExit(f"producer exited ({proc.exitcode})")
        for key, _ in events:
            if key.data == "p":
                msg = conn.recv()
                if msg[0] == "released":
                    free_p.extend(held[msg[1]][1])
                elif msg[0] == "served":
                    db, pb = held[msg[1]]
                    d.read(msg[1], db, pb, p_peer)
                else:
                    p_moved += msg[2]
            else:
                for c in d.poll(64):
                    if c[1] != CplKind.TRANSFER:
                        continue
                    inflight.discard(c[0])
                    free_d.extend(held[c[0]][0])
                    if c[2] == CplStatus.DONE:
                        moved += c[4]
                    else:
                        failures += 1
    wall = time.perf_counter() - t0
    conn.send(("stop",))
    conn.poll(60)
    proc.join(60)
    if nt is not None:
        nt.close()
    d.close()
    if mode == Mode.WRITE:  # the producer pushed: its completions count the bytes
        moved = p_moved
    return {"wall_s": wall, "bytes": moved, "failures": failures, "gbps": moved / wall / 1e9}


def run_c(a: argparse.Namespace, csv_path: Path, trace: Path, pool: int, conc: int) -> Optional[dict[str, Any]]:
    """`kvxfer-perf trace --local` over the same requests; its JSON summary (None: it failed)."""
    with tempfile.TemporaryDirectory() as tmp:
        js = Path(tmp) / "c.json"
        cmd = [a.perf, "trace", "--local", "--no-verify", "--quiet", "--speed", "0", "--model", a.model,
               "--models-csv", str(csv_path), "--trace", str(trace), "--requests", str(a.requests),
               "--block-size", str(a.block_size), "--concurrency", str(conc), "-m", a.mode,
               "-t", a.transport, "--pool-blocks", str(pool), "--json", str(js)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            print(r.stdout, r.stderr, file=sys.stderr)
            return None
        return dict(json.loads(js.read_text())["summary"])


def cmd_connector(a: argparse.Namespace) -> int:
    """A producer and a consumer instance driven through KvxferConnector by the tests' vLLM
    stand-in (python/tests: vllm_standin.py, standin_proc.py; one process per instance, TP 1,
    tcp), with the model's KV geometry, one trace request at a time, the test playing the
    proxy; then `kvxfer-perf trace --local` over the same requests at concurrency 1."""
    csv_path = Path(a.models_csv or REPO / "bench/data/models.csv")
    trace = Path(a.trace or REPO / "bench/data/traces/mooncake_fast25_conversation_trace.head3MB.jsonl")
    model = load_model(csv_path, a.model)
    reqs = load_trace(trace, a.requests, a.block_size)
    pool = math.ceil(max(reqs) * 1.25)
    layout = "mla" if model["mla"] else "split"
    os.environ.update({"KVX_STANDIN_LAYERS": str(model["layers"]), "KVX_STANDIN_BLOCKS": str(pool),
                       "KVX_STANDIN_BLOCK_SIZE": str(a.block_size), "KVX_STANDIN_HEADS": str(model["heads"] or 1),
                       "KVX_STANDIN_HEAD_DIM": str(model["head_dim"] or 1),
                       "KVX_STANDIN_MLA_DIM": str(model["mla"] or 1)})
    sys.path.insert(0, str(Path(a.standin)))
    from standin_proc import InstanceProc, d_params, p_params, proxy_ids  # the stand-in (tests)
    read = a.mode == "read"
    extra = {"transfer_timeout": 120, "defer_timeout": 300, "kvxfer_transport": a.transport}
    p = InstanceProc("kv_producer", read, layout, extra)
    d = InstanceProc("kv_consumer", read, layout, extra)
    mover = p if not read else d
    try:
        before = mover.call("state", "")["stats"]
        lat_ms = []
        t_all = time.perf_counter()
        for i, n in enumerate(reqs):
            rid, tid = proxy_ids(p, d)
            t0 = time.perf_counter()
            p.call("add", dict(request_id=rid, prompt_len=n * a.block_size, params=p_params(tid), seed=i + 1))
            if read:  # P's prefill first; the proxy copies its params into D's request
                p.call("step_until", ("finished", rid))
                fp = p.call("finish_params", rid)
                dp = dict(d_params(fp["transfer_id"]), remote_engine_id=fp["remote_engine_id"],
                          remote_block_ids=fp["remote_block_ids"], remote_dp_rank=fp["remote_dp_rank"])
                d.call("add", dict(request_id=rid, prompt_len=n * a.block_size, params=dp, seed=i + 1))
                d.call("step_until", ("loaded", rid))
                p.call("step_until", ("freed", rid))
            else:  # P and D at once: D's scheduler sends remote_blocks, P pushes per layer
                d.call("add", dict(request_id=rid, prompt_len=n * a.block_size, params=d_params(tid), seed=i + 1))
                d.call("step_until", ("waiting_remote", rid))
                p.call("step_until", ("freed", rid))
                d.call("step_until", ("loaded", rid))
            d.call("step_until", ("settled", rid))
            lat_ms.append((time.perf_counter() - t0) * 1e3)
            d.call("abort", rid)  # the decode request ends (no decoding here): its blocks go back
        wall = time.perf_counter() - t_all
        after = mover.call("state", "")["stats"]
        ds = d.call("state", "")["stats"]
    finally:
        d.close()
        p.close()
    moved = after["bytes"] - before["bytes"]
    c = run_c(a, csv_path, trace, pool, 1)
    if c is None:
        return 1
    res = {"model": a.model, "mode": a.mode, "transport": a.transport, "layout": layout, "requests": len(reqs),
           "blocks": sum(reqs), "pool_blocks": pool, "connector_bytes": moved, "connector_wall_s": wall,
           "connector_gbps": moved / wall / 1e9, "connector_request_ms": [round(x, 1) for x in lat_ms],
           "connector_failures": ds.get("transfers_failed", 0), "c_bytes": c["bytes"], "c_wall_s": c["wall_s"],
           "c_gbps": c["throughput_gbps"],
           "ratio_connector_over_c": moved / wall / 1e9 / c["throughput_gbps"] if c["throughput_gbps"] else None}
    print(json.dumps(res, indent=1))
    if moved != c["bytes"] or res["connector_failures"]:
        print("connector: the connector pair did not move the same bytes", file=sys.stderr)
        return 1
    return 0


def cmd_compare(a: argparse.Namespace) -> int:
    csv_path = Path(a.models_csv or REPO / "bench/data/models.csv")
    trace = Path(a.trace or REPO / "bench/data/traces/mooncake_fast25_conversation_trace.head3MB.jsonl")
    model = load_model(csv_path, a.model)
    reqs = load_trace(trace, a.requests, a.block_size)
    pool = math.ceil(max(reqs) * 1.25)
    mode = Mode.READ if a.mode == "read" else Mode.WRITE
    c = run_c(a, csv_path, trace, pool, a.concurrency)
    if c is None:
        return 1
    py = replay_python(model, reqs, pool, a.block_size, mode, a.transport, a.concurrency, a.fill)
    res = {"model": a.model, "mode": a.mode, "transport": a.transport, "requests": len(reqs), "blocks": sum(reqs),
           "pool_blocks": pool, "c_bytes": c["bytes"], "c_wall_s": c["wall_s"], "c_gbps": c["throughput_gbps"],
           "py_bytes": py["bytes"], "py_wall_s": py["wall_s"], "py_gbps": py["gbps"], "py_failures": py["failures"],
           "py_producer_fill": a.fill, "ratio_py_over_c": py["gbps"] / c["throughput_gbps"] if c["throughput_gbps"] else None}
    print(json.dumps(res, indent=1))
    if py["bytes"] != c["bytes"] or py["failures"]:
        print("compare: the Python replay did not move the same bytes", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------- per-call overhead
def cmd_overhead(a: argparse.Namespace) -> int:
    import torch
    nb = 64
    shape = (2, nb, 16, 2, 64)
    spec = LayerSpec(16, 2, 64)
    res: dict[str, float] = {}

    def pair(mode: Mode) -> tuple[Engine, Engine]:
        p = Engine(EngineParams(role=Role.PRODUCER, mode=mode, transport="tcp", handshake_port=0, notify_port=0,
                                max_transfers=a.calls + 16, max_blocks=nb))
        d = Engine(EngineParams(role=Role.CONSUMER, mode=mode, transport="tcp", handshake_port=0, notify_port=0,
                                max_transfers=a.calls + 16, max_blocks=nb))
        for e in (p, d):
            for i in range(2):
                e.register_tensor(f"l{i}", torch.zeros(shape, dtype=torch.int16), spec)
            e.start()
        return p, d

    def drain(e: Engine, want: int, kind: int) -> tuple[int, float, int]:
        """Collect `want` completions of `kind`; returns (got, seconds inside poll(), calls)."""
        got, spent, calls = 0, 0.0, 0
        while got < want:
            if not e.wait(120):
                raise SystemExit("overhead: completions stopped arriving")
            t = time.perf_counter()
            out = e.poll(64)
            spent += time.perf_counter() - t
            calls += 1
            got += sum(1 for c in out if c[1] == kind)
        return got, spent, calls

    n = a.calls
    # READ: serve + read submissions, then poll
    p, d = pair(Mode.READ)
    pp = Peer("127.0.0.1", *p.ports())
    t = time.perf_counter()
    for i in range(n):
        p.serve(f"tx-{i}", [i % nb])
    res["serve_us"] = (time.perf_counter() - t) / n * 1e6
    t = time.perf_counter()
    for i in range(n):
        d.read(f"tx-{i}", [i % nb], [i % nb], pp)
    res["read_us"] = (time.perf_counter() - t) / n * 1e6
    got, spent, calls = drain(d, n, CplKind.TRANSFER)
    res["poll_us_per_call_nonempty"] = spent / calls * 1e6
    res["poll_us_per_completion"] = spent / got * 1e6
    res["completions_per_poll"] = got / calls
    drain(p, n, CplKind.BLOCKS_RELEASED)
    m = 100000
    t = time.perf_counter()
    for _ in range(m):
        d.poll(64)
    res["poll_us_empty"] = (time.perf_counter() - t) / m * 1e6
    t = time.perf_counter()
    for _ in range(m):
        d.wait(0)
    res["wait0_us"] = (time.perf_counter() - t) / m * 1e6
    p.close()
    d.close()
    # WRITE: announce, write_begin + 2 x layer_ready + seal
    p, d = pair(Mode.WRITE)
    pp, dp = Peer("127.0.0.1", *p.ports()), Peer("127.0.0.1", *d.ports())
    t = time.perf_counter()
    for i in range(n):
        d.announce(f"tx-{i}", [i % nb], pp)
    res["announce_us"] = (time.perf_counter() - t) / n * 1e6
    tb = tl = ts = 0.0
    for i in range(n):
        tid = f"tx-{i}"
        t = time.perf_counter()
        p.write_begin(tid, [i % nb], dp)
        t2 = time.perf_counter()
        p.layer_ready(tid, 0)
        p.layer_ready(tid, 1)
        t3 = time.perf_counter()
        p.seal(tid, 2)
        ts += time.perf_counter() - t3
        tl += t3 - t2
        tb += t2 - t
    res["write_begin_us"] = tb / n * 1e6
    res["layer_ready_us"] = tl / (2 * n) * 1e6
    res["seal_us"] = ts / n * 1e6
    drain(d, n, CplKind.TRANSFER)
    drain(p, n, CplKind.BLOCKS_RELEASED)
    p.close()
    d.close()
    print(json.dumps({k: round(v, 3) for k, v in res.items()}, indent=1))
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m kvxfer.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare", help="Python-driven vs C kvxfer-perf trace, same bytes, same run")
    c.add_argument("--perf", default=str(REPO / "build/bench/kvxfer-perf"), help="kvxfer-perf binary")
    c.add_argument("--model", default="Llama-3.1-8B")
    c.add_argument("--models-csv")
    c.add_argument("--trace")
    c.add_argument("--requests", type=int, default=6)
    c.add_argument("--block-size", type=int, default=16)
    c.add_argument("--concurrency", type=int, default=2)
    c.add_argument("-m", "--mode", choices=["read", "write"], default="write")
    c.add_argument("-t", "--transport", choices=["tcp", "shm", "auto", "verbs"], default="tcp")
    c.add_argument("--no-fill", dest="fill", action="store_false",
                   help="Python producer sends its blocks without writing them per request first")
    k = sub.add_parser("connector", help="a producer/consumer pair driven through KvxferConnector (vLLM stand-in) "
                       "vs C kvxfer-perf trace, same requests")
    k.add_argument("--perf", default=str(REPO / "build/bench/kvxfer-perf"), help="kvxfer-perf binary")
    k.add_argument("--standin", default=str(REPO / "python/tests"), help="directory of vllm_standin.py")
    k.add_argument("--model", default="Llama-3.1-8B")
    k.add_argument("--models-csv")
    k.add_argument("--trace")
    k.add_argument("--requests", type=int, default=2)
    k.add_argument("--block-size", type=int, default=16)
    k.add_argument("-m", "--mode", choices=["read", "write"], default="write")
    k.add_argument("-t", "--transport", choices=["tcp", "shm", "auto"], default="tcp")
    o = sub.add_parser("overhead", help="per-call cost of submit and completion polling, us")
    o.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args(argv)
    if a.cmd in ("compare", "connector") and not os.access(a.perf, os.X_OK):
        ap.error(f"--perf: {a.perf} is not an executable kvxfer-perf (build it with CMake)")
    return {"compare": cmd_compare, "connector": cmd_connector, "overhead": cmd_overhead}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
