"""NIXL notification experiment: latency post->notif at the target, ordering vs data, who sends it."""
import multiprocessing as mp, os, sys, time, statistics, json
import numpy as np
BB = 1 << 20

def side(conn, role, nblocks, env):
    os.environ.update(env)
    from kvtier.dataplane.nixl_agent import NixlBlockAgent
    region = np.zeros((nblocks, BB), dtype=np.uint8)
    ag = NixlBlockAgent(f"notif-{role}-{os.getpid()}", region, layout="x")
    conn.send(ag.descriptor())
    ag.add_peer("peer", conn.recv())
    r64 = region.view(np.uint64)
    while True:
        cmd = conn.recv()
        if cmd is None: break
        op = cmd["op"]
        if op == "write":
            n, tag, delay = cmd["n"], cmd["tag"], cmd["poll_delay"]
            r64[:n] = np.uint64(tag)
            t0 = time.perf_counter()
            xid = ag.post_write("peer", list(range(n)), list(range(n)), notif=b"t%d" % tag)
            if delay: time.sleep(delay)
            while True:
                evs = ag.poll()
                if any(getattr(e, "xfer_id", None) == xid for e in evs):
                    break
                time.sleep(0.00005)
            conn.send({"post": t0, "done": time.perf_counter()})
        elif op == "recv":
            n, tag, sleep = cmd["n"], cmd["tag"], cmd["sleep"]
            conn.send("ready")
            want = b"t%d" % tag
            while True:
                got = [x for x in ag.progress() if x.message == want]
                if got: break
                if sleep: time.sleep(sleep)
            t = time.perf_counter()
            # ordering: every byte of the WRITE must be there when its notification is
            ok = bool((r64[:n] == np.uint64(tag)).all())
            conn.send({"notif": t, "ok": ok})
    ag.close()

def pair(env, nblocks):
    ctx = mp.get_context("spawn")
    cs = []
    for role in ("p", "c"):
        a, b = ctx.Pipe(); pr = ctx.Process(target=side, args=(b, role, nblocks, env)); pr.start(); cs.append((a, pr))
    (pc, _), (cc, _) = cs
    dp, dc = pc.recv(), cc.recv(); pc.send(dc); cc.send(dp)
    return cs

def run(env, sizes, reps, poll_delay=0.0, recv_sleep=0.0):
    cs = pair(env, max(sizes)); (pc, pp), (cc, cp) = cs
    out = {}
    tag = 1
    for n in sizes:
        lat, done, bad = [], [], 0
        for r in range(reps + 2):
            tag += 1
            cc.send({"op": "recv", "n": n, "tag": tag, "sleep": recv_sleep}); cc.recv()
            pc.send({"op": "write", "n": n, "tag": tag, "poll_delay": poll_delay})
            w = pc.recv(); c = cc.recv()
            if r < 2: continue
            lat.append(c["notif"] - w["post"]); done.append(w["done"] - w["post"]); bad += (not c["ok"])
        out[n] = {"post_to_done_ms": statistics.median(done)*1e3, "post_to_notif_ms": statistics.median(lat)*1e3,
                  "notif_minus_done_ms": statistics.median([l - d for l, d in zip(lat, done)])*1e3,
                  "p90_notif_ms": sorted(lat)[int(0.9*len(lat))]*1e3, "incomplete_at_notif": bad, "n": reps}
    for c, p in cs: c.send(None); p.join(20)
    return out

if __name__ == "__main__":
    base = {"UCX_NET_DEVICES": "lo", "NIXL_LOG_LEVEL": "WARN"}
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    res = {}
    tcp = {**base, "UCX_TLS": "tcp"}
    res["cma"] = run(base, [1, 8, 64], reps, recv_sleep=0.00005)
    res["cma_initiator_polls_after_5ms"] = run(base, [1, 8], reps // 2, poll_delay=0.005, recv_sleep=0.00005)
    res["tcp"] = run(tcp, [1, 8, 64], reps, recv_sleep=0.00005)
    res["tcp_initiator_polls_after_5ms"] = run(tcp, [1, 8], reps // 2, poll_delay=0.005, recv_sleep=0.00005)
    res["tcp_target_progress_every_1ms"] = run(tcp, [1, 8], reps // 2, recv_sleep=0.001)
    print(json.dumps(res, indent=1))
    for case, rows in res.items():
        for n, r in rows.items():
            print(f"{case:32s} {n:3d} MiB  post->DONE {r['post_to_done_ms']:7.2f} ms  post->notif {r['post_to_notif_ms']:7.2f} ms (p90 {r['p90_notif_ms']:7.2f})  notif-DONE {r['notif_minus_done_ms']:6.2f} ms  incomplete at notif {r['incomplete_at_notif']}/{r['n']}")
