"""benchmark.py and the benchmarks package: their behaviour, not their
timings. The tutorial's output line, the --compare report (every
implementation and the floor cell, both ratio tables, the agreement line), its
refusal to time an implementation that disagrees with the reference, clear
errors for arguments it cannot run, and a row for every piece of the other modes."""

import argparse
import json
import re
from pathlib import Path

import pytest
import torch

import benchmark
import lltm_ffi
from benchmarks import (compare, cpu_sweep, distributed, harness, kernels, overhead, sequence,
                        sweep, word_language_model)
from conftest import skip_without_gpu

TUTORIAL_LINE = re.compile(r"Forward: \d+\.\d{3}/\d+\.\d{3} us \| Backward \d+\.\d{3}/\d+\.\d{3} us")
# Small sizes and few runs: the report's machinery, quickly.
SMALL_COMPARE_SIZES = (
    (harness.Size(3, 5, 7), {"cpu": 2, "cuda": 2}),
    (harness.Size(1, 4, 9), {"cpu": 2, "cuda": 2}),
)


@pytest.fixture
def few_warmup_runs(monkeypatch):
    monkeypatch.setattr(harness, "WARMUP_RUNS", 2)


@pytest.fixture
def small_compare(monkeypatch, few_warmup_runs):
    monkeypatch.setattr(compare, "COMPARE_SIZES", SMALL_COMPARE_SIZES)


def device_flags(device):
    return ["-c"] if device.type == "cuda" else []


@pytest.mark.parametrize("implementation", ["py", "ffi"])
def test_one_implementation_prints_the_tutorial_line(implementation, device, capsys):
    code = benchmark.main([implementation, *device_flags(device), "-r", "3", "-b", "5", "-f", "7",
                           "-s", "9"])
    assert code == 0
    assert TUTORIAL_LINE.fullmatch(capsys.readouterr().out.strip())


def test_compare_reports_every_implementation_and_the_floor(small_compare, device, tmp_path,
                                                            capsys):
    output = tmp_path / "compare.md"
    assert benchmark.main(["--compare", *device_flags(device), "--output", str(output)]) == 0
    report = output.read_text()
    assert report.strip() == capsys.readouterr().out.strip()
    assert "- agreement: the outputs and five gradients of every implementation" in report
    for size, _ in SMALL_COMPARE_SIZES:
        for name in compare.TIMED:
            row = re.search(rf"^\| {size} \| {name} \| 2 \|(.*)\|$", report, flags=re.MULTILINE)
            assert row, f"no timing row for {name} at {size}"
            cells = [cell.strip() for cell in row.group(1).split("|")]
            assert len(cells) == 4 and all(float(cell) > 0 for cell in cells), row.group(0)
        ratios = re.search(rf"^\| {size} \|((?: [0-9.]+ \|){{6}})$", report, flags=re.MULTILINE)
        assert ratios, f"no ratio row of six numbers at {size}"
    assert "| forward floor/py | backward floor/py |" in report


def test_compare_refuses_an_implementation_that_disagrees(small_compare, monkeypatch, tmp_path):
    real = harness.make_implementation

    def make_implementation(name):
        if name != "ffi":
            return real(name)

        def off_by_a_little(*arguments):
            new_h, new_cell = real("ffi")(*arguments)
            return new_h * (1 + 1e-3), new_cell
        return off_by_a_little

    monkeypatch.setattr(harness, "make_implementation", make_implementation)
    output = tmp_path / "compare.md"
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(["--compare", "--output", str(output)])
    error = str(exit_info.value)  # the message sys.exit prints, exiting with status 1
    # Scaling new_h moves the gradients too, so which tensor is worst is not fixed.
    found = re.match(r"benchmark.py: ffi disagrees with the reference: \w+ has relative error "
                     r"([0-9.e+-]+), tolerance 1e-05 at 3x5x7 \(float32, cpu", error)
    assert found and float(found.group(1)) > 1e-5, error
    assert not output.exists()


def test_compare_marks_a_failed_torch_compile_and_times_the_rest(small_compare, monkeypatch,
                                                                 tmp_path):
    real = harness.make_implementation

    def broken_compile(*arguments):
        raise RuntimeError("no compiler here\nmore detail")

    monkeypatch.setattr(harness, "make_implementation",
                        lambda name: broken_compile if name == "compile" else real(name))
    output = tmp_path / "compare.md"
    assert benchmark.main(["--compare", "--output", str(output)]) == 0
    report = output.read_text()
    assert "- compile FAILED, marked failed below: RuntimeError: no compiler here\n" in report
    assert re.search(r"^\| 3x5x7 \| compile \| 2 \|( failed \|){4}$", report, flags=re.MULTILINE)
    ratios = r"^\| 3x5x7 \| [0-9.]+ \| [0-9.]+ \| failed \| failed \| [0-9.]+ \| [0-9.]+ \|$"
    assert re.search(ratios, report, flags=re.MULTILINE), report


@pytest.mark.parametrize("arguments, message", [
    (["ffi", "-r", "0"], "argument -r/--runs: must be positive, got 0"),
    (["ffi", "-b", "x"], "argument -b/--batch-size: 'x' is not an integer"),
    (["--compare", "-b", "4"], "-b/-f/-s set the size for one implementation"),
    (["ffi", "-o", "out.md"],
     "-o/--output is for --compare, --sequence, --sweep and --cpu-sweep only"),
    (["--compare", "--states", "64", "--layers", "2"], "--states, --layers: for --sweep only"),
    (["--sweep", "--batches", "1,x"], "argument --batches: 'x' is not an integer"),
    (["--sweep", "--steps", "8,0"], "argument --steps: must be positive, got 0"),
    (["--sweep", "-d"], "--sweep times strict float32 and bf16 autocast"),
    (["--kernels"], "--kernels times the CUDA passes alone: it needs -c/--cuda"),
    (["--sequence", "--tf32"], "--tf32 is for --sequence -c only"),
    (["--compare", "--tf32"], "--tf32 is for --sequence -c only"),
    (["ffi", "--compare"], "not allowed with argument"),
    ([], "one of the arguments"),
    (["--accuracy"], "--accuracy measures a reduced precision: give --half or --autocast"),
    (["--compare", "--half", "bf16"], "--half is for --sequence and --accuracy only"),
    (["--sequence", "--autocast", "bf16", "-d"], "--autocast sets the precision"),
    (["--sequence", "--half", "bf16", "--autocast", "fp16"], "not allowed with argument"),
    (["--sequence", "--half", "fp32"], "argument --half: invalid choice: 'fp32'"),
    (["--compare", "--timed-batches", "3"], "--timed-batches is for --word-language-model only"),
    (["--word-language-model", "--timed-batches", "0"], "argument --timed-batches: must be positive"),
])
def test_bad_arguments_exit_2_saying_why(arguments, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(arguments)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_cpu_sweep_times_every_model_at_every_size_dtype_mode_and_thread_count(
        monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(cpu_sweep, "STATES", (8, 20))
    monkeypatch.setattr(cpu_sweep, "BATCHES", (1, 3))
    monkeypatch.setattr(cpu_sweep, "STEPS", 2)
    report = tmp_path / "sweep.md"
    assert benchmark.main(["--cpu-sweep", "-r", "2", "-o", str(report)]) == 0
    output = capsys.readouterr().out
    assert report.read_text() == output
    assert report.with_suffix(".png").exists() == ("](sweep.png)" in output)
    rows = re.findall(r"^\| (float32|bfloat16) \| (training|inference) \| (\d+) \| (\d+) \| (\d+) "
                      r"\| (2|2 \+ 2) \|((?: [0-9.]+ \|){3}) (\*\*)?([0-9.]+)(\*\*)?"
                      r"(?: \(([0-9.]+)\))? \|$", output, flags=re.MULTILINE)
    threads = cpu_sweep.thread_counts(torch.get_num_threads())
    assert len(rows) == 2 * 2 * len(threads) * 2 * 2
    assert {(row[0], row[1], int(row[2]), int(row[3]), int(row[4])) for row in rows} == {
        (dtype, mode, count, state, batch) for dtype in ("float32", "bfloat16")
        for mode in ("training", "inference") for count in threads for state in (8, 20)
        for batch in (1, 3)}
    for row in rows:
        gru, lstm, lltm = (float(cell) for cell in row[6].split("|")[:3])
        assert min(gru, lstm, lltm) > 0
        # Timed again, with -r as many runs again, where the first ratio
        # was RECHECK_RATIO or more, which follows in brackets.
        assert (row[5] == "2 + 2") == bool(row[10])
        assert not row[10] or float(row[10]) >= cpu_sweep.RECHECK_RATIO - 0.005
        # The ratio of the unrounded times, bold where above 1: the cells,
        # each within 0.05 of its time, put the ratio of theirs within
        # 0.05 * (1 + ratio) / (lstm - 0.05) of it, and the ratio is rounded.
        ratio = float(row[8])
        assert abs(ratio - lltm / lstm) <= 0.005 + 0.05 * (1 + ratio) / (lstm - 0.05) + 1e-9
        assert ratio >= 1.0 if row[7] else ratio <= 1.0
    assert "lltm_sequence is " in output and "- lltm_sequence's products: " in output


@pytest.mark.parametrize("first_ratio, rechecked", [(0.89, False), (0.9, True), (1.3, True)])
def test_cpu_sweep_times_a_close_call_again_for_lltm_and_lstm(first_ratio, rechecked,
                                                              monkeypatch):
    """A size whose first ratio is RECHECK_RATIO or more is timed again,
    lltm_sequence and nn.LSTM alone, for RECHECK_SECONDS up to
    RECHECK_MAX_RUNS: their medians become the second timing's, nn.GRU's
    stays, and the first ratio is kept; below it, nothing more runs."""
    monkeypatch.setattr(cpu_sweep, "RECHECK_RATIO", 0.9)
    calls = []

    def timed(state, batch, dtype, mode, runs=None, names=cpu_sweep.MODELS, seconds=None,
              most_runs=None):
        calls.append((names, seconds, most_runs))
        if len(calls) == 1:
            return {"lltm_sequence": first_ratio * 10.0, "nn.LSTM": 10.0, "nn.GRU": 7.0}, 50
        return {"lltm_sequence": 9.0, "nn.LSTM": 10.0}, 400

    monkeypatch.setattr(cpu_sweep, "time_size", timed)
    runs, medians, first = cpu_sweep.timed_and_rechecked(128, 64, torch.float32, "inference",
                                                         None)
    if not rechecked:
        assert (runs, first, len(calls)) == ((50,), None, 1)
        assert medians["lltm_sequence"] == pytest.approx(first_ratio * 10.0)
        return
    assert calls[1] == (cpu_sweep.RECHECKED, cpu_sweep.RECHECK_SECONDS,
                        cpu_sweep.RECHECK_MAX_RUNS)
    assert set(cpu_sweep.RECHECKED) == {"lltm_sequence", "nn.LSTM"}
    assert runs == (50, 400) and first == pytest.approx(first_ratio)
    assert medians == {"lltm_sequence": 9.0, "nn.LSTM": 10.0, "nn.GRU": 7.0}
    assert cpu_sweep.ratio(medians) == pytest.approx(0.9)


def test_cpu_sweep_summary_lists_equal_ratios_of_two_dtypes():
    """Sizes as slow as each other are listed, largest ratio first, without
    comparing their dtypes (which have no order)."""
    def result(dtype, threads, lltm):
        return (dtype, "inference", threads, 128, 1, (3,),
                {"lltm_sequence": lltm, "nn.LSTM": 1.0, "nn.GRU": 1.0}, None)

    text = cpu_sweep.summary([result(torch.float32, 1, 1.2), result(torch.bfloat16, 1, 1.2),
                              result(torch.float32, 2, 1.5), result(torch.float32, 16, 0.5)])
    assert text.startswith("lltm_sequence is slower than nn.LSTM at 3 of 4 sizes")
    assert text.index("2 threads, state 128, batch 1: 1.50") < text.index(
        "float32 inference, 1 thread, state 128, batch 1: 1.20")
    assert "bfloat16 inference, 1 thread, state 128, batch 1: 1.20" in text
    faster = cpu_sweep.summary([result(torch.float32, 1, 0.7), result(torch.bfloat16, 1, 0.7)])
    assert faster.endswith("at all 2 sizes, and its largest ratio to nn.LSTM's time is 0.70.")


@pytest.mark.parametrize("size_seconds, runs", [(0.0, 3), (1e6, 5)])
def test_cpu_sweep_runs_a_size_as_often_as_fits_in_its_seconds(size_seconds, runs, monkeypatch):
    """Without -r, a size runs as many rounds as fit in SIZE_SECONDS, from
    MIN_RUNS to MAX_RUNS: no time gives the least, all the time the most."""
    monkeypatch.setattr(cpu_sweep, "STEPS", 2)
    monkeypatch.setattr(cpu_sweep, "MIN_RUNS", 3)
    monkeypatch.setattr(cpu_sweep, "MAX_RUNS", 5)
    monkeypatch.setattr(cpu_sweep, "SIZE_SECONDS", size_seconds)
    medians, done = cpu_sweep.time_size(8, 1, torch.float32, "inference")
    assert done == runs
    assert set(medians) == set(cpu_sweep.MODELS) and min(medians.values()) > 0


def test_cpu_sweep_cut_short_keeps_the_sizes_it_measured(monkeypatch, tmp_path):
    """The report is rewritten after each size and thread count, each size
    on every thread count before the next: a run stopped at its fourth
    (as `timeout` stops scripts/gpu_session.sh's cpusweep) keeps the first
    size on 1 and 2 threads and the second on 1, in the table's order."""
    monkeypatch.setattr(cpu_sweep, "STATES", (8, 20))
    monkeypatch.setattr(cpu_sweep, "BATCHES", (1, 3))
    monkeypatch.setattr(cpu_sweep, "STEPS", 2)
    monkeypatch.setattr(cpu_sweep, "thread_counts", lambda most: [1, 2])
    monkeypatch.setattr(cpu_sweep, "RECHECK_RATIO", float("inf"))  # one timing a size
    timed = cpu_sweep.time_size
    sizes = []

    def stopped_at_the_fourth(*arguments):
        sizes.append(arguments)
        if len(sizes) == 4:
            raise KeyboardInterrupt
        return timed(*arguments)

    monkeypatch.setattr(cpu_sweep, "time_size", stopped_at_the_fourth)
    report = tmp_path / "sweep.md"
    with pytest.raises(KeyboardInterrupt):
        benchmark.main(["--cpu-sweep", "-r", "2", "-o", str(report)])
    rows = re.findall(r"^\| float32 \| training \| (\d+) \| (\d+) \| (\d+) \|",
                      report.read_text(), flags=re.MULTILINE)
    assert rows == [("1", "8", "1"), ("1", "8", "3"), ("2", "8", "1")]
    assert not report.with_suffix(".png").exists()


def test_cpu_sweep_counts_one_two_and_all_threads_once_each():
    assert cpu_sweep.thread_counts(1) == [1]
    assert cpu_sweep.thread_counts(2) == [1, 2]
    assert cpu_sweep.thread_counts(16) == [1, 2, 16]


def test_cpu_sweep_refuses_a_gpu(capsys):
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(["--cpu-sweep", "-c"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--cpu-sweep times the CPU passes" in err or "-c/--cuda: this torch" in err


def test_cuda_flag_without_a_gpu_says_so(capsys):
    if torch.cuda.is_available():
        pytest.skip("there is a GPU: -c is valid here")
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(["ffi", "-c"])
    assert exit_info.value.code == 2
    assert "-c/--cuda: this torch" in capsys.readouterr().err


@pytest.mark.gpu
def test_kernels_report_their_bandwidth_next_to_the_copy(few_warmup_runs, monkeypatch, capsys):
    skip_without_gpu()
    monkeypatch.setattr(kernels, "KERNEL_SIZES", ((257, 129), (64, 256)))
    assert benchmark.main(["--kernels", "-c", "-r", "3"]) == 0
    report = capsys.readouterr().out
    for size in ("257x129", "64x256"):
        for step in ("forward", "backward", "copy"):
            assert re.search(rf"^\| {size} \| {step} \| [0-9.]+ \| [0-9.]+ \| \d+ \| [0-9.]+ \|$",
                             report, flags=re.MULTILINE), f"no {step} row at {size}"


def rows_of_numbers(report, columns):
    """The markdown rows of `report` whose last `columns` cells are numbers."""
    numbers = r" [0-9.]+ \|" * columns
    return re.findall(rf"^\|.*\|{numbers}$", report, flags=re.MULTILINE)


def test_overhead_times_every_piece(device, monkeypatch, capsys):
    for constant in ("PIECE_CALLS", "STEP_CALLS", "BATCHES", "SYNCHRONIZED_RUNS"):
        monkeypatch.setattr(overhead, constant, 3)
    assert benchmark.main(["--overhead", *device_flags(device)]) == 0
    report = capsys.readouterr().out
    rows = rows_of_numbers(report, 1)
    assert len(rows) == 24, report
    for piece in ("lltm_ffi.lltm forward", "torch.ops.lltm_ffi.forward_pass (registered op)",
                  "lltm_ffi backward (torch.autograd.grad of the loss)",
                  "floor cell backward, timed as --compare does"):
        assert any(f"| {piece} |" in row for row in rows), piece


SMALL_LAYERED_SHAPES = ((3, 5, 7, 9), (4, 3, 2, 17))


def assert_layered_rows(report, cudnn):
    """The two-layer bidirectional table: every implementation at every size."""
    names = ["LLTMSequence", f"nn.LSTM{cudnn}", f"nn.GRU{cudnn}", "LLTMSequence, packed",
             f"nn.GRU{cudnn}, packed"]
    rows = rows_of_numbers(report, 2)
    assert [row.split("|")[2].strip() for row in rows] == names * 2
    assert [row.split("|")[1].strip() for row in rows] == ["3x5x7x9"] * 5 + ["4x3x2x17"] * 5


@pytest.mark.gpu
@pytest.mark.parametrize("precision", [[], ["--tf32"]])
def test_sequence_compares_loops_lltm_sequence_and_cudnn(few_warmup_runs, monkeypatch, capsys,
                                                         precision, tmp_path):
    skip_without_gpu()
    monkeypatch.setattr(sequence, "SEQUENCE_SHAPES", ((3, 5, 7, 9), (2, 4, 3, 17)))
    monkeypatch.setattr(sequence, "LAYERED_SHAPES", SMALL_LAYERED_SHAPES)
    settings = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    report = tmp_path / "sequence.md"
    assert benchmark.main(["--sequence", "-c", "-r", "3", *precision, "-o", str(report)]) == 0
    output = capsys.readouterr().out
    assert report.read_text() == output
    one_layer, layered = output.split(sequence.LAYERED_HEADING)
    one_layer, forward = one_layer.split(sequence.FORWARD_HEADING)
    names = ["reference, Python loop", "lltm_ffi.lltm, Python loop",
             "lltm_ffi.lltm loop, CUDA graph replay", "lltm_sequence", "nn.LSTM (cuDNN)",
             "nn.GRU (cuDNN)", sequence.FLOOR]
    assert [row.split("|")[2].strip() for row in rows_of_numbers(one_layer, 2)] == names * 2
    forward = forward.split("lltm_sequence's recurrence")[0]
    assert [row.split("|")[2].strip() for row in rows_of_numbers(forward, 2)] == names[3:] * 2
    assert_layered_rows(layered, " (cuDNN)")
    assert ("TF32 allowed" if precision else "strict float32") in output
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == settings, \
        "the benchmark changed the TF32 settings for the tests that follow"


def test_sequence_on_the_cpu_compares_loops_lltm_sequence_lstm_and_gru(few_warmup_runs,
                                                                       monkeypatch, capsys,
                                                                       tmp_path):
    monkeypatch.setattr(sequence, "CPU_SEQUENCE_SHAPES", ((3, 5, 7, 9), (2, 4, 3, 17)))
    monkeypatch.setattr(sequence, "LAYERED_SHAPES", SMALL_LAYERED_SHAPES)
    report = tmp_path / "sequence.md"
    assert benchmark.main(["--sequence", "-r", "3", "-o", str(report)]) == 0
    output = capsys.readouterr().out
    assert report.read_text() == output
    # The chart beside the report, where matplotlib can draw it.
    assert report.with_suffix(".png").exists() == (
        "![median us per time step](sequence.png)" in output)
    one_layer, layered = output.split(sequence.LAYERED_HEADING)
    assert_layered_rows(layered, "")
    rows = rows_of_numbers(one_layer, 2)
    names = ["reference, Python loop", "lltm_ffi.lltm, Python loop", "lltm_sequence", "nn.LSTM",
             "nn.GRU", sequence.FLOOR]
    assert [row.split("|")[2].strip() for row in rows] == names * 2
    assert [row.split("|")[1].strip() for row in rows] == ["3x5x7x9"] * 6 + ["2x4x3x17"] * 6
    assert "per-step kernels" not in output


def test_compare_reports_pairs_two_trees_rows_of_real_reports(few_warmup_runs, monkeypatch,
                                                              capsys, tmp_path):
    """scripts/compare_reports.py, on --sequence reports as the benchmark
    writes them (two runs of each tree, a row the base's lacks): every row
    of both trees' time tables once, its medians in their order and this
    tree's median over the base's."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    import compare_reports
    monkeypatch.setattr(sequence, "CPU_SEQUENCE_SHAPES", ((3, 5, 7, 9),))
    monkeypatch.setattr(sequence, "LAYERED_SHAPES", SMALL_LAYERED_SHAPES)
    assert benchmark.main(["--sequence", "-r", "3", "-o", str(tmp_path / "sequence.md")]) == 0
    report = capsys.readouterr().out

    def slower(text, factor):
        return re.sub(r"^(\| 3x5x7x9 \| lltm_sequence \| )([\d.]+)",
                      lambda row: f"{row[1]}{float(row[2]) * factor:.1f}", text, flags=re.M)

    log = "".join(f"=== {tree}\n{text}\n=== end\n" for tree, text in (
        ("base", report), ("this", slower(report, 2)), ("this", slower(report, 2)),
        ("base", report + "\n| T x B x F x S | implementation | median us/step |\n"
                          "| 1x1x1x1 | only the base | 1.0 |\n")))
    table = compare_reports.comparison(log).splitlines()
    rows = [line.split(" | ") for line in table[2:]]
    assert table[0] == "| table | T x B x F x S | implementation | base | this | this / base |"
    time_rows = rows_of_numbers(report, 2)
    assert len(rows) == len(time_rows) and len(rows) > 6
    for row, line in zip(rows, time_rows):
        size, name, median = (cell.strip() for cell in line.split("|")[1:4])
        assert row[1:3] == [size, name]
        assert row[3] == f"{float(median)}, {float(median)}"
        ratio = float(row[5].rstrip(" |"))
        if name == "lltm_sequence":
            assert row[4] == f"{float(median) * 2:.1f}, {float(median) * 2:.1f}"
            assert ratio == pytest.approx(2, rel=0.01)
        else:
            assert ratio == 1
    assert {row[0] for row in rows} == {"| 1", "| 2"}  # the one-layer and layered tables


REDUCED = [pytest.param(["--half", "bf16"], id="half-bf16"),
           pytest.param(["--autocast", "bf16"], id="autocast-bf16"),
           pytest.param(["--half", "fp16"], id="half-fp16"),
           pytest.param(["--autocast", "fp16"], id="autocast-fp16")]


@pytest.mark.parametrize("reduced", REDUCED)
def test_sequence_in_a_reduced_precision_times_lltm_sequence_lstm_and_gru(
        reduced, few_warmup_runs, device, monkeypatch, capsys, tmp_path):
    """--sequence --half/--autocast: lltm_sequence in that precision and in
    float32 (on the CPU the reference's loop in that precision too), nn.LSTM
    and nn.GRU at every size, then the two-layer table."""
    small = ((3, 5, 7, 9), (2, 4, 3, 17))
    monkeypatch.setattr(sequence, "CPU_REDUCED_SEQUENCE_SHAPES", small)
    monkeypatch.setattr(sequence, "REDUCED_SEQUENCE_SHAPES", small)
    monkeypatch.setattr(sequence, "LAYERED_SHAPES", SMALL_LAYERED_SHAPES)
    report = tmp_path / "sequence.md"
    assert benchmark.main(["--sequence", *device_flags(device), *reduced, "-r", "3", "-o",
                           str(report)]) == 0
    output = capsys.readouterr().out
    assert report.read_text() == output
    dtype = {"bf16": "bfloat16", "fp16": "float16"}[reduced[1]]
    assert f"- dtype: {dtype}{' autocast' if reduced[0] == '--autocast' else ''}\n" in output
    assert ("under torch.autocast(dtype=torch." if reduced[0] == "--autocast"
            else f"modules and data in {dtype}") in output
    one_layer, layered = output.split(sequence.LAYERED_HEADING)
    cudnn = " (cuDNN)" if device.type == "cuda" else ""
    names = ["lltm_sequence, float32", *([] if cudnn else ["reference, Python loop"]),
             "lltm_sequence", f"nn.LSTM{cudnn}", f"nn.GRU{cudnn}"]
    layered_names = ["LLTMSequence", f"nn.LSTM{cudnn}", f"nn.GRU{cudnn}", "LLTMSequence, packed",
                     f"nn.GRU{cudnn}, packed"]
    for table, sizes, expected in ((one_layer, ("3x5x7x9", "2x4x3x17"), names),
                                   (layered, ("3x5x7x9", "4x3x2x17"), layered_names)):
        rows = re.findall(r"^\| (\S+) \| ([^|]+) \| ([0-9.]+|failed) \| ([0-9.]+|failed) \|$",
                          table, flags=re.MULTILINE)
        assert [(size, name) for size, name, _, _ in rows] == [
            (size, name) for size in sizes for name in expected]
        for size, name, median, minimum in rows:
            # Only a peer of torch's may fail (nn.LSTM under CPU float16 autocast, in
            # oneDNN), and the report says why.
            if "failed" in (median, minimum):
                assert name.startswith("nn.") and f"- {name}" in output and "FAILED" in output
            else:
                assert float(median) >= float(minimum) > 0, (size, name)


@pytest.mark.parametrize("reduced", REDUCED[:2])
def test_accuracy_reports_every_result_of_lltm_sequence_and_gru(reduced, device, monkeypatch,
                                                                 capsys):
    """--accuracy: for each size, lltm_sequence's outputs and five gradients
    and nn.GRU's outputs and six, each a relative error against float64 that
    a bfloat16 run makes small but not zero."""
    small = ((3, 5, 7, 9), (2, 4, 3, 17))
    monkeypatch.setattr(sequence, "CPU_REDUCED_SEQUENCE_SHAPES", small)
    monkeypatch.setattr(sequence, "REDUCED_SEQUENCE_SHAPES", small)
    assert benchmark.main(["--accuracy", *device_flags(device), *reduced]) == 0
    output = capsys.readouterr().out
    rows = re.findall(r"^\| (\S+) \| (lltm_sequence|nn\.GRU[^|]*) \| (\w+) \| (\w+) \| "
                      r"([0-9.e+-]+) \|$", output, flags=re.MULTILINE)
    lltm = ["outputs", "d_inputs", "d_weights_l0", "d_bias_l0", "d_h0", "d_c0"]
    gru = ["outputs", "d_inputs", "d_weight_ih_l0", "d_weight_hh_l0", "d_bias_ih_l0",
           "d_bias_hh_l0", "d_h0"]
    assert [(size, tensor) for size, _, _, tensor, _ in rows] == [
        (size, tensor) for size in ("3x5x7x9", "2x4x3x17") for tensor in lltm + gru]
    for size, model, output_dtype, tensor, error in rows:
        if model == "lltm_sequence":
            assert output_dtype == "bfloat16", (size, tensor)
        assert 1e-5 < float(error) < 5e-2, (size, model, tensor, error)


def test_word_language_model_trains_every_module_at_every_size(device, monkeypatch, capsys):
    """The table's rows, tiny: every size, nn.LSTM, nn.GRU and LLTMSequence
    in turn, each a time, a training and a validation loss."""
    monkeypatch.setattr(word_language_model, "SIZES", (
        word_language_model.Size("small", 8, 8, 2, 0.2, bptt=5, batch_size=4),
        word_language_model.Size("medium", 12, 12, 2, 0.5, bptt=5, batch_size=4)))
    monkeypatch.setattr(word_language_model, "VOCABULARY", 30)
    monkeypatch.setattr(word_language_model, "VALID_TOKENS", 200)
    monkeypatch.setattr(word_language_model, "WARMUP_BATCHES", 2)
    settings = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    with torch.random.fork_rng(devices=[]):
        assert benchmark.main(["--word-language-model", *device_flags(device),
                               "--timed-batches", "3"]) == 0
    report = capsys.readouterr().out
    rows = rows_of_numbers(report, 3)
    assert [tuple(cell.strip() for cell in row.split("|")[1:3]) for row in rows] == [
        (size, module) for size in ("small", "medium")
        for module in ("nn.LSTM", "nn.GRU", "LLTMSequence")]
    for row in rows:
        milliseconds, train_loss, valid_loss = (float(cell) for cell in row.split("|")[3:6])
        assert milliseconds > 0 and 0 < train_loss < 10 and 0 < valid_loss < 10, row
    assert "vocabulary 30; 2 untimed batches, then 3 timed; seed 1111" in report
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == settings


@pytest.mark.slow
def test_distributed_times_every_process_count_with_and_without_ddp(few_warmup_runs, device,
                                                                    monkeypatch, capsys):
    if device.type == "cuda" and torch.cuda.device_count() < 2:
        pytest.skip(f"--distributed -c needs 2 GPUs, torch sees {torch.cuda.device_count()}")
    small = (distributed.Workload("small", 3, 4, 5, 7), distributed.Workload("other", 2, 1, 3, 9))
    monkeypatch.setitem(distributed.WORKLOADS, device.type, small)
    assert benchmark.main(["--distributed", *device_flags(device), "-r", "2"]) == 0
    report = capsys.readouterr().out
    counts = distributed.process_counts(torch.cuda.device_count() if device.type == "cuda"
                                        else distributed.CPU_PROCESSES)
    for workload in small:
        rows = re.findall(rf"^\| {re.escape(workload.name)} \| {workload} \| (\d+) \| (yes|no) \| "
                          rf"([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|$", report, flags=re.MULTILINE)
        assert [(int(count), ddp) for count, ddp, *_ in rows] == (
            [(1, "no"), (1, "yes")] + [(count, "yes") for count in counts[1:]]), report
        for count, _, steps, sequences, efficiency in rows:
            assert float(steps) > 0
            assert float(sequences) == pytest.approx(float(steps) * int(count) * workload.batch,
                                                     rel=0.01, abs=1)
        assert rows[0][4] == "1.00"



def test_sweep_on_the_cpu_writes_its_table_json_and_chart(tmp_path, capsys):
    """A tiny --sweep: a row for each shape, precision and mode (state 100
    brings 128 in, as a row of its own and into 100's runs for its cliff),
    lltm's figures and ratios in the table the same as in the JSON beside
    it, and the chart where matplotlib is."""
    output = tmp_path / "sweep.md"
    assert benchmark.main(["--sweep", "--states", "100", "--batches", "1,2", "--steps", "3",
                           "-r", "2", "-o", str(output)]) == 0
    report = output.read_text()
    assert report.strip() == capsys.readouterr().out.strip()
    number = r"[0-9]+\.[0-9]"
    rows = re.findall(rf"^\| (3x\d+x\d+x\d+) \| 1 \| (float32|bfloat16 autocast) \| "
                      rf"(training|inference) \| ({number}) \| ({number}|failed) \| "
                      rf"({number}|failed) \| default \| ([0-9.]+) \| ([0-9.]+(?: \([0-9.]+\))?|–) \|$",
                      report, flags=re.MULTILINE)
    assert [row[:3] for row in rows] == [
        (f"3x{batch}x{state}x{state}", precision, mode) for batch in (1, 2) for state in (100, 128)
        for precision in ("float32", "bfloat16 autocast") for mode in ("training", "inference")]
    record = json.loads(output.with_suffix(".json").read_text())
    assert record["complete"] and record["variants"] == {"default": {}}
    points = record["points"]
    for row, point in zip(rows, points, strict=True):
        lltm, *peers = (point["times"].get(name) for name in ("default", *sweep.PEERS))
        assert point["runs"] == 2 and row[3] == f"{lltm:.1f}"
        for cell, name, time in zip(row[4:6], sweep.PEERS, peers):
            # A peer may fail (nn.LSTM under CPU bfloat16 autocast, in oneDNN): the notes say why.
            assert cell == (f"{time:.1f}" if time else "failed")
            assert time or f"- {name} failed at " in report
        assert row[6] == f"{lltm / min(time for time in peers if time):.2f}"
        cliff = point["cliff"]
        if point["shape"]["state"] == 100:
            first = lltm / point["times"][sweep.NEXT_TILE]
            check = point["cliff_check"]
            if first > sweep.CLIFF_RECHECK:  # timed again, the two alone
                assert check["runs"] == sweep.CLIFF_RUNS
                assert cliff == pytest.approx(check["default"] / check[sweep.NEXT_TILE])
                assert row[7] == f"{cliff:.2f} ({first:.2f})"
            else:
                assert not check and cliff == pytest.approx(first)
                assert row[7] == f"{cliff:.2f}"
        else:
            assert sweep.NEXT_TILE not in point["times"]
            assert cliff is None and row[7] == "–"
    chart = output.with_suffix(".png")
    drawn = "![microseconds per time step against the state](sweep.png)" in report
    assert chart.exists() == drawn
    assert chart.exists() != ("- chart: none drawn, matplotlib is not importable" in report)



@pytest.mark.gpu
def test_sweep_on_a_gpu_times_each_forced_path_and_names_it(tmp_path, capsys):
    """Every lltm variant timed with the path the plan gives its recurrence,
    a forced one that path; nn.GRU and nn.LSTM beside them."""
    skip_without_gpu()
    output = tmp_path / "sweep.md"
    assert benchmark.main(["--sweep", "-c", "--states", "100", "--batches", "2", "--steps", "4",
                           "-r", "2", "-o", str(output)]) == 0
    report = capsys.readouterr().out
    assert f"| {' | '.join((*sweep.VARIANTS, *sweep.PEERS))} |" in report
    path = r"(cluster|persistent|cublas|steps)"
    cells = r" \| ".join([rf"[0-9.]+ {path}(?:/{path})?"] * len(sweep.VARIANTS))
    rows = re.findall(rf"^\| (4x2x\d+x\d+) \| 1 \| [^|]+ \| (training|inference) \| "
                      rf"{cells} \| [0-9.]+ \| [0-9.]+ \|", report, flags=re.MULTILINE)
    assert len(rows) == 8, report
    for shape, mode, *paths in rows:
        for index, environment in enumerate(sweep.VARIANTS.values()):
            used = set(paths[2 * index:2 * index + 2]) - {""}
            assert len(used) == 1 or mode == "training", (shape, paths)
            forced = environment.get("LLTM_PATH")
            assert forced is None or used == {forced}, (shape, mode, paths)
    points = json.loads(output.with_suffix(".json").read_text())["points"]
    assert all(set(point["paths"]) == set(sweep.VARIANTS) for point in points)


def sweep_point(state, times, steps=64, precision="float32"):
    return sweep.Point(sweep.Shape(steps, 16, 1, state), precision, "training", times=times)


def test_sweep_cliff_is_the_default_over_the_next_multiple_of_128_in_the_same_runs():
    points = [sweep_point(600, {"default": 30.0, "persistent": 20.0, "nn.GRU": 10.0,
                                sweep.NEXT_TILE: 25.0}),
              sweep_point(650, {"default": 50.0, "steps": 45.0, "nn.LSTM": 50.0,
                                sweep.NEXT_TILE: 40.0}),
              # Timed in runs of its own: its time is not compared with another point's.
              sweep_point(768, {"default": 36.0, "persistent": 30.0}),
              # Its multiple did not run (too slow), or the default did not.
              sweep_point(700, {"default": 40.0}),
              sweep_point(1500, {"persistent": 90.0, sweep.NEXT_TILE: 80.0})]
    assert sweep.cliff_ratios(points) == {0: (pytest.approx(30 / 25), None),
                                          1: (pytest.approx(50 / 40), None)}
    # Timed again: the second figure is the cliff, the first kept beside it.
    points[1].cliff_check = {"runs": 40, "default": 42.0, sweep.NEXT_TILE: 40.0}
    assert sweep.cliff_ratios(points)[1] == (pytest.approx(42 / 40), pytest.approx(50 / 40))
    assert [point.fastest()[0] for point in points[:3]] == ["persistent", "steps", "persistent"]
    assert points[0].over_peers() == pytest.approx(2.0)
    assert points[1].over_peers() == pytest.approx(0.9)


def test_sweep_notes_a_forced_paths_refusals_once_by_their_reason(monkeypatch):
    """lltm_sequence's own refusal of a forced path (here the cluster row's
    of a CPU call, whatever its sizes) reads "refused" with its reason,
    noted once for every point; any other error, "failed"."""
    monkeypatch.setenv("LLTM_PATH", "cluster")

    def refusal(state):
        inputs, h0 = torch.randn(3, 2, 4), torch.zeros(2, state)
        with pytest.raises(ValueError, match="LLTM_PATH=cluster cannot take") as refused:
            lltm_ffi.lltm_sequence(inputs, torch.randn(3 * state, state + 4),
                                   torch.randn(3 * state), h0, h0)
        return refused.value
    points = [sweep_point(state, {"default": 1.0}) for state in (300, 384)]
    for point in points:
        point.failures["cluster"] = sweep.failure_text(refusal(point.shape.state))
    points[1].failures["steps"] = sweep.failure_text(RuntimeError("CUDA error: out of luck"))
    cluster, steps = sweep.failure_notes(points)
    assert cluster.startswith("- cluster refused at 2 points (64x16x300x300 float32 training, "
                              "64x16x384x384 float32 training): it runs on another device (")
    assert "unset LLTM_PATH" not in cluster
    assert steps == ("- steps failed at 1 point (64x16x384x384 float32 training): RuntimeError: "
                     "CUDA error: out of luck")
    variants = {"default": {}, "cluster": {"LLTM_PATH": "cluster"}, "steps": {"LLTM_PATH": "steps"}}
    assert sweep.row(points[1], variants, None)[4:7] == ["1.0", "refused", "failed"]


def test_sweep_grid_adds_the_next_multiple_of_128_and_the_gpu_series():
    def grid(device, **chosen):
        options = {"states": None, "batches": None, "steps": None, "layers": None,
                   "packed": None, **chosen}
        return [(shape.steps, shape.batch, shape.layers, shape.state, shape.packed)
                for shape in sweep.grid(argparse.Namespace(**options), torch.device(device))]

    states = (100, 128, 650, 768)
    assert grid("cuda", states=(650, 100)) == [
        (steps, batch, 1, state, False)
        for steps, batch in ((64, 1), (64, 16), (64, 64), (1024, 16)) for state in states] + [
        (35, 20, 2, 650, False), (35, 20, 2, 768, False), (64, 20, 1, 650, False),
        (64, 20, 1, 768, False)] + [
        (64, batch, 1, state, True) for batch in (16, 64) for state in (100, 128)]
    # A series, a layer count or packing given: that grid alone.
    assert grid("cuda", states=(300,), batches=(16,), layers=2) == [(64, 16, 2, 300, False),
                                                                    (64, 16, 2, 384, False)]
    assert grid("cuda", states=(300,), packed=True) == [
        (64, batch, 1, state, True) for batch in (1, 16, 64) for state in (300, 384)]
    assert grid("cpu") == [(16, batch, 1, state, False) for batch in (1, 8)
                           for state in (32, 100, 128)]


def test_sweep_on_the_cpu_times_packed_batches(tmp_path, capsys):
    """--packed: each batch a PackedSequence of lengths from the steps down
    to a quarter of them, timed for lltm_sequence, nn.GRU and nn.LSTM alike."""
    output = tmp_path / "sweep.md"
    assert benchmark.main(["--sweep", "--packed", "--states", "32", "--batches", "3",
                           "--steps", "8", "-r", "2", "-o", str(output)]) == 0
    report = output.read_text()
    assert report.strip() == capsys.readouterr().out.strip()
    rows = re.findall(r"^\| (8x3x\d+x\d+ packed) \| 1 \| ", report, flags=re.MULTILINE)
    assert rows == ["8x3x32x32 packed"] * 4 + ["8x3x128x128 packed"] * 4
    points = json.loads(output.with_suffix(".json").read_text())["points"]
    assert all(point["shape"]["packed"] and point["times"].get("default") for point in points)
    assert sweep.Shape(8, 3, 1, 32, True).lengths().tolist() == [8, 5, 2]


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_sweep_names_the_paths_the_plan_gives_each_mode(packed):
    """planned_paths asks lltm_ffi.recurrence_path about the point's own
    module and inputs, in its compute dtype: the forward alone for
    inference, both passes for training (on the CPU, its one path)."""
    models, inputs = sweep.models_of(sweep.Shape(6, 3, 1, 8, packed), torch.device("cpu"))
    for precision in sweep.PRECISIONS:
        for mode, paths in (("inference", {"forward": "cpu"}),
                            ("training", {"forward": "cpu", "backward": "cpu"})):
            assert sweep.planned_paths(models["lltm"], inputs, precision, mode)() == paths


def test_benchmarks_measure_through_public_names_only():
    """lltm_ffi's private modules change under the benchmarks: they reach it
    through its public names (and the registered operators) only."""
    private = re.compile(r"lltm_ffi\._(?!_)\w+|from lltm_ffi(?:\.\w+)? import [^\n]*\b_\w+"
                         r"|\b_extension\b|lltm_ffi\.function\b|__wrapped__")
    for source in [Path(benchmark.__file__), *Path(harness.__file__).parent.glob("*.py")]:
        assert not private.findall(source.read_text()), source


@pytest.mark.parametrize("first", [1.2, 1.05])
def test_sweep_times_a_cliff_past_the_recheck_again_alone(first):
    """A cliff ratio past CLIFF_RECHECK brings a second timing of the
    default at the two states, they alone, CLIFF_RUNS runs; one under it
    none."""
    called = []
    candidates = {name: sweep.Candidate({}, lambda name=name: called.append(name))
                  for name in ("default", sweep.NEXT_TILE, "nn.GRU")}
    point = sweep_point(100, {"default": 10.0 * first, sweep.NEXT_TILE: 10.0, "nn.GRU": 5.0})
    sweep.check_cliff(point, candidates, torch.device("cpu"))
    if first > sweep.CLIFF_RECHECK:
        assert point.cliff_check["runs"] == sweep.CLIFF_RUNS
        assert set(point.cliff_check) == {"runs", "default", sweep.NEXT_TILE}
        assert set(called) == {"default", sweep.NEXT_TILE}
    else:
        assert point.cliff_check == {} and called == []
