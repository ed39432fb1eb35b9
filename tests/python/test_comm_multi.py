"""molora.comm_multi: the planning, arithmetic and table of the multi-process all-reduce run,
on the CPU (the run itself needs GPUs: `tools/gpu-check run comm` rehearses it on one)."""

import pytest

from molora import comm_multi as cm


def test_parse_worlds():
    assert cm.parse_worlds("2,4,8") == [2, 4, 8]
    assert cm.parse_worlds(" 8 , 1,") == [8, 1]
    for bad, msg in [("", "no world"), ("2,x", "not an integer"), ("0", "outside 1..8"),
                     ("9", "outside 1..8"), ("2,2", "twice")]:
        with pytest.raises(ValueError, match=msg):
            cm.parse_worlds(bad)


def test_plan_worlds():
    # default: 2, 4, 8 up to the GPUs there are
    assert cm.plan_worlds(None, 8, False)["run"] == [2, 4, 8]
    assert cm.plan_worlds(None, 4, False)["run"] == [2, 4]
    # one GPU: world 1 only, unless the ranks share it
    assert cm.plan_worlds(None, 1, False)["run"] == [1]
    assert cm.plan_worlds(None, 1, True)["run"] == [2, 4, 8]
    p = cm.plan_worlds([1, 2, 8], 2, False)
    assert p["run"] == [1, 2]
    assert "needs 8 GPUs, this machine has 2" in p["skipped"][8]
    assert cm.plan_worlds([8], 1, True)["run"] == [8]
    assert cm.plan_worlds([2], 0, False)["error"] == "no CUDA device"


def test_bus_bandwidth():
    # 2 (w - 1) / w * bytes / time: 8 ranks, 1 MB in 10 us -> 1.75 * 1e6 / 1e-5 = 175 GB/s
    assert cm.bus_gbps(1_000_000, 8, 10.0) == pytest.approx(175.0)
    assert cm.bus_gbps(1_000_000, 2, 10.0) == pytest.approx(100.0)
    assert cm.bus_gbps(1_000_000, 1, 10.0) == 0.0
    assert cm.bus_gbps(1_000_000, 8, 0.0) == 0.0


def test_sizes_and_names():
    assert cm.CHECK_SIZES[0] == 16 and cm.CHECK_SIZES[-1] == 16 << 20
    assert cm.SPEED_SIZES[0] == 1024 and cm.SPEED_SIZES[-1] == 16 << 20
    assert all(s % 16 == 0 for s in cm.CHECK_SIZES)
    assert cm.fmt_bytes(16) == "16 B" and cm.fmt_bytes(4096) == "4 KiB"
    assert cm.fmt_bytes(16 << 20) == "16 MiB" and cm.fmt_bytes(1536) == "1536 B"


def _row(nbytes, world, molora_us, nccl_us, symm_us=None):
    r = {"bytes": nbytes, "molora_us": molora_us, "nccl_us": nccl_us, "symm_us": symm_us,
         "torch_us": nccl_us, "molora_gbps": cm.bus_gbps(nbytes, world, molora_us),
         "nccl_gbps": cm.bus_gbps(nbytes, world, nccl_us) if nccl_us else None}
    for a in cm.ALGOS:
        r[a + "_us"], r[a + "_p2p"] = molora_us, True
    return r


def test_targets_met_and_missed():
    met = [_row(1024, 8, 5.0, 12.0), _row(256 << 10, 8, 10.0, 20.0), _row(4 << 20, 8, 40.0, 45.0)]
    lines = cm.judge_targets(8, met)
    assert len(lines) == 2 and all(line.endswith("MET") for line in lines)
    assert "worst 2.00x at 256 KiB" in lines[0]
    missed = [_row(1024, 8, 5.0, 9.0), _row(16 << 20, 8, 100.0, 90.0)]
    lines = cm.judge_targets(8, missed)
    assert lines[0].endswith("MISSED") and "1.80x at 1 KiB" in lines[0]
    assert lines[1].endswith("MISSED")
    # the latency target is world 8's; no NCCL time, no target line
    assert len(cm.judge_targets(2, met)) == 1
    assert cm.judge_targets(8, [_row(1024, 8, 5.0, None)]) == []


def test_world_one_has_no_bandwidth_target():
    # world 1 moves no bytes between ranks (bus bandwidth 0): the first GPU run divided by it
    rows = [_row(4 << 20, 1, 3.0, 2.0), _row(16 << 20, 1, 9.0, 8.0)]
    assert rows[0]["molora_gbps"] == 0 and rows[0]["nccl_gbps"] == 0
    assert cm.judge_targets(1, rows) == []
    lines = cm.judge_targets(2, [_row(4 << 20, 2, 30.0, 20.0), _row(16 << 20, 2, 90.0, 95.0)])
    assert len(lines) == 1 and lines[0].endswith("MISSED") and "at 4 MiB" in lines[0]


def test_symmetric_kernel_target():
    rows = [_row(1024, 8, 5.0, 12.0, symm_us=6.0), _row(64 << 10, 8, 7.0, 15.0, symm_us=6.5)]
    lines = cm.judge_targets(8, rows)
    sym = [line for line in lines if "symmetric" in line]
    assert len(sym) == 1 and sym[0].endswith("MISSED") and "7.00 vs 6.50 us at 64 KiB" in sym[0]
    rows[1]["symm_us"] = 7.0  # as fast counts
    assert [line for line in cm.judge_targets(8, rows) if "symmetric" in line][0].endswith("MET")


def test_speed_table_marks_fallbacks_and_shared_gpu():
    rows = [_row(1024, 2, 5.0, 10.0, symm_us=4.0), _row(4 << 20, 2, 50.0, None)]
    rows[1]["twoshot_p2p"] = False
    rows[0]["torch_timed"] = "eager"
    notes = {"nccl_symm": "symmetric windows not run: x"}
    res = [{"world": 2, "error": None,
            "reports": {0: {"speed": rows, "speed_notes": notes}}},
           {"world": 4, "error": "rank 1: boom", "reports": {}}]
    lines = cm.speed_table(res, share_gpu=True)
    body = [line for line in lines if line.lstrip().startswith("2 ")]
    assert len(body) == 2
    assert "2.00x" in body[0] and "n/a" in body[1] and "50.00*" in body[1]
    assert "4.00 " in body[0] and "10.00e" in body[0]  # nccl-sym; torch timed eagerly
    assert "world 2 nccl_symm: symmetric windows not run: x" in lines
    assert any("not NVLink times" in line for line in lines)
    assert not any(line.lstrip().startswith("4 ") for line in lines)  # the failed world


def test_speed_table_marks_an_empty_capture():
    # torch.distributed at world 1 captures no work: its column says so instead of a time
    rows = [_row(1024, 1, 5.0, 4.0)]
    rows[0]["torch_timed"] = "empty"
    lines = cm.speed_table([{"world": 1, "error": None, "reports": {0: {"speed": rows}}}],
                           share_gpu=False)
    body = [line for line in lines if line.lstrip().startswith("1 ")]
    assert len(body) == 1 and body[0].count("no-op") == 1 and "4.00 " in body[0]
    assert any("no-op = its capture held no work" in line for line in lines)


def test_bad_arguments_exit_2_before_any_gpu_work(capsys):
    for argv in (["--worlds", "9"], ["--phases", "check,nope"], ["--iters", "0"]):
        with pytest.raises(SystemExit) as e:
            cm.main(argv)
        assert e.value.code == 2
    assert "unknown phase 'nope'" in capsys.readouterr().err


def test_multicast_stays_off():
    assert cm._NO_MULTICAST == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                "NVSHMEM_DISABLE_NVLS": "1"}


def test_direct_nccl_id_and_errors():
    """The ctypes layer over libnccl: the unique id survives the byte round trip the ranks'
    broadcast makes, and a failing NCCL call raises naming the call (here, without a GPU,
    ncclCommInitRank; with one, a one-rank communicator is made and closed)."""
    import ctypes as ct
    try:
        lib = cm._load_nccl()
    except (OSError, ImportError) as e:
        pytest.skip(f"no libnccl.so.2 here: {e}")
    uid = cm._UniqueId()
    assert lib.ncclGetUniqueId(ct.byref(uid)) == 0
    raw = ct.string_at(ct.addressof(uid), 128)
    back = cm._UniqueId.from_buffer_copy(raw)
    assert ct.string_at(ct.addressof(back), 128) == raw and raw != bytes(128)
    try:
        nd = cm._NcclDirect(0, 1, lambda obj: obj)
    except RuntimeError as e:
        assert str(e).startswith("ncclCommInitRank: ncclResult ")
    else:  # a GPU machine
        assert nd.version >= 20000
        nd.close()


# ---- the launcher, with stand-in ranks (no GPU, no torch) -------------------------------------

def _rank_ok(rank, world, args, init, q):
    assert init.startswith("file://")
    q.put((rank, {"world": world, "rank": rank, "seed": 7, "failures": []}))


def _rank_error(rank, world, args, init, q):
    if rank == 1:
        q.put((rank, {"error": "ValueError: boom", "traceback": "tb"}))
        return
    _rank_ok(rank, world, args, init, q)


def _rank_dies(rank, world, args, init, q):
    if rank == 2:
        import os
        os._exit(3)
    _rank_ok(rank, world, args, init, q)


def _rank_hangs(rank, world, args, init, q):
    if rank == 0:
        import time
        time.sleep(600)
    _rank_ok(rank, world, args, init, q)


class _Args:
    world_timeout = 60


def test_launcher_collects_every_rank():
    res = cm.run_world(3, _Args(), target=_rank_ok)
    assert res["error"] is None
    assert sorted(res["reports"]) == [0, 1, 2]
    assert all(res["reports"][r]["rank"] == r for r in range(3))


def test_launcher_reports_a_ranks_error():
    res = cm.run_world(2, _Args(), target=_rank_error)
    assert res["error"].startswith("rank 1: ValueError: boom")


def test_launcher_notices_a_process_that_died():
    res = cm.run_world(3, _Args(), target=_rank_dies)
    assert res["error"] == "rank 2's process ended without a report (exit code 3)"
    assert sorted(res["reports"]) == [0, 1]


def test_launcher_kills_a_world_past_its_time():
    import time
    args = _Args()
    args.world_timeout = 3
    t0 = time.time()
    res = cm.run_world(2, args, target=_rank_hangs)
    assert res["error"] == "ranks [0] did not finish within 3 s"
    assert time.time() - t0 < 20  # the hung rank was killed, not waited for
