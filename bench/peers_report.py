"""bench/peers.py's outputs: peers.json, the table (peers.md) and the plot (peers.png), and the
words its table and log use for first calls and clocks. Formatting only: nothing here measures."""
import json
import os
import sys


def ttfr_legend(t):
    """What a first call did, from attnjit's own counters: the compile legend appears only with a
    compile counted in that call, and a call that counted more compile wall time than it took is
    marked inconsistent."""
    jit = t.get("jit")
    if jit is None:
        files = f"{t['new_cache_files']} new cache files" if t.get("new_cache_files") is not None else "cache files not counted"
        return (files if not t.get("attnjit", True) else f"attnjit without JIT counters; {files}")
    if jit["compiled"] or jit["failed"]:
        legend = f"compiled {jit['compiled']} kernel(s) in {jit['compile_wall_seconds']:.2f} s"
        legend += f", {jit['failed']} failed" if jit["failed"] else ""
    elif jit["cache_hits"]:
        legend = f"{jit['cache_hits']} kernel(s) from the cache ({jit['lookup_seconds']:.3f} s)"
    else:
        legend = "no kernel loaded (built earlier in this process, or no JIT on this device)"
    if jit["compile_wall_seconds"] > t["s"] + 1e-3:
        legend += " **inconsistent: more compile time than the call took**"
    if t.get("new_cache_files"):
        legend += f"; {t['new_cache_files']} new cache files"
    return legend


def clocks_text(c):
    s, e = c.get("start", {}), c.get("end", {})
    if "skipped" in s:
        return f"clocks: skipped ({s['skipped']})"

    def one(x):
        return (f"SM {_fmt(x.get('clocks.sm'), '.0f')} MHz, mem {_fmt(x.get('clocks.mem'), '.0f')} MHz, "
                f"{_fmt(x.get('temperature.gpu'), '.0f')} C, {_fmt(x.get('power.draw'), '.0f')} W"
                + (f", reasons {x.get('clocks_event_reasons.active', x.get('clocks_throttle_reasons.active'))}"
                   if ("clocks_event_reasons.active" in x or "clocks_throttle_reasons.active" in x) else ""))
    return f"start: {one(s)}; end: {one(e)}"


class Writer:
    def __init__(self, out, meta):
        self.out, self.meta, self.cases = out, meta, []
        os.makedirs(out, exist_ok=True)

    def write(self, plot=False):
        data = {**self.meta, "cases": self.cases}
        tmp = os.path.join(self.out, "peers.json.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, default=str)
        os.replace(tmp, os.path.join(self.out, "peers.json"))
        with open(os.path.join(self.out, "peers.md"), "w", encoding="utf-8") as f:
            f.write(markdown(data))
        if plot:
            plot_png(self.cases, os.path.join(self.out, "peers.png"))


def _fmt(x, spec=".3f"):
    return "" if x is None else format(x, spec)


def markdown(data):
    lines = [f"# attnjit against its peers: {data.get('device', '')}", "",
             f"torch {data.get('torch')}, triton {data.get('triton')}, attnjit {data.get('attnjit')}, "
             f"driver {data.get('driver')}. {data.get('method')}", "",
             "ms: median of the interleaved rounds (min: the fastest run; spread: (max - min) / median), GPU time "
             "between CUDA events with the stream kept busy before each run, so the host's work to enqueue it is not "
             "in it; host ms: the median wall time a call takes to return on the host (enqueueing only). "
             "TFLOP/s: useful, on distinct attended pairs (a pair two branches attend counts once), at the median; "
             "per-branch: the same time over pairs counted once per branch that attends them (differs for "
             "overlapping branches only). step: the training step, each round's forward and backward added, median "
             "over the rounds (useful FLOPs 3.5x the forward's); step ours/peer by median. ours/peer: peer ms / ours "
             "ms (> 1: ours faster), by median and by minimum, forward / backward. err: max |x - ref| / (1 + |ref|) on the sampled heads and rows against "
             "an fp64 reference from attnjit's mask: forward, then the worst of dQ, dK, dV (see each case's grad "
             "check); **WRONG** marks a row over the tolerance. peak MB: PyTorch allocator peak above what was held "
             "before, reset per system, forward (forward + backward). "
             "Ours' backward workspaces come from the CUDA driver's stream-ordered pool, outside PyTorch's allocator.", ""]
    families = []
    for c in data["cases"]:
        if c["family"] not in families:
            families.append(c["family"])
    head = ("| case | system | fwd ms | min | spread | fwd TFLOP/s | per-branch | bwd ms | min | spread | bwd TFLOP/s | "
            "step ms | step ours/peer | ours/peer median | ours/peer min | err fwd / grad | peak MB | host ms fwd / bwd |")
    for fam in families:
        lines += [f"## {fam}", "", head, "|" + " --- |" * (head.count("|") - 1)]
        for c in (c for c in data["cases"] if c["family"] == fam):
            blank = " |" * 15
            if "error" in c:
                lines.append(f"| {c['name']} | (setup) | error: {c['error']['message'][:120].replace('|', '/')} |{blank}")
            ours = c["systems"].get("ours", {})
            for name, s in c["systems"].items():
                if s.get("status") != "ok" and "fwd" not in s:
                    why = s.get("status", "") if "error" not in s else f"{s['error']['type']}: {s['error']['message'][:120]}"
                    lines.append(f"| {c['name']} | {name} | {why.replace('|', '/')} |{blank}")
                    continue
                f, b, st = s.get("fwd", {}), s.get("bwd", {}), s.get("step", {})
                rmed = rmin = rstep = ""
                if name != "ours":
                    rstep = _ratio(st, ours.get("step"))
                if name != "ours":
                    rmed = " / ".join(x for x in (_ratio(f, ours.get("fwd")), _ratio(b, ours.get("bwd"))) if x)
                    rmin = " / ".join(x for x in (_ratio(f, ours.get("fwd"), "min_ms"), _ratio(b, ours.get("bwd"), "min_ms")) if x)
                if "max_err" not in s:
                    err = "n/a (not the same pattern)"
                else:
                    err = _fmt(s["max_err"], ".1e") + (f" / {max(s['grad_err'].values()):.1e}" if s.get("grad_err") else "")
                if s.get("wrong"):
                    err += f" **WRONG: {', '.join(s.get('wrong_what', []))}**"
                if "error" in s:
                    err += f"; error: {s['error']['message'][:80].replace('|', '/')}"
                if "bwd_status" in s:
                    err += f"; backward {s['bwd_status']}"
                mem = _fmt(s.get("peak_fwd_mb"), ".0f") + (f" ({s['peak_fwdbwd_mb']:.0f})" if s.get("peak_fwdbwd_mb") is not None else "")
                label = f"**{name} (WRONG)**" if s.get("wrong") else name
                lines.append(f"| {c['name']} | {label} | {_fmt(f.get('median_ms'))} | {_fmt(f.get('min_ms'))} | "
                             f"{_fmt(f.get('spread_pct'), '.0f')}{'%' if f else ''} | {_fmt(f.get('tflops'), '.1f')} | "
                             f"{_fmt(f.get('tflops_per_branch'), '.1f')} | {_fmt(b.get('median_ms'))} | {_fmt(b.get('min_ms'))} | "
                             f"{_fmt(b.get('spread_pct'), '.0f')}{'%' if b else ''} | {_fmt(b.get('tflops'), '.1f')} | "
                             f"{_fmt(st.get('median_ms'))} | {rstep} | {rmed} | {rmin} | {err} | {mem} | "
                             f"{' / '.join(_fmt(x.get('host_ms'), '.3f') for x in (f, b) if x)} |")
        lines.append("")
    lines += ["## Cases: pairs, order, grad check, clocks", ""]
    for c in data["cases"]:
        st = c.get("stats", {})
        lines.append(f"- {c['name']}: {_fmt(c.get('attended_pairs_distinct'), 'd')} distinct attended pairs, "
                     f"{_fmt(c.get('attended_pairs_per_branch'), 'd')} per branch; rounds: "
                     f"{', '.join(c.get('order', [])) or 'none'} (repeated); grad check: "
                     f"{next((s.get('grad_check') for s in c['systems'].values() if s.get('grad_check')), 'none')}; "
                     f"{clocks_text(c.get('clocks', {}))}" + ("" if st else " (no stats)"))
    lines += ["", "## Time to first result", "",
              "The kernel caches start empty (attnjit's, Inductor's, Triton's) unless the run says --keep-cache. "
              "first: the system's first forward call in this case; second: the next one; bwd: the first forward + "
              "backward. What a call compiled comes from attnjit's own JIT counters read around that call "
              "(kernels compiled by NVRTC and their wall time, cache hits); a kernel an earlier case compiled is "
              "served from the process's memory without a count. New files: files the call added to the cache "
              "directories (how torch.compile's compiles show).", "",
              "| case | system | first s | first: what it did | second s | first bwd s | bwd: what it did |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in data["cases"]:
        for name, s in c["systems"].items():
            if "ttfr_first" in s:
                tb = s.get("ttfr_bwd_first")
                lines.append(f"| {c['name']} | {name} | {s['ttfr_first']['s']:.3f} | {ttfr_legend(s['ttfr_first'])} | "
                             f"{s['ttfr_second_s']:.4f} | {_fmt(tb['s'] if tb else None)} | {ttfr_legend(tb) if tb else ''} |")
    notes = sorted({f"{n}: {s['note']}" for c in data["cases"] for n, s in c["systems"].items() if s.get("note")})
    lines += ["", "## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def _ratio(peer, ours, key="median_ms"):
    if not peer or not ours:
        return ""
    return f"{peer[key] / ours[key]:.2f}"


# One colour per system, in every panel and every run.
SYSTEM_COLOURS = {"ours": "#d62728", "sdpa-flash": "#1f77b4", "sdpa-cudnn": "#2ca02c", "flex": "#9467bd",
                  "torch-longnet": "#ff7f0e", "torch-dilated-pieces": "#8c564b", "sdpa-flash-dense": "#7f7f7f"}


def plot_png(cases, path):
    """Grouped bars: one panel each for the forward, the backward and the training step; per case
    one bar per system (useful TFLOP/s at the median, one colour per system everywhere), each
    peer's bar labelled with ours/peer by median time (> 1: ours faster). Skipped, saying so,
    without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"peers: {path} not written: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return
    shown = [c for c in cases if any(s.get("fwd") for s in c["systems"].values())]
    if not shown:
        return
    names = list(dict.fromkeys(n for c in shown for n in c["systems"]))
    fig, axes = plt.subplots(3, 1, figsize=(max(6.0, 1.6 * len(shown)), 10), squeeze=False)
    width = 0.8 / max(1, max(len(c["systems"]) for c in shown))
    for ax, (pas, title) in zip(axes[:, 0], (("fwd", "forward"), ("bwd", "backward"), ("step", "training step"))):
        for x, c in enumerate(shown):
            present = [n for n in c["systems"] if c["systems"][n].get(pas, {}).get("tflops")]
            ours = c["systems"].get("ours", {}).get(pas)
            for i, name in enumerate(present):
                t = c["systems"][name][pas]
                pos = x + (i - (len(present) - 1) / 2) * width
                ax.bar(pos, t["tflops"], width, color=SYSTEM_COLOURS.get(name, "#17becf"),
                       label=name if name not in ax.get_legend_handles_labels()[1] else None)
                if name != "ours" and ours:
                    ax.text(pos, t["tflops"], _ratio(t, ours) + "x", ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(len(shown)))
        ax.set_xticklabels([c["name"] for c in shown], rotation=20, ha="right", fontsize=7)
        ax.set_ylabel("useful TFLOP/s")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.4)  # room for the legend above the bars
        ax.set_title(f"{title} (labels: ours/peer by median time)")
        handles, labels = ax.get_legend_handles_labels()
        order = sorted(range(len(labels)), key=lambda i: names.index(labels[i]) if labels[i] in names else 99)
        ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
