"""How bench/peers.py and bench/decode_peers.py time and describe a run: interleaved rounds of CUDA
events with the L2 flushed and the stream kept busy past the host's enqueueing, the first call with
attnjit's JIT counters around it, peak memory, the summary of a system's times (median, minimum,
spread, useful TFLOP/s) and the GPU's clocks and temperature (nvidia-smi, torch.cuda). No side
effects on import."""
import statistics
import subprocess
import time

import torch

import attnjit

def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# GPU cycles the stream spins before each timed run, at least (about 2 ms at 2 GHz), and 1.5x the
# system's host time per call as its warm-ups measured it (spin_cycles): the host's work to enqueue
# the run (Python, argument checks, plan lookup, allocations) then happens while the GPU is busy,
# so the events time the GPU's work alone; the host's time per call is reported on its own
# (host_ms). A spin shorter than the host's work would put the GPU's idle wait into the system's time.
SPIN_CYCLES = 4_000_000
SPIN_CYCLES_PER_MS = 2_000_000  # about 2 GHz


def spin_cycles(host_ms):
    """The spin before a system's timed runs, from its host time per call in ms (median of its warm-ups)."""
    return max(SPIN_CYCLES, int(1.5 * host_ms * SPIN_CYCLES_PER_MS))


def timed_call(fn, device, flush, host_times=None, spin=SPIN_CYCLES):
    """One run in ms: CUDA events around it, L2 flushed (a 256 MB write) and the stream kept busy
    (`spin` GPU cycles) before it; perf_counter on the CPU. `host_times` (a list) receives the wall
    time the call took to return on the host (enqueueing only, on CUDA)."""
    if device.type == "cuda":
        flush.zero_()
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(spin)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t = time.perf_counter()
        fn()
        host = (time.perf_counter() - t) * 1e3
        end.record()
        end.synchronize()
        if host_times is not None:
            host_times.append(host)
        return start.elapsed_time(end)
    t = time.perf_counter()
    fn()
    ms = (time.perf_counter() - t) * 1e3
    if host_times is not None:
        host_times.append(ms)
    return ms


def interleaved(fns, device, rounds, warmup, flush, deadline=None, timeline=None, host_times=None):
    """fns: [(key, fn)]. Warm-ups of each, then `rounds` rounds A B C A B C ..., so that clock and
    temperature drift hit every system alike. Returns ({key: [ms]}, {key: exception}); a key whose
    call raises is dropped from the later rounds. Past `deadline` no new round starts (at least 3 run).
    `timeline` (a list) receives the keys in the order they ran; `host_times` (a dict) each key's
    host-side ms per call."""
    times, errors, live = {key: [] for key, _ in fns}, {}, dict(fns)
    if host_times is not None:
        host_times.update({key: [] for key, _ in fns})
    spins = {}
    for key, fn in fns:
        try:
            warm = []
            for _ in range(warmup):
                sync(device)
                t = time.perf_counter()
                fn()
                warm.append((time.perf_counter() - t) * 1e3)
            spins[key] = spin_cycles(statistics.median(warm) if warm else 0.0)
        except Exception as e:  # noqa: BLE001
            errors[key] = e
            live.pop(key)
    for r in range(rounds):
        if deadline is not None and r >= 3 and time.time() > deadline:
            break
        for key in list(live):
            try:
                times[key].append(timed_call(live[key], device, flush,
                                             None if host_times is None else host_times[key], spins[key]))
            except Exception as e:  # noqa: BLE001
                errors[key] = e
                live.pop(key)
            if timeline is not None:
                timeline.append(key)
    return times, errors


def wall(fn, device):
    sync(device)
    t = time.perf_counter()
    r = fn()
    sync(device)
    return r, time.perf_counter() - t


JIT_KEYS = ("compiled", "cache_hits", "failed", "compile_seconds", "compile_wall_seconds", "lookup_seconds")


def jit_counters():
    """attnjit's process-wide JIT counters (kernels compiled by NVRTC and their seconds, cache hits), or
    None from an attnjit without them."""
    f = getattr(getattr(attnjit, "_attnjit", None), "jit_counters", None)
    return dict(f()) if f else None


def jit_delta(before, after):
    if before is None or after is None:
        return None
    return {k: after[k] - before[k] for k in JIT_KEYS}


def first_call(fn, device, attnjit_system, cache_files=lambda: None):
    """(result, {seconds, what it compiled}): attnjit's JIT counters (for an attnjit system) and the
    cache directories' files (`cache_files()`: their count, or None where not counted) read around one call."""
    jit, files = jit_counters() if attnjit_system else None, cache_files()
    r, seconds = wall(fn, device)
    new_files = cache_files() - files if files is not None else None
    return r, {"s": seconds, "jit": jit_delta(jit, jit_counters()) if attnjit_system else None,
               "attnjit": attnjit_system, "new_cache_files": new_files}


def peak_mb(fn, device):
    """Peak bytes PyTorch's allocator held during fn() above what it held before (MB), and the absolute
    peak; the peak counter is reset right before, so each system's number is its own."""
    if device.type != "cuda":
        return None, None
    sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    peak = torch.cuda.max_memory_allocated(device)
    return (peak - base) / 2**20, peak / 2**20


def summary(times, flop, flop_per_branch=None):
    """Median, minimum, maximum and spread ((max - min) / median, and the interquartile range / median,
    in %); useful TFLOP/s on distinct pairs at the median and the minimum, and per branch where it differs."""
    med, lo, hi = statistics.median(times), min(times), max(times)
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [med, med, med]
    s = {"times_ms": [round(t, 4) for t in times], "runs": len(times), "median_ms": med, "min_ms": lo, "max_ms": hi,
         "spread_pct": 100 * (hi - lo) / med if med else 0.0, "iqr_pct": 100 * (q[2] - q[0]) / med if med else 0.0,
         "tflops": flop / (med * 1e-3) / 1e12 if flop and med else None,
         "tflops_at_min": flop / (lo * 1e-3) / 1e12 if flop and lo else None}
    if flop_per_branch and flop_per_branch != flop:
        s["tflops_per_branch"] = flop_per_branch / (med * 1e-3) / 1e12 if med else None
    return s


# ---------------------------------------------------------------------------------------------
# GPU clocks and temperature, at the start and end of each case

SMI_FIELDS = ("clocks.sm", "clocks.mem", "temperature.gpu", "power.draw", "clocks_event_reasons.active")


def parse_smi(text, fields=SMI_FIELDS):
    """One nvidia-smi CSV line (noheader, nounits) -> {field: number or text}."""
    values = [x.strip() for x in text.strip().splitlines()[0].split(",")]
    if len(values) != len(fields):
        raise ValueError(f"nvidia-smi gave {len(values)} values for {len(fields)} fields: {text.strip()[:200]}")
    out = {}
    for f, x in zip(fields, values):
        try:
            out[f] = float(x)
        except ValueError:
            out[f] = x
    return out


def gpu_state(device):
    """SM and memory clocks (MHz), temperature (C), power (W) and the clock event reasons now, from
    nvidia-smi (older drivers: clocks_throttle_reasons) and torch.cuda where it reads them; on a
    machine with neither, {"skipped": why}."""
    if device.type != "cuda":
        return {"skipped": f"no GPU ({device.type}): clocks and temperature not read"}
    st = {"t": time.time()}
    ident = str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or "")
    ident = ("GPU-" + ident if ident and not ident.startswith("GPU-") else ident) or str(device.index or 0)
    for fields in (SMI_FIELDS, SMI_FIELDS[:-1] + ("clocks_throttle_reasons.active",), SMI_FIELDS[:4]):
        try:
            r = subprocess.run(["nvidia-smi", "-i", ident, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=20)
            if r.returncode == 0:
                st.update(parse_smi(r.stdout, fields))
                break
            st["nvidia_smi"] = f"rc {r.returncode}: {(r.stdout + r.stderr).strip()[:200]}"
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            st["nvidia_smi"] = f"unavailable: {e}"
            break
    for name in ("clock_rate", "temperature", "power_draw"):
        try:
            st[f"torch.cuda.{name}"] = getattr(torch.cuda, name)(device)
        except Exception:  # noqa: BLE001 -- needs pynvml / amdsmi; nvidia-smi above is the main source
            pass
    if len(st) == 1 or (len(st) == 2 and "nvidia_smi" in st):
        st["skipped"] = "neither nvidia-smi nor torch.cuda could read clocks and temperature"
    return st


