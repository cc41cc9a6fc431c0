#!/usr/bin/env bash
# The one script a GPU machine runs (docs/testing.md): build, GPU tests, unit tests,
# compute-sanitizer, benchmarks; one report.
#
#   bash tests/device/device_check.sh OUTDIR      (from the repository root, with .deps/ carried along:
#                                           scripts/stage_deps.sh makes it on a machine with the packages)
#
# Steps: versions, configure + build (Release, build-device/, -DATTNJIT_LIT_TESTS=OFF, .deps),
# nvidia-smi, attnjit info, the probe kernels against the emulator's golden files (every GPU
# building block, bit for bit: attnjit_probes --device gpu), the GPU tests (forward, backward,
# driver layer and CUDA graphs, the backward's random sweep, each its own step), the Python package's tests (its GPU subset),
# compute-sanitizer memcheck, racecheck, synccheck and initcheck on the GPU tests' [sanitize] subset
# (forward and backward kernels),
# attnjit_gpu_bench over examples/*.json at seq 4096 and 16384 (16 heads, head dim 128, bf16),
# BigBird at 16384 and 65536 with its random blocks planned and decided in the kernels,
# then the CPU-side unit tests with what time is left. Each step runs under `timeout` within an overall budget
# (ATTNJIT_DC_BUDGET seconds, default 540; later steps keep a reserve); a failing step does not
# stop the others. After every step OUTDIR/report.md and OUTDIR/report.json are rewritten, so a
# run cut short still leaves a report. Logs: OUTDIR/logs/. Exit status: 1 if any step failed or
# timed out or found no time left, else 0 (steps skipped for want of a GPU or a tool do not fail the run).
#
# On a lent machine only a few files under $OUT come back: ATTNJIT_DC_PACK=1 packs OUTDIR into
# OUTDIR.tgz at the end and leaves only report.md and report.json beside it. The reserves below are
# written for the default budget of 540 s and scale with ATTNJIT_DC_BUDGET.
#
# Environment: BUILD_DIR (build-device), JOBS (nproc), ATTNJIT_DC_BUDGET (540), ATTNJIT_DC_COMMIT (the
# commit whose tree runs, for the report: a lent machine's copy may carry an older .git),
# ATTNJIT_DC_SKIP (step names, space-separated, recorded as skipped: a call that splits the steps
# over two machines' time, e.g. "gpu_backward gpu_backward_random python_tests unit_tests"),
# ATTNJIT_DC_ONLY (step names: only these run, besides versions, configure, build, nvidia_smi and
# attnjit_info; the others are recorded as skipped. All the GPU steps together need about 12
# minutes on an H200, more than one call: a session splits them over two calls on one warm machine,
# e.g. "probes gpu_forward_examples gpu_forward gpu_backward gpu_driver" and then
# "gpu_backward_random gpu_forward_sm80 gpu_forward_sm90a_cpasync python_tests memcheck racecheck
# synccheck initcheck"),
# ATTNJIT_DC_LANES (groups of step names separated by ';': after the probes each group runs in its
# own process, all at once on the one GPU, sharing the build and the kernel cache; one report. The
# correctness steps fit one call that way, e.g. "gpu_forward_examples gpu_forward;gpu_backward;
# gpu_backward_wgmma;gpu_backward_random gpu_driver gpu_paged;gpu_forward_sm80 gpu_forward_sm90a_cpasync python_tests;
# memcheck synccheck;racecheck initcheck" with ATTNJIT_DC_ONLY="probes". Not for timings),
# ATTNJIT_DC_FULL_UNIT=1 also runs the NVRTC matrix unit test (about 4 minutes of compiles that
# do not need a GPU and run on every CPU machine; left out by default to keep this under 10 minutes).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash tests/device/device_check.sh OUTDIR" >&2; exit 2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mkdir -p "$1/logs" || exit 2
out="$(cd "$1" && pwd)"
cd "$root" || exit 2
build="${BUILD_DIR:-$root/build-device}"
jobs="${JOBS:-$(nproc)}"
budget="${ATTNJIT_DC_BUDGET:-540}"
t_start=$(date +%s)
steps="$out/steps.tsv"
if [ "${ATTNJIT_DC_JOIN:-0}" != 1 ]; then  # a lane adds to the run that started it
  : > "$steps"
  rm -f "$out/gpu_cases.jsonl" "$out/gpu_cases_sm80.jsonl" "$out/bench.json" "$out/seed.marker"
fi
export ATTNJIT_CACHE_DIR="$build/kernel-cache"  # kernels compiled by the GPU tests are reused by the sanitizer runs
# The GPU tests run on the GPU here, whatever the calling shell set (ctest's emu_suite sets its own).
export ATTNJIT_GPU_TESTS_DEVICE=gpu
unset ATTNJIT_GPU_TESTS_ON_CPU
export PATH="$PATH:/usr/local/cuda/bin:/usr/local/cuda/compute-sanitizer"

elapsed() { echo $(( $(date +%s) - t_start )); }
# The steps the lanes run (ATTNJIT_DC_LANES, below): this run neither runs nor records them.
lane_steps=""
[ -n "${ATTNJIT_DC_LANES:-}" ] && [ "${ATTNJIT_DC_JOIN:-0}" != 1 ] && lane_steps="${ATTNJIT_DC_LANES//;/ }"

# step NAME TIMEOUT RESERVE COMMAND: runs COMMAND (a bash string) with its output in logs/NAME.log,
# for at most min(TIMEOUT, what is left of the budget after RESERVE seconds kept for later steps).
# Status: pass, fail, timeout, no_time (budget spent), skipped (exit 77, or a SKIPPED line from a
# tool that degrades).
step() {
  local name="$1" limit="$2" reserve="$3" cmd="$4" log="$out/logs/$1.log"
  quiet "$name" && return
  if [[ " ${ATTNJIT_DC_SKIP:-} " == *" $name "* ]]; then skip "$name" "left out by ATTNJIT_DC_SKIP"; return; fi
  if [ -n "${ATTNJIT_DC_ONLY:-}" ] && [[ " $ATTNJIT_DC_ONLY versions configure build seed_cache nvidia_smi attnjit_info " != *" $name "* ]]; then
    skip "$name" "not in ATTNJIT_DC_ONLY"; return
  fi
  reserve=$(( reserve * budget / 540 ))  # the reserves are written for the default budget
  [ -n "${ATTNJIT_DC_ONLY:-}" ] && reserve=10  # a chosen few steps: each may use what is left
  local left=$(( budget - $(elapsed) - reserve ))
  (( left < limit )) && limit=$left
  if (( limit < 10 )); then
    echo "not run: out of time (budget ${budget}s)" > "$log"
    record "$name" no_time 0 - "not run: the ${budget}s budget is spent"
    return
  fi
  echo "== [$(elapsed)s] $name (limit ${limit}s): $(echo "$cmd" | grep -m1 . | cut -c1-160)"
  local t0=$(date +%s)
  timeout -k 10 "$limit" bash -c "$cmd" > "$log" 2>&1
  local rc=$? secs=$(( $(date +%s) - t0 )) status=pass note=""
  if (( rc == 124 || rc == 137 )); then status=timeout; note="killed after ${limit}s"
  elif grep -qE 'Device not supported|Target application terminated before first instrumented API call' "$log" && \
       [[ "$name" =~ ^(memcheck|racecheck|synccheck|initcheck)$ ]]; then
    status=skipped; note="compute-sanitizer cannot instrument this machine's GPU: $(grep -m1 -E 'Device not supported|terminated before' "$log" | cut -c1-160)"
  elif (( rc != 0 && rc != 77 )); then status=fail; note="exit status $rc"
  elif (( rc == 77 )) || grep -qE '^SKIPPED|\*\*\*Skipped|^skipped:' "$log"; then
    status=skipped; note="$(grep -m1 -E 'SKIPPED|Skipped|skipped:' "$log" | cut -c1-200)"
  fi
  record "$name" "$status" "$secs" "$rc" "$note"
  echo "   -> $status (${secs}s) $note"
  tail -n 5 "$log" | sed 's/^/   | /'
}
record() {  # NAME STATUS SECONDS RC NOTE
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$(echo "$5" | tr '\t\n' '  ')" >> "$steps"
  write_report
}
skip() { quiet "$1" && return; echo "skipped: $2" > "$out/logs/$1.log"; record "$1" skipped 0 - "$2"; echo "== $1: skipped: $2"; }
# Steps another process records: a lane records only its own steps (ATTNJIT_DC_JOIN), and the
# run that started the lanes leaves theirs to them.
quiet() {
  [ "${ATTNJIT_DC_JOIN:-0}" = 1 ] && [[ " ${ATTNJIT_DC_ONLY:-} " != *" $1 "* ]] && return 0
  [[ " ${lane_steps:-} " == *" $1 "* ]]
}
status_of() { awk -F'\t' -v n="$1" '$1 == n { print $2 }' "$steps"; }  # a recorded step's status

write_report() {
  command -v python3 > /dev/null || { cp "$steps" "$out/report.md"; return; }
  OUT="$out" ROOT="$root" BUDGET="$budget" ELAPSED="$(elapsed)" python3 - <<'PY' || echo "device_check: report generation failed" >&2
import json, os, re, time
out, root = os.environ["OUT"], os.environ["ROOT"]
def read(p, default=""):
    try:
        with open(p, errors="replace") as f: return f.read()
    except OSError: return default
def tail(text, n=40): return "\n".join(text.rstrip("\n").split("\n")[-n:])
steps = []
for line in read(f"{out}/steps.tsv").splitlines():
    name, status, secs, rc, note = (line.split("\t") + [""] * 5)[:5]
    log = read(f"{out}/logs/{name}.log")
    steps.append({"name": name, "status": status, "seconds": int(secs or 0), "exit_code": None if rc in ("-", "") else int(rc),
                  "note": note, "log": f"logs/{name}.log", "log_tail": tail(log)})
logs = {s["name"]: read(f"{out}/logs/{s['name']}.log") for s in steps}
junit = {}  # every test of the JUnit files (ctest per test, Catch2 per test case)
import glob, xml.etree.ElementTree as ET
for path in sorted(glob.glob(f"{out}/*.xml")):
    try:
        cases_xml = ET.parse(path).getroot().iter("testcase")
    except (ET.ParseError, OSError):
        continue
    rows = []
    for tc in cases_xml:
        st = "failed" if tc.find("failure") is not None or tc.find("error") is not None else \
             "skipped" if tc.find("skipped") is not None or tc.get("status") in ("notrun", "disabled") else "passed"
        rows.append({"name": tc.get("name"), "classname": tc.get("classname"), "time_s": float(tc.get("time") or 0), "status": st})
    junit[os.path.basename(path)] = rows
cases = [json.loads(l) for l in read(f"{out}/gpu_cases.jsonl").splitlines() if l.strip()]
suites = {}
for c in cases:
    s = suites.setdefault(c["suite"], {"cases": 0, "passed": 0, "max_err_o": {}, "max_err_lse": {}})
    s["cases"] += 1; s["passed"] += bool(c["ok"])
    for k in ("max_err_o", "max_err_lse"):
        v = c[k] if isinstance(c[k], (int, float)) else float("inf")
        s[k][c["dtype"]] = max(s[k].get(c["dtype"], 0.0), v)
bench = None
for line in logs.get("gpu_bench", "").splitlines():
    if line.startswith("JSON "):
        bench = json.loads(line[5:])
if bench is not None:
    with open(f"{out}/bench.json", "w") as f: json.dump(bench, f, indent=1)
def grab(name, pattern):
    return [m.group(0) for m in re.finditer(pattern, logs.get(name, ""), re.M)]
versions = {}
for line in logs.get("versions", "").splitlines():
    if ": " in line and not line.startswith(" "):
        k, v = line.split(": ", 1); versions.setdefault(k.strip(), v.strip())
smi = {}
for line in logs.get("nvidia_smi", "").splitlines():
    if line.startswith("QUERY "):
        keys = ["gpu_name", "driver_version", "memory_total", "sm_clock_max", "power_limit", "compute_cap"]
        smi = dict(zip(keys, [x.strip() for x in line[6:].split(",")]))
failed = [s["name"] for s in steps if s["status"] in ("fail", "timeout", "no_time")]
report = {"generated_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "root": root,
          "budget_s": int(os.environ["BUDGET"]), "elapsed_s": int(os.environ["ELAPSED"]),
          "ok": not failed, "failed_steps": failed, "versions": versions, "nvidia_smi": smi,
          "device": (bench or {}).get("device"), "steps": steps,
          "gpu_tests": {"catch_summary": {n: grab(n, r"^(test cases|assertions|All tests passed).*$") for n in ("gpu_forward", "gpu_backward", "gpu_backward_wgmma", "gpu_driver", "gpu_paged", "gpu_backward_random")},
                        "suite_lines": grab("gpu_forward", r"^\w+: \d+/\d+ cases passed.*$"),
                        "suites": suites, "cases": cases},
          "unit_tests": {"summary": grab("unit_tests", r"^\d+% tests passed.*$"),
                         "failed": grab("unit_tests", r"^\s+\d+ - .*\((Failed|Timeout|SEGFAULT|Not Run|Exception).*$")},
          "sanitizers": {n: grab(n, r"^=+ ERROR SUMMARY.*$|^=+ RACECHECK SUMMARY.*$") for n in ("memcheck", "racecheck", "synccheck", "initcheck")},
          "probes": [dict(zip(("probe", "result", "words", "mismatches"), l.split())) for l in read(f"{out}/probes.txt").splitlines() if l.strip()],
          "junit": junit, "bench": bench}
with open(f"{out}/report.json", "w") as f: json.dump(report, f, indent=1)
md = [f"# attnjit device check", "",
      f"- result: **{'PASS' if not failed else 'FAIL: ' + ', '.join(failed)}** ({report['elapsed_s']} s of a {report['budget_s']} s budget, {report['generated_utc']})",
      f"- device: {smi.get('gpu_name') or (bench or {}).get('device', {}).get('name', 'none found')}"
      f" (driver {smi.get('driver_version', '?')}, {smi.get('memory_total', '?')}, compute capability {smi.get('compute_cap', '?')})"]
md += [f"- {k}: {v}" for k, v in versions.items()]
md += ["", "## Steps", "", "| step | status | seconds | note |", "| --- | --- | --- | --- |"]
md += [f"| {s['name']} | {s['status']} | {s['seconds']} | {s['note'].replace('|', '/')} |" for s in steps]
if report["probes"]:
    bad = [p for p in report["probes"] if p.get("result") != "ok"]
    md += ["", f"## Probes (hardware against the emulator's golden files): {len(report['probes']) - len(bad)} match, {len(bad)} differ", ""]
    md += [f"- {p['probe']}: {p.get('result')} ({p.get('mismatches', '')})" for p in bad]
if suites:
    md += ["", "## GPU correctness (max error = \\|got - want\\| / (1 + \\|want\\|))", "", "| suite | passed | max error o | max error lse |", "| --- | --- | --- | --- |"]
    for name, s in suites.items():
        fmt = lambda d: ", ".join(f"{k} {v:.2g}" for k, v in sorted(d.items()))
        md.append(f"| {name} | {s['passed']}/{s['cases']} | {fmt(s['max_err_o'])} | {fmt(s['max_err_lse'])} |")
    bad = [c for c in cases if not c["ok"]]
    if bad:
        md += ["", f"{len(bad)} failing case(s) (first 20):", ""]
        md += [f"- `{c['case']}` {c['dtype']} d={c['head_dim']}/{c['head_dim_v']} seq={c['seq_q']}x{c['seq_k']} "
               f"heads={c['heads_q']}/{c['heads_kv']} {c['layout']}: {c['error'] or c['first_mismatch']}" for c in bad[:20]]
if bench and bench.get("results"):
    md += ["", "## Bench (useful TFLOP/s = 4 * d * attended pairs * batch / median time; L2 flushed before each run)", "",
           "| spec | seq | pairs | density | median ms | min ms | TFLOP/s | TTFR cold ms | TTFR warm disk ms | TTFR warm memory ms | kernel |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in bench["results"]:
        if not r.get("ok"):
            md.append(f"| {r['name']} | {r['seq']} | error: {r.get('error', '')[:150]} | | | | | | | | |"); continue
        t = r.get("ttfr", {}); f = lambda x, p=3: "-" if x is None else f"{x:.{p}f}"
        md.append(f"| {r['name']} | {r['seq']} | {r['attended_pairs']} | {r['density']:.4f} | {f(r.get('median_ms'))} | {f(r.get('min_ms'))} | "
                  f"{f(r.get('tflops'), 1)} | {f(t.get('cold_ms'), 1)} | {f(t.get('warm_disk_ms'), 1)} | {f(t.get('warm_memory_ms'), 1)} | {r.get('kernel', '-')} |")
for name, rows in junit.items():
    bad = [r["name"] for r in rows if r["status"] == "failed"]
    md += ["", f"- {name}: {sum(r['status'] == 'passed' for r in rows)} passed, {len(bad)} failed, "
               f"{sum(r['status'] == 'skipped' for r in rows)} skipped" + (": " + "; ".join(bad[:10]) if bad else "")]
md += ["", "## Logs (last 40 lines of each; full logs in logs/)"]
for s in steps:
    md += ["", f"### {s['name']}: {s['status']}", "", "```", s["log_tail"].replace("```", "'''"), "```"]
with open(f"{out}/report.md", "w") as f: f.write("\n".join(md) + "\n")
PY
}

# ---- the steps ----------------------------------------------------------------------------------

step versions 30 500 '
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"; echo "host: $(hostname)"; echo "kernel: $(uname -sr)"
echo "cpus: $(nproc)"; echo "cpu: $(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2- | sed "s/^ //")"
echo "memory: $(grep MemTotal /proc/meminfo | tr -s " " | cut -d" " -f2-)"
echo "g++: $(g++ --version | head -n1)"; echo "cmake: $(cmake --version | head -n1)"
echo "nvcc: $(nvcc --version 2>/dev/null | grep -m1 release || echo none)"
echo "compute-sanitizer: $(compute-sanitizer --version 2>/dev/null | grep -m1 -i version || echo none)"
echo "python: $(python3 --version 2>&1)"
echo "torch: $(timeout 20 python3 -c "import torch; print(torch.__version__, \"cuda\", torch.version.cuda)" 2>/dev/null || echo none)"
echo "commit: ${ATTNJIT_DC_COMMIT:-not given (set ATTNJIT_DC_COMMIT to the commit whose tree runs)}"
echo "git: $(git -C "'"$root"'" rev-parse --short HEAD 2>/dev/null || echo "no .git in this copy") (the HEAD of the .git this copy carries, which may be older than its tree)"
echo "deps: $(head -n1 "'"$root"'/.deps/STAGED.txt" 2>/dev/null || echo "no .deps/ (system packages, if any)")"
'
# The Python package too, where the machine's python3 has nanobind (the GPU machine's image does).
py_opt="-DATTNJIT_PYTHON=OFF"
timeout 20 python3 -m nanobind --cmake_dir > /dev/null 2>&1 && py_opt="-DATTNJIT_PYTHON=ON -DPython_EXECUTABLE=$(command -v python3)"
step configure 180 420 "cmake -S '$root' -B '$build' -DCMAKE_BUILD_TYPE=Release -DATTNJIT_LIT_TESTS=OFF $py_opt \
  -DATTNJIT_DEPS_DIR='$root/.deps' && grep -E '^(Catch2|CLI11|nlohmann_json|CUDAToolkit_NVCC_EXECUTABLE)[_A-Za-z]*:' '$build/CMakeCache.txt'"
step build 420 330 "cmake --build '$build' -j $jobs"
# Kernels compiled ahead on a machine without a GPU (tests/device/precompile_cache.sh), where the
# tree carries them: the GPU steps find them in the cache instead of waiting for NVRTC (the Python
# tests' cache gets them too, for the kernels they share).
seed="${ATTNJIT_DC_SEED:-$root/.device-cache.txz}"
if [ -f "$seed" ]; then
  step seed_cache 60 320 "mkdir -p '$ATTNJIT_CACHE_DIR' '$build/test-kernel-cache' && tar xJf '$seed' -C '$ATTNJIT_CACHE_DIR' && \
    tar xJf '$seed' -C '$build/test-kernel-cache' && touch '$out/seed.marker' && \
    echo \"\$(find '$ATTNJIT_CACHE_DIR' -name '*.ajk' | wc -l) kernels in the cache\""
else
  skip seed_cache "no kernels compiled ahead ($seed: tests/device/precompile_cache.sh)"
fi
if command -v nvidia-smi > /dev/null; then
  step nvidia_smi 30 320 "nvidia-smi; echo; echo \"QUERY \$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit,compute_cap --format=csv,noheader | head -n1)\""
else
  skip nvidia_smi "nvidia-smi is not on this machine"
fi
step attnjit_info 30 320 "'$build/attnjit' info"

# Is there a GPU? Without one the GPU tests' main prints SKIPPED and exits 77 before Catch2 starts.
# The SKIPPED line decides: with a GPU, Catch2's --list-test-names-only exits with the number of
# tests, so the status says nothing (it would be 77 with 77 tests).
have_gpu=0
if [ -x "$build/tests/attnjit_gpu_tests" ]; then
  timeout 60 "$build/tests/attnjit_gpu_tests" --list-test-names-only > "$out/logs/gpu_probe.log" 2>&1
  probe_rc=$?
  (( probe_rc != 124 && probe_rc != 137 )) && ! grep -q '^SKIPPED' "$out/logs/gpu_probe.log" && have_gpu=1
fi
# The probes first: a difference from the golden files is a bug in the emulator's reading of the
# PTX ISA (or in the hardware's), and every later result leans on that reading.
step probes 120 300 "'$build/tests/attnjit_probes' --device gpu --report '$out/probes.txt'"
# Compute capability 9.0 runs the Hopper forward by default; the sm_80 kernel and the Hopper
# cp.async kernel then get steps of their own.
hopper=0
[ "$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' ')" = "9.0" ] && hopper=1
grep -q '^arch: sm_90a' "$out/logs/probes.log" 2>/dev/null && hopper=1
ctest_help="$(ctest --help 2>/dev/null)"
junit() { [[ "$ctest_help" == *--output-junit* ]] && echo "--output-junit '$out/$1'"; }
# The GPU tests in runs of the executable (forward, backward, the driver layer and graphs, the
# backward's random sweep),
# each with its own time and JUnit file; every forward case also lands in gpu_cases.jsonl.
gpu_run() {  # STEP TIMEOUT RESERVE FILTER
  step "$1" "$2" "$3" "cd '$build' && ATTNJIT_GPU_TEST_REPORT='$out/gpu_cases.jsonl' ./tests/attnjit_gpu_tests '$4' \
    -r junit -o '$out/catch_$1.xml'"
}
# Lanes (ATTNJIT_DC_LANES="steps;steps;..."): after the build and the probes, each group of steps
# runs in a process of its own, all at once on the one GPU, and this run waits for them; the
# kernel cache is shared (its writes are atomic renames). Correctness steps only: timings taken
# side by side mean nothing.
if [ -n "$lane_steps" ]; then
  IFS=';' read -ra lanes <<< "$ATTNJIT_DC_LANES"
  pids=()
  for i in "${!lanes[@]}"; do
    echo "== [$(elapsed)s] lane $i: ${lanes[$i]} (log: logs/lane$i.out)"
    ATTNJIT_DC_JOIN=1 ATTNJIT_DC_ONLY="${lanes[$i]}" ATTNJIT_DC_BUDGET=$(( budget - $(elapsed) )) ATTNJIT_DC_PACK=0 \
      BUILD_DIR="$build" bash "$root/tests/device/device_check.sh" "$out" > "$out/logs/lane$i.out" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  echo "== [$(elapsed)s] lanes done"
fi
if (( have_gpu )); then
  # The examples first, on their own: a kernel that never finishes (an mbarrier nobody completes)
  # costs this step's 90 seconds, not the whole forward step's, and the rest of the run goes on
  # without the path that hung (on compute capability 9.0: TMA, then the Hopper forward itself).
  gpu_run gpu_forward_examples 90 400 '[attention][examples]'
  if [ "$(status_of gpu_forward_examples)" = timeout ] && (( hopper )); then
    export ATTNJIT_TMA=0
    echo "gpu_forward_examples timed out: the later steps run with ATTNJIT_TMA=0" | tee -a "$out/logs/gpu_forward_examples.log"
    gpu_run gpu_forward_examples_cpasync 90 380 '[attention][examples]'
    if [ "$(status_of gpu_forward_examples_cpasync)" = timeout ]; then
      export ATTNJIT_SM90A=0
      echo "the cp.async Hopper forward timed out too: the later steps run with ATTNJIT_SM90A=0" | tee -a "$out/logs/gpu_forward_examples_cpasync.log"
    fi
  fi
  gpu_run gpu_forward 300 280 '[attention]~[graph]~[examples]'
  # The backward's random sweep compiles a kernel set per case (about 100 s on a fresh machine): a
  # step of its own, after the driver and graph tests, so that a short budget cuts it and not them.
  gpu_run gpu_backward 300 250 '[grad]~[random]~[sm90a]'  # about 160 s on an H200
  # The Hopper wgmma backward (both kernels, every example): about 36 kernel sets to compile.
  gpu_run gpu_backward_wgmma 300 250 '[grad][sm90a]'
  gpu_run gpu_driver 90 240 '~[attention]~[grad]~[paged],[graph]'
  # The paged forward (decode and chunked prefill over a paged KV cache): its own kernels.
  gpu_run gpu_paged 150 220 '[paged]'
  gpu_run gpu_backward_random 280 200 '[grad][random]'
  # On compute capability 9.0 the steps above ran the Hopper forward (sm_90a: wgmma, the TMA
  # kernel where tensor maps describe the keys). The sm_80 kernel, which A100s run and H100s run
  # with ATTNJIT_SM90A=0, gets the same forward cases; the Hopper cp.async kernel the examples.
  if (( hopper )); then
    step gpu_forward_sm80 200 200 "cd '$build' && ATTNJIT_SM90A=0 ATTNJIT_GPU_TEST_REPORT='$out/gpu_cases_sm80.jsonl' \
      ./tests/attnjit_gpu_tests '[attention][examples],[attention][random],[attention][configs]' -r junit -o '$out/catch_gpu_forward_sm80.xml'"
    step gpu_forward_sm90a_cpasync 120 190 "cd '$build' && ATTNJIT_TMA=0 \
      ./tests/attnjit_gpu_tests '[attention][examples]' -r junit -o '$out/catch_gpu_forward_sm90a_cpasync.xml'"
  else
    skip gpu_forward_sm80 "not a compute capability 9.0 GPU (the steps above ran the sm_80 kernel)"
    skip gpu_forward_sm90a_cpasync "not a compute capability 9.0 GPU"
  fi
else
  skip gpu_forward "no GPU ($(head -c 200 "$out/logs/gpu_probe.log" 2>/dev/null))"
  skip gpu_backward "no GPU"
  skip gpu_backward_wgmma "no GPU"
  skip gpu_driver "no GPU"
  skip gpu_paged "no GPU"
  skip gpu_backward_random "no GPU"
  skip gpu_forward_sm80 "no GPU"
  skip gpu_forward_sm90a_cpasync "no GPU"
fi
# The Python package on the GPU (its GPU subset: examples forward and backward, side streams, CUDA
# graphs, torch.compile with inductor), when the build made it.
if [ -d "$build/python/attnjit" ]; then
  # The entries that touch the GPU: the package's tests and its examples. The others (distributed
  # over gloo, which needs two GPUs for NCCL; the benchmarks' CPU smoke runs; the scaling model; the
  # wheel) run on the CPU alike and run in CI.
  step python_tests 280 190 "cd '$build' && ctest -L python -R '^(python|python_examples)\$' -j 2 --output-on-failure --timeout 270 $(junit ctest_python.xml)"
else
  skip python_tests "the build made no Python package (python3 -m nanobind not found)"
fi

sanitizer="$(command -v compute-sanitizer || true)"
san_args="--error-exitcode 1 --print-limit 20 '$build/tests/attnjit_gpu_tests' '[sanitize]'"
if (( ! have_gpu )); then
  for tool in memcheck racecheck synccheck initcheck; do skip $tool "no GPU"; done
elif [ -z "$sanitizer" ]; then
  for tool in memcheck racecheck synccheck initcheck; do skip $tool "compute-sanitizer not found (PATH, /usr/local/cuda/bin)"; done
else
  # initcheck: every byte a kernel reads was written first (by an upload, a memset or a kernel).
  step memcheck 150 150 "'$sanitizer' --tool memcheck $san_args"
  step racecheck 150 120 "'$sanitizer' --tool racecheck $san_args"
  step synccheck 150 100 "'$sanitizer' --tool synccheck $san_args"
  step initcheck 150 80 "'$sanitizer' --tool initcheck $san_args"
fi

specs=()
for f in "$root"/examples/*.json; do grep -q '"attnjit_manifest"' "$f" || specs+=("$f"); done
step gpu_bench 240 60 "'$build/bench/attnjit_gpu_bench' --seq 4096,16384 --heads 16 --head-dim 128 --dtype bf16 --batch 1 ${specs[*]}"
# On compute capability 9.0 the numbers above are the Hopper forward's; the same forward benchmark
# on the sm_80 kernel and on the Hopper cp.async kernel, beside them (the backward is the same
# kernel on every path, and its first-result times are the step above's).
if (( hopper )); then
  step gpu_bench_sm80 240 60 "ATTNJIT_SM90A=0 '$build/bench/attnjit_gpu_bench' --seq 4096,16384 --heads 16 --head-dim 128 --dtype bf16 --batch 1 --no-ttfr --no-backward ${specs[*]}"
  step gpu_bench_sm90a_cpasync 240 60 "ATTNJIT_TMA=0 '$build/bench/attnjit_gpu_bench' --seq 4096,16384 --heads 16 --head-dim 128 --dtype bf16 --batch 1 --no-ttfr --no-backward ${specs[*]}"
else
  skip gpu_bench_sm80 "not a compute capability 9.0 GPU"
  skip gpu_bench_sm90a_cpasync "not a compute capability 9.0 GPU"
fi
# BigBird's random blocks decided in the kernels (the seek) against planned, on the same shapes
# (ATTNJIT_RANDOM_IN_KERNEL: 0 always in the kernels; a huge value never).
bigbird="$root/examples/bigbird.json"
for mode in planned:1000000000000000000 in_kernel:0; do
  step "gpu_bench_random_${mode%%:*}" 90 90 "ATTNJIT_RANDOM_IN_KERNEL=${mode#*:} '$build/bench/attnjit_gpu_bench' --seq 16384,65536 --heads 16 --head-dim 128 --dtype bf16 --batch 1 --no-ttfr --no-backward '$bigbird'"
done
# Last, with what is left: the CPU-side tests (CI runs them on every push; here they show the GPU
# machine's toolchain builds and passes them too).
unit_filter="-E 'every template variant compiles'"
[ "${ATTNJIT_DC_FULL_UNIT:-0}" = 1 ] && unit_filter="" && export ATTNJIT_TEST_SWEEP=1  # the compile matrices whole
step unit_tests 240 0 "cd '$build' && ctest -LE 'gpu|python|sweep' $unit_filter -j $jobs --output-on-failure --timeout 230 $(junit ctest_unit.xml)"

[ "${ATTNJIT_DC_JOIN:-0}" = 1 ] && exit 0  # the run that started this lane writes the report last
# What the GPU steps compiled here beyond the kernels carried in: what the precompile missed,
# added to seed_cache's log (a count, never a failure of the run).
if [ -f "$out/seed.marker" ]; then
  echo "after the GPU steps: $(find "$ATTNJIT_CACHE_DIR" -name '*.ajk' -newer "$out/seed.marker" | wc -l) kernels" \
    "compiled on this machine (not in the carried cache)" >> "$out/logs/seed_cache.log"
fi
write_report
echo "== [$(elapsed)s] done: $out/report.md, $out/report.json"
failed="$(awk -F'\t' '$2=="fail"||$2=="timeout"||$2=="no_time"{printf "%s ", $1}' "$steps")"
if [ "${ATTNJIT_DC_PACK:-0}" = 1 ]; then  # everything in one archive beside the two reports
  tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")" && \
    find "$out" -mindepth 1 ! -name report.md ! -name report.json -exec rm -rf {} + && echo "packed: $out.tgz"
fi
if [ -n "$failed" ]; then
  echo "FAILED steps: $failed"
  exit 1
fi
exit 0
