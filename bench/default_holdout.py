#!/usr/bin/env python3
"""How good the untuned default is, on patterns it was not fitted to: the tuned-against-default
ratio of the heuristic default, and of a default fitted to the other patterns (leave one pattern
out), over the keys of shipped tuning databases.

    python3 bench/default_holdout.py autotune_db/*.json [--out DIR]
    python3 bench/default_holdout.py --check     # the arithmetic on a made-up database

A key's ratio is its fastest timed median (the tuner's pick is within its 2% tie tolerance of it)
over the median of the configuration a rule picks: 1.0 when the rule picks the fastest, 0.8 when
the fastest is 1.25x faster. The bar the tuning work
sets: the median ratio at least 0.95 (within 5%) and none below 0.85.

The heuristic default is the database's first candidate of each key: the default when the key
was tuned (a database tuned with older templates shows that day's heuristic).

The fitted rule: keys fall into classes by kernel path (the Hopper kernels or the portable ones),
pass, head dim, whether the pattern has block layouts (what the heuristic already reads) and
whether it is dilated; for a held-out pattern, each class takes the configuration with the least
geometric mean of time over best on the other patterns' keys of that class. A key that did not
time a configuration (the tuner's cost model pruned it as unable to win, or it failed) counts as
its slowest timed one, when fitting and when a held-out key is scored on it (marked "untimed"). A class none of them has keeps the heuristic default. Pattern features
come from the specs in examples/ and bench/patterns/ whose hash is the key's signature (through
the attnjit Python package; without it every pattern counts as dense).
"""
import argparse
import json
import math
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from tuning_table import ROOT, describe, shipped_patterns  # noqa: E402


def pattern_features():
    """signature -> (name, has block layouts, dilated), for the specs shipped with the repository."""
    out = {}
    for name, p in shipped_patterns():
        text = p.canonical
        dilated = any(int(w.split("=")[1]) > 1 for w in text.split() if w.startswith("dilation="))
        out[p.hash] = (name, text.count("layout=") > text.count("layout=none"), dilated)
    return out


def config_key(c):
    return (c["tile_q"], c["tile_k"], c["stages"], c.get("warps", 0))


def keys_of(db, features):
    """The database's entries as rows: pattern, class, timed configurations, default, best."""
    rows = []
    for e in db.get("entries", []):
        k = e["key"]
        times = {config_key(c["config"]): c["median_ms"] for c in e.get("candidates", [])
                 if c.get("status", "ok") == "ok" and c.get("median_ms")}
        if not times or not e.get("candidates"):
            continue
        default = config_key(e["candidates"][0]["config"])  # candidates come with the default first
        if default not in times:
            continue
        name, layouts, dilated = features.get(k["pattern_signature"], (k["pattern_signature"][:12], False, False))
        cls = ("hopper" if k.get("arch_specific") else "portable", k.get("pass", "forward"), k["head_dim"], layouts, dilated)
        rows.append({"pattern": name, "class": cls, "dtype": k["dtype"], "seq": k["seq_bucket"], "times": times,
                     "default": default, "best": min(times.values())})
    return rows


def fitted(rows, cls):
    """The configuration with the least geometric mean of time over best across `rows` of class
    `cls` (a row without it counting its slowest time); None when no row is of the class."""
    mine = [r for r in rows if r["class"] == cls]
    if not mine:
        return None
    configs = sorted(set().union(*(r["times"] for r in mine)))
    score = {c: sum(math.log(r["times"].get(c, max(r["times"].values())) / r["best"]) for r in mine) for c in configs}
    return min(configs, key=lambda c: score[c])


def evaluate(rows):
    """Per row: the heuristic default's ratio and the held-out fitted rule's pick and ratio."""
    out = []
    for r in rows:
        others = [x for x in rows if x["pattern"] != r["pattern"]]
        pick = fitted(others, r["class"]) or r["default"]
        untimed = pick not in r["times"]  # scored at the key's slowest, as in fitting
        t = max(r["times"].values()) if untimed else r["times"][pick]
        out.append(dict(r, default_ratio=r["best"] / r["times"][r["default"]], pick=pick, pick_ratio=r["best"] / t, untimed=untimed))
    return out


def summary(ratios):
    return {"keys": len(ratios), "median": statistics.median(ratios), "min": min(ratios),
            "below_0.95": sum(x < 0.95 for x in ratios), "below_0.85": sum(x < 0.85 for x in ratios),
            "meets_bar": statistics.median(ratios) >= 0.95 and min(ratios) >= 0.85}


def cfg(c):
    return describe({"tile_q": c[0], "tile_k": c[1], "stages": c[2]}) + (f" w{c[3]}" if c[3] else "")


def report(db, path, features):
    meta = db.get("metadata", {})
    rows = evaluate(keys_of(db, features))
    if not rows:
        return None, None
    h, f = summary([r["default_ratio"] for r in rows]), summary([r["pick_ratio"] for r in rows])
    versions = sorted({e.get("templates", "") or "unrecorded" for e in db.get("entries", [])})
    md = [f"# The default on held-out patterns: {meta.get('gpu', '?')} (sm_{meta.get('arch', '?')})", "",
          f"From `{path}` (`python3 bench/default_holdout.py {path}`): {len(rows)} keys of "
          f"{len({r['pattern'] for r in rows})} patterns; kernel templates {', '.join(versions)}. Ratio: the fastest timed "
          "median over the picked configuration's (1.00: the fastest; \"untimed\": the key did not time the pick, scored "
          "at its slowest). Bar: median >= 0.95, none below 0.85.", "",
          "| rule | keys | median | min | below 0.95 | below 0.85 | meets the bar |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, s in (("heuristic default", h), ("fitted on the other patterns", f)):
        md.append(f"| {name} | {s['keys']} | {s['median']:.3f} | {s['min']:.3f} | {s['below_0.95']} | {s['below_0.85']} | "
                  f"{'yes' if s['meets_bar'] else 'no'} |")
    md += ["", "| pattern | path | pass | head dim | layouts | dilated | dtype | seq | default | ratio | fitted | ratio |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in sorted(rows, key=lambda r: (r["class"], r["pattern"], r["dtype"], r["seq"])):
        path_, pass_, d, layouts, dilated = r["class"]
        md.append(f"| {r['pattern']} | {path_} | {pass_} | {d} | {'yes' if layouts else 'no'} | {'yes' if dilated else 'no'} | "
                  f"{r['dtype']} | {r['seq']} | "
                  f"{cfg(r['default'])} | {r['default_ratio']:.2f} | {cfg(r['pick'])}{' (untimed)' if r['untimed'] else ''} | "
                  f"{r['pick_ratio']:.2f} |")
    data = {"gpu": meta.get("gpu"), "database": str(path), "templates": versions, "heuristic_default": h, "fitted_held_out": f,
            "keys": [{"pattern": r["pattern"], "class": list(r["class"]), "dtype": r["dtype"], "seq": r["seq"],
                      "default": list(r["default"]), "default_ratio": r["default_ratio"], "fitted": list(r["pick"]),
                      "fitted_ratio": r["pick_ratio"], "fitted_untimed": r["untimed"]} for r in rows]}
    return "\n".join(md) + "\n", data


def check():
    """The arithmetic on a made-up database: three dense-like patterns where 128x64 wins by 1.25x
    over the default 64x64, and one with layouts where the default wins."""
    def entry(sig, times):
        cands = [{"config": {"tile_q": q, "tile_k": k, "stages": 2, "warps": 4}, "median_ms": t, "status": "ok"} for (q, k), t in times]
        return {"key": {"pattern_signature": sig, "pass": "forward", "arch_specific": True, "head_dim": 128, "dtype": "bf16",
                        "seq_bucket": 4096}, "candidates": cands}
    db = {"metadata": {"gpu": "made up", "arch": 90}, "entries": [
        entry("a", [((64, 64), 1.25), ((128, 64), 1.0), ((128, 128), 1.1)]),
        entry("b", [((64, 64), 2.5), ((128, 64), 2.0), ((128, 128), 2.4)]),
        entry("c", [((64, 64), 1.25), ((128, 64), 1.0)]),
        entry("d", [((64, 64), 1.0), ((128, 64), 1.5)])]}
    features = {"a": ("a", False, False), "b": ("b", False, False), "c": ("c", False, False), "d": ("d", True, False)}
    rows = {r["pattern"]: r for r in evaluate(keys_of(db, features))}
    assert abs(rows["a"]["default_ratio"] - 0.8) < 1e-12, rows["a"]
    # a held out: b and c both rank 128x64 first (c did not time 128x128: counted at its slowest).
    assert rows["a"]["pick"] == (128, 64, 2, 4) and rows["a"]["pick_ratio"] == 1.0, rows["a"]
    # d has layouts: its class has no other pattern, so it keeps the default, which wins there.
    assert rows["d"]["pick"] == (64, 64, 2, 4) and rows["d"]["pick_ratio"] == 1.0, rows["d"]
    s = summary([r["default_ratio"] for r in rows.values()])
    assert s["median"] == 0.8 and s["below_0.85"] == 3 and not s["meets_bar"], s
    s = summary([r["pick_ratio"] for r in rows.values()])
    assert s["median"] == 1.0 and s["min"] == 1.0 and s["meets_bar"], s
    md, _ = report(db, "made-up.json", features)
    assert "| heuristic default | 4 | 0.800 | 0.800 | 3 | 3 | no |" in md, md
    assert "| fitted on the other patterns | 4 | 1.000 | 1.000 | 0 | 0 | yes |" in md, md
    # A candidate that failed has no time (a pick of it is scored at the slowest), and an entry without
    # candidates is skipped.
    db["entries"].append({"key": dict(db["entries"][0]["key"], pattern_signature="e"), "candidates": []})
    db["entries"][1]["candidates"][1]["status"] = "failed"
    rows = {r["pattern"]: r for r in evaluate(keys_of(db, features))}
    assert "e" not in rows and (128, 64, 2, 4) not in rows["b"]["times"], rows["b"]
    # b held out: a and c still fit 128x64, which b no longer timed: scored at b's slowest.
    assert rows["b"]["pick"] == (128, 64, 2, 4) and rows["b"]["untimed"], rows["b"]
    assert abs(rows["b"]["pick_ratio"] - 2.4 / 2.5) < 1e-12, rows["b"]
    # a held out now: 128x64 scores b's slowest (2.5 / 2.4) plus c's 1.0, 128x128 b's 1.0 plus c's
    # slowest (1.25): 128x64 still has the least.
    assert rows["a"]["pick"] == (128, 64, 2, 4), rows["a"]
    for f in sorted(ROOT.glob("autotune_db/*.json")):  # the shipped databases read without error
        report(json.loads(f.read_text()), f.relative_to(ROOT), {})
    print("default_holdout check ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("db", nargs="*", help="tuning databases (autotune_db/<gpu>.json)")
    ap.add_argument("--out", help="write <gpu>/tuning/default_holdout.{md,json} under this folder (bench/results)")
    ap.add_argument("--check", action="store_true", help="check the arithmetic on a made-up database and exit")
    a = ap.parse_args()
    if a.check:
        return check()
    if not a.db:
        ap.error("give one or more tuning databases, or --check")
    features = pattern_features()
    for path in a.db:
        db = json.loads(pathlib.Path(path).read_text())
        md, data = report(db, path, features)
        if md is None:
            print(f"{path}: no entry with timed candidates", file=sys.stderr)
            continue
        print(md)
        if a.out:
            gpu = (db.get("metadata", {}).get("gpu") or pathlib.Path(path).stem).replace(" ", "_")
            d = pathlib.Path(a.out) / gpu / "tuning"
            d.mkdir(parents=True, exist_ok=True)
            (d / "default_holdout.md").write_text(md)
            (d / "default_holdout.json").write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
