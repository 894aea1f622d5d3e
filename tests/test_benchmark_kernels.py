"""Runtime layer, no GPU: ``replayssm bench --kernels`` (a subset of the timed kernels) and the table it
prints for the rows it has."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from replayssm_dsl.runtime import cli
from replayssm_dsl.runtime.benchmark import COLUMNS, KERNELS, RATIOS, markdown, parse_kernels


def test_default_kernels_are_all_of_them():
    args = cli.build_parser().parse_args(["bench"])
    assert parse_kernels(args.kernels) == KERNELS


def test_an_unknown_kernel_is_named_before_any_gpu_work(capsys):
    assert cli.main(["bench", "--kernels", "verify,replya"]) == 2
    err = capsys.readouterr().err
    assert "--kernels: replya not among" in err and "verify" in err


def test_nothing_to_time_is_refused():
    with pytest.raises(Exception, match="--kernels: nothing"):
        parse_kernels(",")


def test_table_of_a_subset_leaves_what_was_not_timed_out():
    rng = np.random.default_rng()
    row = {"preset": "qwen3.5-4b", "variant": "gdn", "B": 256, "launch": "ver 8x16; ver4 4x8/r80; conv 4x16",
           "conventional_step": float(rng.uniform(0.1, 1)), "verify_T2": 0.1, "verify_T4": 0.2,
           "verify_T8": float(rng.uniform(0.1, 1))}
    line = next(x for x in markdown([row]).splitlines() if x.startswith("| 256 "))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[COLUMNS.index(("replay", "replay_step", "{:.3f}"))] == "n/a"
    ratios = cells[len(COLUMNS):]
    assert float(ratios[4]) == pytest.approx(row["verify_T8"] / row["conventional_step"], abs=6e-3)
    assert all(x == "n/a" for i, x in enumerate(ratios) if i != 4)  # a ratio of a kernel not timed


def test_every_ratio_column_divides_its_own_pair():
    """Each timed field gets a distinct random time, so a ratio column that divides the wrong pair (or
    the right pair the wrong way round) reads another number."""
    rng = np.random.default_rng()
    row = {"preset": "qwen3.5-4b", "variant": "gdn", "B": 256, "launch": "4x8"}
    row.update({key: float(rng.uniform(0.1, 10)) for _, key, fmt in COLUMNS if fmt == "{:.3f}"})
    line = next(x for x in markdown([row]).splitlines() if x.startswith("| 256 "))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert len(cells) == len(COLUMNS) + len(RATIOS)
    field_of = {column: key for column, key, _ in COLUMNS}
    for (name, numerator, denominator), cell in zip(RATIOS, cells[len(COLUMNS):]):
        assert float(cell) == pytest.approx(row[numerator] / row[denominator], abs=6e-3), name
        head, _, tail = name.partition("/")
        assert (field_of[head], field_of[tail]) == (numerator, denominator), f"{name} divides another pair"


def test_no_plot_without_both_steps(tmp_path):
    from replayssm_dsl.runtime.benchmark import plot
    row = {"preset": "qwen3.5-4b", "variant": "gdn", "B": 256, "conventional_step": 0.27, "verify_T8": 0.36}
    assert plot([row], tmp_path / "speedup.png") is False
    assert not (tmp_path / "speedup.png").exists()


def test_speculative_accepts_cover_every_count():
    from replayssm_dsl.runtime.benchmark import speculative_accepts
    accepts = speculative_accepts(256, 8)
    assert accepts.dtype == np.int32 and accepts.min() == 0 and accepts.max() == 8
    assert set(accepts[:9]) == set(range(9))


def test_speculative_fold_share_follows_the_buffer_rules():
    """The host simulation of verify + commit rounds against the scalar rules of lowering/buffer_rules.py,
    on fresh random fills and accepts; and one case by hand: accepting all 8 drafts from fill 0 with
    L = 16 (capacity 24) folds every third round (0, 8, 16, 24 → fold)."""
    from replayssm_dsl import ReplayConfig
    from replayssm_dsl.lowering.buffer_rules import verify_flushes
    from replayssm_dsl.runtime.benchmark import speculative_fold_share
    config, t = ReplayConfig(window=16, max_drafts=8), 8
    rng = np.random.default_rng()
    fills = rng.integers(0, 16, 64)
    accepts = rng.integers(0, t + 1, 64)
    folds, rounds, skip = 0, 40, 5
    for b in range(64):
        n = int(fills[b])
        for r in range(skip + rounds):
            fold = verify_flushes(n, t, config.window, config.max_drafts)
            folds += fold and r >= skip
            n = (0 if fold else n) + int(accepts[b])
    assert speculative_fold_share(fills, accepts, t, config, skip, rounds) == pytest.approx(folds / (64 * rounds))
    assert speculative_fold_share([0], np.array([8]), t, config, 1, 300) == pytest.approx(1 / 3)  # rounds 3, 6, .., 300
    assert speculative_fold_share([0, 5, 15], np.zeros(3, int), t, config, 0, 10) == 0.0


def test_speculative_is_a_kernel_choice_that_tunes_verify_only():
    from replayssm_dsl.runtime.benchmark import _GROUPS
    assert parse_kernels("speculative") == ("speculative",)
    assert _GROUPS["speculative"] == ("verify",)
    assert ("spec8", "verify_spec_T8", "{:.3f}") in COLUMNS


def test_a_rotation_of_l_steps_brings_every_fill_back():
    """The replay step's time is taken over rotations of L consecutive steps: by the buffer rules
    (lowering/buffer_rules.py) every slot flushes exactly once in any L steps and ends at the fill it
    started from, whatever the batch size and wherever the rotation starts."""
    from replayssm_dsl.lowering.buffer_rules import fill_after_step, step_flushes
    window = int(np.random.default_rng().integers(2, 33))
    for start in range(window):  # the mixed steady state's fills b mod L
        fill, flushes = start, 0
        for _ in range(window):
            flushes += step_flushes(fill, window)
            fill = fill_after_step(fill, window)
        assert (fill, flushes) == (start, 1)


def test_median_of_rotations_counts_the_flush_steps():
    """A batch smaller than L: most steps do not flush, one in L does. The plain median is the step
    without a flush; the median over rotations is the mean step."""
    from replayssm_dsl.runtime.benchmark import median_of_rotations
    rng = np.random.default_rng()
    window = 16
    quiet, flush = rng.uniform(4.0, 6.0), rng.uniform(9.0, 12.0)
    times = np.tile(np.r_[np.full(window - 1, quiet), flush], 20)
    times = np.roll(times, int(rng.integers(0, window)))  # the warm-up shifts where a rotation starts
    assert np.median(times) == pytest.approx(quiet)
    assert median_of_rotations(times, window) == pytest.approx(quiet + (flush - quiet) / window)
    assert median_of_rotations(times[: 3 * window + 5], window) == pytest.approx(quiet + (flush - quiet) / window)
    assert median_of_rotations([1.0, 3.0, 2.0]) == 2.0
    with pytest.raises(ValueError, match="fewer than one rotation"):
        median_of_rotations(times[: window - 1], window)


class _FakeCuda:
    """Just enough of ``cupy`` for ``_median_ms``: it logs what is enqueued, in order, with the stream
    that is current (``with stream:``) or named when it is enqueued."""

    def __init__(self):
        self.log, self.current = [], ["null"]
        fake = self

        class Stream:
            def __init__(self, name):
                self.name = name

            def __enter__(self):
                fake.current.append(self.name)
                return self

            def __exit__(self, *exc):
                fake.current.pop()
                return False

        class Event:
            def record(self, stream):
                fake.log.append(("event", stream.name))

            def synchronize(self):
                pass

        class Kernel:
            def __init__(self, source, name):
                fake.log.append((f"compile {name}", None))

            def __call__(self, grid, block, args):
                fake.log.append(("spin", fake.current[-1]))

        class Device:
            id = 0

        cuda = type("cuda", (), {})()
        cuda.Device, cuda.Event = Device, Event
        cuda.get_current_stream = staticmethod(lambda: Stream("timed"))
        cuda.get_elapsed_time = staticmethod(lambda start, end: 1.0)
        self.cuda, self.RawKernel = cuda, Kernel


def test_every_timed_launch_waits_behind_the_busy_kernel_on_its_stream(monkeypatch):
    """The host's enqueueing is not timed: each start event is queued right behind ``hold_gpu``'s kernel,
    on the stream the events are recorded on."""
    from replayssm_dsl.runtime import benchmark
    monkeypatch.setattr(benchmark, "_spin_kernels", {})
    cp = _FakeCuda()
    reps = 3
    assert benchmark._median_ms(cp, lambda i: cp.log.append(("launch", None)), reps, warmup=2) == 1.0
    assert cp.log[:3] == [("launch", None), ("launch", None), ("compile spin", None)]  # compiled once
    assert cp.log[3:] == [("spin", "timed"), ("event", "timed"), ("launch", None), ("event", "timed")] * reps


@pytest.mark.nvrtc
def test_the_busy_kernel_compiles_for_sm_90():
    from replayssm_dsl.runtime.benchmark import _SPIN_SOURCE
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin
    result = compile_cubin(_SPIN_SOURCE, "spin.cu")
    assert set(result.resources) == {"spin"} and result.resources["spin"].clean


def test_an_enqueue_longer_than_the_busy_kernel_is_reported(monkeypatch):
    """When the host takes longer to enqueue a launch than the busy kernel holds the GPU, the times
    include host time again: the benchmark says so rather than print them as GPU time."""
    from replayssm_dsl.runtime import benchmark
    monkeypatch.setattr(benchmark, "_spin_kernels", {})
    cp = _FakeCuda()
    monkeypatch.setattr(benchmark, "SPIN_NS", 1)
    with pytest.warns(RuntimeWarning, match="include the host's enqueueing"):
        benchmark._median_ms(cp, lambda i: cp.log.append(("launch", None)), 3)
    monkeypatch.setattr(benchmark, "SPIN_NS", 10**12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        benchmark._median_ms(cp, lambda i: cp.log.append(("launch", None)), 3)


def test_floors_read_at_the_read_rate_and_write_at_a_copys():
    """``floor_ms`` on fresh random bytes and rates: reads at the read floor's rate, each written byte at
    what a copy pays for its pair; the tokens and outputs only where asked (verify's floor)."""
    from replayssm_dsl.lowering.traffic import Traffic
    from replayssm_dsl.runtime.benchmark import floor_ms
    rng = np.random.default_rng()
    sr, sw, rr, rw, tr, ow = rng.uniform(1e3, 1e6, 6)
    read_bw, copy_bw = rng.uniform(1e9, 5e9, 2)
    heads = int(rng.integers(1, 10000))
    traffic = Traffic(sr, sw, rr, rw, tr, ow)
    bare = heads * (sr + rr) / read_bw + heads * (sw + rw) * 2 / copy_bw
    assert floor_ms(traffic, heads, read_bw, copy_bw, with_io=False) == pytest.approx(bare, rel=1e-12)
    assert floor_ms(traffic, heads, read_bw, copy_bw, with_io=True) == \
        pytest.approx(bare + heads * tr / read_bw + heads * ow * 2 / copy_bw, rel=1e-12)


def test_table_shows_verify_against_its_floor():
    rng = np.random.default_rng()
    row = {"preset": "kimi-linear", "variant": "kda", "B": 256, "launch": "ver 8x16",
           "verify_T8": float(rng.uniform(0.2, 1)), "verify_floor": float(rng.uniform(0.1, 0.2))}
    line = next(x for x in markdown([row]).splitlines() if x.startswith("| 256 "))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert float(cells[COLUMNS.index(("vfloor", "verify_floor", "{:.3f}"))]) == pytest.approx(row["verify_floor"], abs=6e-4)
    from replayssm_dsl.runtime.benchmark import RATIOS
    column = len(COLUMNS) + [name for name, _, _ in RATIOS].index("ver8/vfloor")
    assert float(cells[column]) == pytest.approx(row["verify_T8"] / row["verify_floor"], abs=6e-3)


def test_traffic_command_lists_tokens_outputs_and_verify_over_the_mixed_fills(capsys):
    """``replayssm traffic`` prints verify at T_max over the fills 0 .. L - 1 (its fold included), the
    row verify's floor is priced from, with its tokens read and outputs written."""
    from replayssm_dsl import ReplayConfig, variants
    from replayssm_dsl.config import PRESETS
    from replayssm_dsl.lowering import lower
    from replayssm_dsl.lowering.traffic import verify_mixed
    assert cli.main(["traffic", "--preset", "kimi-linear"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("verify t=8, fills 0..L-1, with fold"))
    p = PRESETS["kimi-linear"]
    v = verify_mixed(lower(variants.get(p.variant), p.shape, ReplayConfig(window=16, max_drafts=8)), 8)
    numbers = [float(x) for x in line.split("fold", 1)[1].split()]
    assert numbers[:5] == [round(x) for x in (v.state_read, v.state_write, v.record_read, v.record_write, v.total)]
    assert numbers[-2:] == [round(v.token_read), round(v.output_write)]
    assert v.token_read > 0 and v.output_write == 8 * p.shape.v_dim * 4


@pytest.mark.parametrize("seed", range(5))
def test_fla_is_reported_in_its_fastest_way(seed):
    """FLA is timed every way it runs (KDA: each layout, through the public function and in place); the
    fastest is the baseline, and the mode names it and the others' times (fresh random times)."""
    from replayssm_dsl.runtime.bench_fla import fastest_way, fla_ways
    rng = np.random.default_rng(seed)
    ways = fla_ways("kda")
    times = rng.uniform(0.1, 1.0, len(ways))
    timed = {way: (float(ms), "graph") for way, ms in zip(ways, times)}
    ms, mode = fastest_way(timed)
    best = min(timed, key=lambda way: timed[way][0])
    assert ms == min(times)
    assert mode.startswith(f"graph, state {best} (faster than ")
    for way, (other, _) in timed.items():
        if way != best:
            assert f"{way} {other:.4f} ms" in mode


def test_fla_with_one_way_names_no_other():
    from replayssm_dsl.runtime.bench_fla import fastest_way
    assert fastest_way({"[K, V]": (0.25, "eager (RuntimeError)")}) == (0.25, "eager (RuntimeError), state [K, V]")


def test_table_gives_every_ratio_of_the_kernels_timed():
    """Each ratio column is its two measurements' quotient (fresh random times), FLA's ceiling
    ``fla/rfloor`` among them."""
    from replayssm_dsl.runtime.benchmark import RATIOS
    rng = np.random.default_rng()
    keys = {k for _, a, b in RATIOS for k in (a, b)}
    row = {"preset": "kimi-linear", "variant": "kda", "B": 256, "launch": "8x16"} | {k: float(rng.uniform(0.1, 1)) for k in keys}
    table = markdown([row]).splitlines()
    header = next(x for x in table if x.startswith("| B "))
    line = next(x for x in table if x.startswith("| 256 "))
    names = [c.strip() for c in header.strip("|").split("|")][len(COLUMNS):]
    ratios = [float(c) for c in line.strip("|").split("|")[len(COLUMNS):]]
    assert names == [name for name, _, _ in RATIOS] and "fla/rfloor" in names
    for (_, a, b), value in zip(RATIOS, ratios):
        assert value == pytest.approx(row[a] / row[b], abs=6e-3)


def test_the_in_place_way_is_timed_for_kda_only():
    """fla-core 0.6.0 has an in-place decode entry for KDA alone; every variant runs in both layouts."""
    from replayssm_dsl.runtime.bench_fla import FLA_LAYOUTS, fla_ways
    for variant in ("gdn", "kda", "mamba2"):
        ways = fla_ways(variant)
        assert {w for w in ways if not ways[w][1]} == set(FLA_LAYOUTS)
        assert any(in_place for _, in_place in ways.values()) == (variant == "kda")
