"""attnjit.Pattern: loading, validation errors, canonical form and hash, stats and masks."""
import json
import os

import numpy as np
import pytest

import attnjit
from conftest import EXAMPLES, example_specs


@pytest.mark.parametrize("path", example_specs(), ids=lambda p: p.stem)
def test_load_and_from_json_agree(path):
    a = attnjit.Pattern.load(path)
    b = attnjit.Pattern.from_json(json.loads(path.read_text()))
    c = attnjit.Pattern.from_json(path.read_text())
    assert a == b == c and a.hash == b.hash and len(a.hash) == 16
    assert a.canonical.startswith("attnjit-pattern v1")


def test_equal_meanings_hash_equally():
    a = attnjit.Pattern.from_json({"attnjit": 1, "branches": [{"segment": 64, "dilation": 1}]})
    b = attnjit.Pattern.from_json({"attnjit": 1, "description": "same", "branches": [{"segment": 64}]})
    assert a == b and hash(a) == hash(b)


def test_a_bad_spec_names_the_field():
    with pytest.raises(attnjit.PatternError, match=r"/branches/1/dilation: dilation must be >= 1, got 0"):
        attnjit.Pattern.from_json({"attnjit": 1, "branches": [{"segment": 64}, {"segment": 64, "dilation": 0}]})
    assert issubclass(attnjit.PatternError, ValueError)
    with pytest.raises(TypeError, match="expected a str or a dict"):
        attnjit.Pattern.from_json(3)
    for bad in (float("nan"), float("inf")):  # no JSON holds them: named, not an 'invalid JSON' parse error
        with pytest.raises(attnjit.PatternError, match="NaN or infinite"):
            attnjit.Pattern.from_json({"attnjit": 1, "scale": bad, "branches": [{"segment": 64}]})
    with pytest.raises(FileNotFoundError):
        attnjit.Pattern.load(EXAMPLES / "no_such_pattern.json")


def test_mask_counts_and_stats_agree():
    p = attnjit.Pattern.load(EXAMPLES / "longnet.json")
    m = p.mask(300, 4, q_offset=7)
    assert m.dtype == np.uint8 and m.shape == (4, 300, 300)
    st = p.stats(300, 4, q_offset=7)
    assert int(m.sum()) == st["attended_pairs"] == sum(st["pairs_per_head"]) == sum(st["pairs_per_branch"])
    assert st["empty_rows"] == int((m.sum(axis=2) == 0).sum())
    # Distinct pairs: a key once however many branches attend it (LongNet's branches overlap).
    assert st["distinct_pairs"] == int((m > 0).sum()) < st["attended_pairs"]
    assert st["distinct_density"] == pytest.approx(st["distinct_pairs"] / m.size)
    # Dense branch 0 (segment 2048): every query of a segment attends every key of it at least once.
    assert (m[:, :, :] >= 1)[0, 10, :290].all()


def test_dilated_mask_by_hand():
    # One branch, segment 8, dilation 2, offset head_mod: head h selects positions with l mod 2 == h mod 2.
    p = attnjit.Pattern.from_json({"attnjit": 1, "branches": [{"segment": 8, "dilation": 2}]})
    m = p.mask(16, 2)
    want = np.zeros((2, 16, 16), dtype=np.uint8)
    for h in range(2):
        for i in range(16):
            for j in range(16):
                want[h, i, j] = i // 8 == j // 8 and i % 8 % 2 == h and j % 8 % 2 == h
    np.testing.assert_array_equal(m, want)


def test_a_huge_mask_is_refused_clearly():
    p = attnjit.Pattern.load(EXAMPLES / "longnet.json")
    with pytest.raises(attnjit.AttnjitError, match="over 2\\^30"):
        p.mask(65536, 16)


def test_explicit_blocks_outside_a_whole_sequence_are_refused_by_mask():
    # As `attnjit run` without offsets: mask() of a whole sequence (offsets 0) refuses a block past
    # it. With offsets the call may be one chunk of a longer sequence, where the block may lie
    # beyond the chunk (and attends nothing there) or inside it; stats() is what the
    # sequence-parallel planners call per chunk, so it never refuses.
    p = attnjit.Pattern.from_json({"attnjit": 1, "branches": [{"segment": "full", "layout": {
        "block": 8, "explicit": {"blocks": [[0, 0], [100, 100]]}}}]})
    with pytest.raises(attnjit.AttnjitError, match="block \\[100, 100\\] lies outside the sequence"):
        p.mask(24, 1)
    assert p.mask(24, 1, q_offset=8, k_offset=8).sum() == 0  # neither block among rows and keys 8..31
    assert p.mask(24, 1, q_offset=800, k_offset=800).sum() == 8 * 8  # block 100 is rows and keys 800..807
    assert p.stats(24, 1)["attended_pairs"] == 8 * 8  # the chunk of rows 0..23: block 0 only
    assert p.stats(24, 1, q_offset=800, k_offset=800)["attended_pairs"] == 8 * 8


def test_the_ops_carry_the_spec_on_one_line():
    p = attnjit.Pattern.load(EXAMPLES / "longnet.json")
    assert "\n" in p.spec and "\n" not in p.op_spec
    assert attnjit.Pattern.from_json(p.op_spec) == p


def _cli():
    """The attnjit CLI next to the package in a build tree (build/python/attnjit -> build/attnjit)."""
    import pathlib
    exe = pathlib.Path(attnjit.__file__).resolve().parent.parent.parent / "attnjit"
    return exe if exe.is_file() else None


@pytest.mark.parametrize("stage,args,cli", [
    ("pattern", {}, []),
    ("plan", {"seq": 300, "heads": 4, "heads_kv": 2, "q_offset": 5, "head_dim": 96},
     ["--seq", "300", "--heads-q", "4", "--heads-kv", "2", "--q-offset", "5", "--head-dim", "96"]),
    ("plan-bwd", {"seq": 300, "heads": 2, "tile": (32, 64), "head_dim": 64}, ["--seq", "300", "--heads-q", "2", "--tile", "32x64"]),
    ("plan", {"seq": 4096, "heads": 2, "tile": (32, 32), "head_dim": 64, "pack_branches": True},
     ["--seq", "4096", "--heads-q", "2", "--tile", "32x32", "--head-dim", "64", "--pack-branches"]),
    ("cuda", {"head_dim": 64, "dtype": "fp16", "arch": "sm_90"}, ["--head-dim", "64", "--dtype", "fp16", "--arch", "sm_90"]),
    ("cuda", {"head_dim": 64, "backward": True}, ["--head-dim", "64", "--backward"]),
    ("sass", {"head_dim": 64, "arch": "sm_80"}, ["--head-dim", "64", "--arch", "sm_80"]),
    ("plan-paged", {"kv_lens": [1, 3000, 70], "queries": [1, 4, 0], "heads": 4, "heads_kv": 2, "head_dim": 128},
     ["--kv-lens", "1,3000,70", "--queries", "1,4,0", "--heads-q", "4", "--heads-kv", "2", "--head-dim", "128"]),
    ("cuda", {"head_dim": 64, "paged": True, "heads": 8, "heads_kv": 2},
     ["--head-dim", "64", "--paged", "--heads-q", "8", "--heads-kv", "2"]),
])
def test_dump_prints_what_the_cli_prints(stage, args, cli):
    import subprocess
    exe = _cli()
    if exe is None:
        pytest.skip("no attnjit CLI beside the package (an installed wheel): nothing to compare with")
    path = EXAMPLES / "longnet.json"
    want = subprocess.run([str(exe), "dump", str(path), "--stage", stage, *cli], capture_output=True, text=True, check=True).stdout
    assert attnjit.dump(path, stage, **args) == want


def test_dump_stages_and_errors():
    p = attnjit.Pattern.load(EXAMPLES / "causal_local.json")
    assert attnjit.dump(p).startswith(f"; pattern {p.hash}\n")
    assert "work items:" in attnjit.dump(p, "plan", seq=512, heads=2)
    assert ".entry attnjit_fwd_" in attnjit.dump(p, "ptx", head_dim=64, arch="sm_80")
    with pytest.raises(attnjit.AttnjitError, match="seq: is required for stage plan"):
        attnjit.dump(p, "plan")
    assert "HMMA" in attnjit.dump(p, "sass", head_dim=64, arch="sm_80")
    with pytest.raises(attnjit.AttnjitError, match='stage: expected one of pattern, plan, plan-bwd, plan-paged, cuda, ptx, sass, got "llvm"'):
        attnjit.dump(p, "llvm")
    with pytest.raises(attnjit.AttnjitError, match="kv_lens: is required for stage plan-paged"):
        attnjit.dump(p, "plan-paged")
    with pytest.raises(attnjit.AttnjitError, match=r"queries: has 1 entries for 2 requests \(kv_lens\)"):
        attnjit.dump(p, "plan-paged", kv_lens=[5, 6], queries=[1])
    with pytest.raises(attnjit.AttnjitError, match="backward: applies to stage cuda, ptx and sass"):
        attnjit.dump(p, "plan", seq=64, backward=True)
    with pytest.raises(attnjit.AttnjitError, match="pack_branches: applies to stage plan; the backward's plans are never packed"):
        attnjit.dump(p, "plan-bwd", seq=64, pack_branches=True)
    longnet = attnjit.Pattern.load(EXAMPLES / "longnet.json")
    assert "packed: " not in attnjit.dump(longnet, "plan", seq=4096, heads=2)
    packed = attnjit.dump(longnet, "plan", seq=4096, heads=2, pack_branches=True)
    assert "tiles left out" in packed and "keys stand for up to" in packed
    with pytest.raises(ValueError, match="arch: expected"):
        attnjit.dump(p, "cuda", arch="ampere")
    # The Hopper kernels: sm_90a keeps its suffix (warpgroup MMA and TMA in the PTX); others have none.
    ptx = attnjit.dump(p, "ptx", head_dim=64, arch="sm_90a")
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert "aj_fwd_sm90_tma(p, maps);" in attnjit.dump(p, "cuda", head_dim=64, arch="sm_90a")
    assert "aj_fwd_sm90" not in attnjit.dump(p, "cuda", head_dim=64, arch="sm_90")
    with pytest.raises(attnjit.AttnjitError, match="arch-specific kernels for sm_90a only"):
        attnjit.dump(p, "cuda", arch="sm_80a")


def test_precompile_fills_a_cache_and_reports(tmp_path):
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"attnjit_manifest": 1, "entries": [
        {"patterns": [str(EXAMPLES / "causal_local.json")], "head_dims": [32], "dtypes": ["fp32"], "tiles": ["default", "16x16"]}]}))
    first = attnjit.precompile(manifest, ["sm_80"], cache_dir=tmp_path / "cache", jobs=2)
    assert (first["kernels"], first["compiled"], first["cached"], first["failed"]) == (2, 2, 0, 0)
    assert first["cache_dir"] == str(tmp_path / "cache")
    again = attnjit.precompile(manifest, "sm_80", cache_dir=tmp_path / "cache")
    assert (again["compiled"], again["cached"]) == (0, 2)
    manifest.write_text(json.dumps({"attnjit_manifest": 1, "entries": [{"patterns": ["x.json"]}]}))
    with pytest.raises(attnjit.AttnjitError, match="/entries/0: needs \"patterns\""):
        attnjit.precompile(manifest, ["sm_80"], cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="arch: expected"):
        attnjit.precompile(manifest, ["ampere"])


def test_the_extension_exports_no_library_symbols():
    """attnjit's own functions and its nlohmann::json instantiations stay inside the extension: a
    process that loaded PyTorch (which exports nlohmann::json with RTLD_GLOBAL) once bound the
    extension's calls to those and crashed."""
    import shutil
    import subprocess
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm (binutils) to list the extension's dynamic symbols")
    out = subprocess.run([nm, "-D", "--defined-only", "-C", attnjit._attnjit.__file__], capture_output=True, text=True,
                         check=True).stdout
    names = [line.split(" ", 2)[-1] for line in out.splitlines() if line.strip()]
    assert "PyInit__attnjit" in names
    leaked = [n for n in names if n.startswith("attnjit::") or "nlohmann" in n]
    assert leaked == [], leaked[:5]


def test_info_names_the_shipped_databases_and_the_cpu_executor():
    info = attnjit.info()
    assert info["version"] == attnjit.__version__
    assert info["cpu_executor"] in ("generic", "avx2", "avx512")
    # In the build tree the shipped databases are the source tree's autotune_db/ (compiled in),
    # unless ATTNJIT_SHIPPED_DB_DIR says otherwise ("none": no shipped databases).
    env = os.environ.get("ATTNJIT_SHIPPED_DB_DIR")
    if env == "none":
        assert info["shipped_db_dir"] == ""
    else:
        assert os.path.isfile(os.path.join(info["shipped_db_dir"], "NVIDIA_H100_80GB_HBM3.json")), info


def test_bitmap_layouts_mean_their_blocks():
    bitmap = attnjit.Pattern.from_json({"attnjit": 1, "branches": [
        {"segment": "full", "layout": {"block": 16, "explicit": {"bitmap": ["1", "011", "0001"]}}}]})
    pairs = attnjit.Pattern.from_json({"attnjit": 1, "branches": [
        {"segment": "full", "layout": {"block": 16, "explicit": {"blocks": [[0, 0], [1, 1], [1, 2], [2, 3]]}}}]})
    assert bitmap == pairs and hash(bitmap) == hash(pairs)
    assert (bitmap.mask(64, 2) == pairs.mask(64, 2)).all()
    with pytest.raises(attnjit.PatternError, match=r"/explicit/bitmap/1: character 0 is '2'"):
        attnjit.Pattern.from_json({"attnjit": 1, "branches": [
            {"segment": "full", "layout": {"explicit": {"bitmap": ["1", "2"]}}}]})


def test_hierarchical_layouts_keep_what_some_level_keeps():
    # The definition, evaluated here pair by pair, against attnjit's mask (the reference's).
    levels = [{"window": 1}, {"window": 3, "stride": 2, "block": [16, 32]}, {"stride": 5, "block": 48}]
    p = attnjit.Pattern.from_json({"attnjit": 1, "branches": [
        {"segment": "full", "layout": {"block": 8, "hierarchical": levels}}]})
    S = 200
    want = np.zeros((S, S), dtype=np.uint8)
    for lv in levels:
        bq, bk = (lv["block"] if isinstance(lv.get("block"), list) else [lv.get("block", 8)] * 2)
        w, s = lv.get("window", -1), lv.get("stride", 1)
        qb = np.arange(S)[:, None] // bq
        kb = np.arange(S)[None, :] // bk
        want |= (((w < 0) | (np.abs(kb - qb) <= w)) & (kb % s == 0)).astype(np.uint8)
    got = p.mask(S, 1)
    assert got.shape == (1, S, S)
    assert (got[0] == want).all()


def test_info_lists_the_nvrtc_wheels_the_package_registered():
    # The package registers PyPI's NVRTC wheels it can import (attnjit/__init__.py); with CUDA 12's
    # (nvidia-cuda-nvrtc-cu12, installed by scripts/setup_deps.sh) Pascal and Volta compile through it.
    import importlib.util

    spec = importlib.util.find_spec("nvidia.cuda_nvrtc")
    if spec is None or os.environ.get("ATTNJIT_NVRTC"):
        pytest.skip("needs the nvidia-cuda-nvrtc-cu12 wheel and no ATTNJIT_NVRTC (which replaces the search)")
    wheel_lib = os.path.realpath(os.path.join(list(spec.submodule_search_locations)[0], "lib"))
    info = attnjit.info()
    cuda12 = [n for n in info["nvrtc"] if n["version"].startswith("12.")]
    assert len(cuda12) == 1, info["nvrtc"]
    assert os.path.dirname(cuda12[0]["path"]) == wheel_lib
    assert 61 in cuda12[0]["serves"] and 70 in cuda12[0]["serves"] and 61 in cuda12[0]["archs"]
    newest = info["nvrtc"][0]
    assert newest["version"] == info["nvrtc_version"]
    if not newest["version"].startswith("12."):
        assert 90 in newest["serves"] and 90 not in cuda12[0]["serves"]
