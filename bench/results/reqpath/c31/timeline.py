import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
# pair cons with following prod of the same system
pairs = []
for i, r in enumerate(rows):
    if r["side"] == "cons":
        p = next((q for q in rows[i+1:] if q["side"] == "prod" and q["sys"] == r["sys"]), None)
        if p is None:
            p = next((q for q in reversed(rows[:i]) if q["side"] == "prod" and q["sys"] == r["sys"]), None)
        pairs.append((r, p))
agg = {}
for c, p in pairs:
    t0 = c["t_sub"]
    ev = [("C " + e, t) for e, t in c["tr"] if t >= t0 - 1e-3] + [("P " + e, t) for e, t in p["tr"] if t >= t0 - 1e-3]
    ev.append(("C result->vLLM", c["t_done"]))
    ev.sort(key=lambda x: x[1])
    seen = {}
    seq = []
    for e, t in ev:
        k = e
        n = seen.get(k, 0); seen[k] = n + 1
        seq.append((f"{k}#{n}", (t - t0) * 1e3))
    agg.setdefault(c["sys"], []).append(seq)
for sysname, seqs in agg.items():
    print("==", sysname, len(seqs))
    keys = {}
    for seq in seqs:
        for k, t in seq:
            keys.setdefault(k, []).append(t)
    order = sorted(keys, key=lambda k: statistics.median(keys[k]))
    for k in order:
        if len(keys[k]) >= len(seqs) // 2:
            print(f"  {statistics.median(keys[k]):7.3f} ms  {k}  (n={len(keys[k])})")
