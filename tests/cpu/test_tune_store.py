"""rawflux.tune's persistent tables: TuneStore merges puts from concurrent processes, ignores (and
rewrites) a file it cannot read, reads the flat format of earlier releases; fused_key; the tuner's
lookup/store through it; RAWFLUX_TUNE and RAWFLUX_TUNE_BUDGET_S validation."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import warnings

import pytest

from rawflux import env, tune
from rawflux.tune import tuner
from rawflux.tune.store import VERSION, TuneStore


def _put_many(path, worker, count, start):
    start.wait()  # every writer starts together, so their puts overlap
    store = TuneStore(path)
    for i in range(count):
        store.put(f"w{worker}-{i}", {"worker": worker, "i": i})


def test_concurrent_writers_lose_no_entry(tmp_path):
    path, workers, count = tmp_path / "t.json", 4, 25
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=_put_many, args=(path, w, count, start)) for w in range(workers)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    got = TuneStore(path).entries()
    assert len(got) == workers * count
    assert all(got[f"w{w}-{i}"] == {"worker": w, "i": i} for w in range(workers) for i in range(count))
    assert json.loads(path.read_text())["version"] == VERSION
    assert not list(tmp_path.glob("*.tmp"))  # no temp file left behind


def test_put_merges_what_another_process_stored(tmp_path):
    path = tmp_path / "t.json"
    mine, theirs = TuneStore(path), TuneStore(path)
    mine.put("a", {"us": 1.0})
    theirs.put("b", {"us": 2.0})  # read before "a" was on disk: must not drop it
    mine.put("a", {"us": 0.5})  # replaces its own key, keeps "b"
    assert mine.entries() == {"a": {"us": 0.5}, "b": {"us": 2.0}}
    assert TuneStore(path).entries() == mine.entries()


@pytest.mark.parametrize("content, why", [
    (b"\x00\xff{garbage", "cannot be read|not valid JSON"),
    (b"not json at all", "not valid JSON"),
    (b'[{"config": 1}]', "not a table"),
    (b'{"key": 3}', "not a table"),
    (json.dumps({"version": VERSION + 1, "entries": {"k": {"us": 1.0}}}).encode(), "schema version"),
])
def test_an_unreadable_file_warns_once_and_is_rewritten(tmp_path, content, why):
    path = tmp_path / "t.json"
    path.write_bytes(content)
    store = TuneStore(path)
    with pytest.warns(RuntimeWarning, match=why) as rec:
        assert store.get("k") is None
        assert store.entries() == {}
        store.put("new", {"us": 3.0})  # re-reads the bad file under the lock: still one warning
    assert len(rec) == 1 and str(path) in str(rec[0].message) and "rewritten" in str(rec[0].message)
    assert json.loads(path.read_text()) == {"version": VERSION, "entries": {"new": {"us": 3.0}}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert TuneStore(path).entries() == {"new": {"us": 3.0}}


def test_the_flat_format_of_earlier_releases_is_read_and_kept(tmp_path):
    path = tmp_path / "gemm_tune.json"
    old = {"1,2,3,bf16,nk,bf16,sm132,cc90": {"config": "x", "us": 4.0}}
    path.write_text(json.dumps(old))
    store = TuneStore(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert store.get("1,2,3,bf16,nk,bf16,sm132,cc90") == {"config": "x", "us": 4.0}
        store.put("other", {"us": 1.0})
    assert json.loads(path.read_text()) == {"version": VERSION, "entries": {**old, "other": {"us": 1.0}}}


def _unwritable(tmp_path, how):
    if how == "chmod":
        if os.name != "posix" or os.geteuid() == 0:
            pytest.skip("needs a user that permissions bind")
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o555)
        return folder / "t.json"
    (tmp_path / "file").write_text("")
    return tmp_path / "file" / "t.json"  # its folder is a file: no user can create it


@pytest.mark.parametrize("how", ["chmod", "not a folder"])
def test_an_unwritable_folder_keeps_results_in_this_process(tmp_path, how):
    path = _unwritable(tmp_path, how)
    try:
        store = TuneStore(path)
        with pytest.warns(RuntimeWarning, match="this process only") as rec:
            store.put("a", {"us": 1.0})
            store.put("b", {"us": 2.0})
        assert len(rec) == 1 and str(path) in str(rec[0].message)
        assert store.entries() == {"a": {"us": 1.0}, "b": {"us": 2.0}} and store.get("b") == {"us": 2.0}
        assert not os.path.exists(path)
    finally:
        if how == "chmod":
            path.parent.chmod(0o755)


_BASE = dict(shape={"m": 4096, "n": 8192, "k": 1024, "layout": "nk"}, dtype="bf16", world=8, ranks_per_gpu=1,
             topology="p2p", gpu="NVIDIA H200", sms=132, versions={"rawflux": "0.3.0", "driver": "12.4", "nvrtc": "12.4"})


@pytest.mark.parametrize("field, other", [
    ("world", 4), ("ranks_per_gpu", 2), ("topology", "shared-gpu"), ("topology", "no-p2p"), ("gpu", "NVIDIA H100"),
    ("sms", 114), ("dtype", "f16"),
    ("shape", {"m": 4096, "n": 8192, "k": 2048, "layout": "nk"}), ("shape", {"m": 4096, "n": 8192, "k": 1024, "layout": "kn"}),
    ("versions", {"rawflux": "0.3.1", "driver": "12.4", "nvrtc": "12.4"}),
    ("versions", {"rawflux": "0.3.0", "driver": "12.6", "nvrtc": "12.4"}),
    ("versions", {"rawflux": "0.3.0", "driver": "12.4", "nvrtc": "12.6"}),
])
def test_fused_key_separates_every_field(field, other):
    assert tune.fused_key("ag_gemm", **{**_BASE, field: other}) != tune.fused_key("ag_gemm", **_BASE)


def test_fused_key_is_stable_and_names_the_op():
    key = tune.fused_key("ag_gemm", **_BASE)
    shuffled = {**_BASE, "shape": dict(reversed(list(_BASE["shape"].items()))),
                "versions": dict(reversed(list(_BASE["versions"].items())))}
    assert tune.fused_key("ag_gemm", **shuffled) == key
    assert tune.fused_key("gemm_rs", **_BASE) != key
    assert "ag_gemm" in key and "NVIDIA H200" in key and "4096" in key


def test_tuner_lookup_and_store_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("RAWFLUX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("RAWFLUX_TUNE", "cached")
    cfg = tune.GemmConfig(next(iter(tune.TILES)), tune.Decomp.split_k(2))
    key = tune.tune_key(256, 512, 1024, "bf16", "nk", "bf16", tune.DeviceInfo(132, (9, 0), 50 << 20, "fake"))
    assert tune.lookup(key) is None
    tune.store(key, cfg, 12.5)
    assert tune.lookup(key) == cfg
    on_disk = json.loads((tmp_path / "gemm_tune.json").read_text())
    assert on_disk["entries"][key] == {"config": cfg.to_json(), "us": 12.5}
    tuner._stores.clear()  # a fresh process reads it from disk
    assert tune.lookup(key) == cfg
    monkeypatch.setenv("RAWFLUX_TUNE", "off")
    assert tune.lookup(key) is None
    # the fused ops' table is another file in the same folder
    tune.fused_store().put("f", {"us": 1.0})
    assert tune.fused_store().path == tmp_path / "fused_tune.json" and tune.gemm_store().get("f") is None


@pytest.mark.parametrize("raw, mode", [(None, "cached"), ("", "cached"), ("off", "off"), (" ON ", "on"), ("Cached", "cached")])
def test_tune_mode_values(monkeypatch, raw, mode):
    if raw is None:
        monkeypatch.delenv("RAWFLUX_TUNE", raising=False)
    else:
        monkeypatch.setenv("RAWFLUX_TUNE", raw)
    assert env.tune_mode() == mode


def test_tune_mode_refuses_an_unknown_value(monkeypatch):
    monkeypatch.setenv("RAWFLUX_TUNE", "bogus")
    with pytest.raises(ValueError, match=r"RAWFLUX_TUNE.*off, cached or on.*'bogus'"):
        env.tune_mode()


@pytest.mark.parametrize("raw, val", [(None, 120.0), ("", 120.0), ("30", 30.0), (" 2.5 ", 2.5)])
def test_tune_budget_values(monkeypatch, raw, val):
    if raw is None:
        monkeypatch.delenv("RAWFLUX_TUNE_BUDGET_S", raising=False)
    else:
        monkeypatch.setenv("RAWFLUX_TUNE_BUDGET_S", raw)
    assert env.tune_budget_s() == val


@pytest.mark.parametrize("raw", ["0", "-5", "nan", "ten", "1s"])
def test_tune_budget_refuses_a_bad_value(monkeypatch, raw):
    monkeypatch.setenv("RAWFLUX_TUNE_BUDGET_S", raw)
    with pytest.raises(ValueError, match=f"RAWFLUX_TUNE_BUDGET_S.*positive.*{raw!r}"):
        env.tune_budget_s()
