"""lltm_ffi under torch.distributed, two processes launched by torchrun:
DistributedDataParallel gradients of a model on lltm_ffi.LLTM, of one on
LLTMSequence and of one on a two-layer bidirectional LLTMSequence equal one
process's on the whole batch (in float64; the last also in bfloat16, within
a few units of its roundoff); FSDP2 (fully_shard) of
the LLTM parameters trains to the parameters one process reaches;
torch.compile of the DDP-wrapped models gives the same outputs and
gradients; the demo's --distributed run checkpoints and resumes where it
stopped (on as many processes, on one, and as two torchrun nodes resumed by
one node), goes on from its checkpoint when torchrun restarts it after a
crash, and refuses a wrong launch; leaving the process group frees the DDP
model first.

Each variant runs with gloo on the CPU and, where there are two GPUs, with
NCCL on cuda:0 and cuda:1 (NVLink multicast off: NCCL_NVLS_ENABLE=0). All the
cases of a device run in one torchrun launch (tests/distributed_cases.py);
every launch runs under a timeout, so that a hang fails the tests. torchrun
--standalone finds a free port itself, scripts/multinode_demo.sh one for its
rendezvous. Every test that launches processes is marked slow, the NCCL
cases multi_gpu.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import distributed_cases as cases
from checkouts import STOP_GRACE_S, output_within
from conftest import REPO_ROOT, SEED_VARIABLE, seed_for
from examples import demo, distributed

PROCESSES = 2
LAUNCH_TIMEOUT_S = 600  # the compile cases compile in both processes at once on two cores
DEMO_TIMEOUT_S = 300
# float64 throughout: the sums of two shares' gradients differ from one sum
# over the whole batch by rounding alone.
TIGHT = {"rtol": 1e-10, "atol": 1e-12}
# NVLink multicast stays off, in NCCL and in torch's symmetric memory.
NVLINK_MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
DDP_CASES = [f"ddp-{kind}-{batch}" for kind in ("cell", "sequence") for batch in (1, 3)] + [
    "ddp-layers-3", "ddp-layers_bf16-3"]
# A bfloat16 model: each process rounds its share's gradients to bfloat16,
# and the all-reduce rounds their sum, where one process rounds the whole
# batch's once: a few units of bfloat16's roundoff (2**-8) apart, in norm,
# relative to the magnitude of what was summed (sample_magnitudes).
BFLOAT16_RELATIVE_ERROR = 4 * 2.0 ** -8
COMPILE_CASES = ["compile-cell-2", "compile-sequence-3"]
FSDP_CASES = ["fsdp-cell-2", "fsdp-sequence-3"]


def skip_without_two_gpus(device_type):
    if device_type == "cuda" and torch.cuda.device_count() < PROCESSES:
        pytest.skip(f"NCCL needs {PROCESSES} GPUs, torch sees {torch.cuda.device_count()}")


def child_environment(**variables):
    """This process's environment for a child Python that imports lltm_ffi
    from the repository, plus `variables`."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO_ROOT)] + [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                            if path]), **variables)


def start_torchrun(arguments, device_type, processes=PROCESSES, options=(), **variables):
    """`torchrun --standalone` with `processes` processes and torchrun's
    `options`, started in a process group of its own, its output (stdout
    and stderr) piped; `variables` join the environment."""
    environment = child_environment(**variables)
    if device_type == "cuda":
        environment.update(NVLINK_MULTICAST_OFF)
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={processes}", *options, *arguments],
        cwd=REPO_ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True)


def torchrun(arguments, device_type, timeout, processes=PROCESSES, options=(), **variables):
    """(return code, output) of start_torchrun's launch, whose process group
    is killed past `timeout`."""
    process = start_torchrun(arguments, device_type, processes, options, **variables)
    return output_within(process, timeout, f"torchrun {' '.join(arguments)}")


@dataclass
class Launch:
    device: torch.device
    directory: Path
    seed: int
    output: str

    def results(self, case):
        """What each process wrote for `case`, by rank."""
        return [torch.load(self.directory / f"{case}_rank{rank}.pt", weights_only=True)
                for rank in range(PROCESSES)]

    def note(self, case):
        return f"{case} on {self.device.type}, seed {self.seed} ({SEED_VARIABLE} replays it)"


@pytest.fixture(scope="session",
                params=["cpu", pytest.param("cuda", marks=pytest.mark.multi_gpu)])
def launch(request, tmp_path_factory):
    """Every case of distributed_cases.py, run once a device by one torchrun launch."""
    device_type = request.param
    skip_without_two_gpus(device_type)
    seed = seed_for(f"distributed_cases.py {device_type}") % 2 ** 31
    directory = tmp_path_factory.mktemp(f"distributed_{device_type}")
    code, output = torchrun(["tests/distributed_cases.py", str(directory), device_type,
                             str(seed), *DDP_CASES, *COMPILE_CASES, *FSDP_CASES],
                            device_type, LAUNCH_TIMEOUT_S)
    assert code == 0, f"the launch failed (seed {seed}), exit status {code}:\n{output}"
    return Launch(torch.device(device_type), directory, seed, output)


def one_process(kind, initial, device):
    """The model of `kind` with the parameters the processes started from, on `device`."""
    model = cases.build_model(kind)
    model.load_state_dict(initial)
    return model.to(device)


def sample_magnitudes(kind, initial, device, sequences, targets):
    """Per parameter, the sum over the batch of the magnitudes of each
    sample's term of the mean loss's gradient (float64): the scale of the
    sum that DDP splits. A gradient that is a sum of terms of either sign
    (the readout's bias: the mean residual) can be far smaller than it, and
    its rounding errors are bounded by it, not by the gradient."""
    magnitudes = {}
    for sequence, target in zip(sequences.split(1), targets.split(1)):
        model = one_process(kind, initial, device)
        outputs = cases.predict(model, kind, sequence)
        term = torch.nn.functional.mse_loss(outputs, target.to(outputs.dtype), reduction="sum")
        (term / len(sequences)).backward()
        for name, gradient in cases.gradients(model).items():
            magnitudes[name] = magnitudes.get(name, 0) + gradient.double().abs()
    return magnitudes


@pytest.mark.parametrize("case", DDP_CASES + COMPILE_CASES)
@pytest.mark.slow
def test_ddp_and_compiled_ddp_equal_one_process_on_the_whole_batch(launch, case):
    """DDP averages each process's gradients of its share's mean loss: with
    equal shares, the gradients of the whole batch's mean loss. Each process
    also returns the outputs of its share."""
    results = launch.results(case)
    _, kind, batch = cases.case_parts(case)
    model = one_process(kind, results[0]["initial"], launch.device)
    sequences, targets = (tensor.to(launch.device) for tensor in results[0]["batch"])
    outputs = cases.predict(model, kind, sequences)
    torch.nn.functional.mse_loss(outputs, targets.to(outputs.dtype)).backward()
    expected = cases.gradients(model)
    magnitudes = (sample_magnitudes(kind, results[0]["initial"], launch.device, sequences, targets)
                  if kind in cases.BFLOAT16_KINDS else {})

    def assert_close(value, wanted, what, magnitude=None):
        if kind not in cases.BFLOAT16_KINDS:
            torch.testing.assert_close(value, wanted, **TIGHT, msg=lambda m: f"{what}: {m}")
            return
        assert value.dtype == wanted.dtype and value.shape == wanted.shape, what
        magnitude = wanted.double().abs() if magnitude is None else magnitude
        error = ((value.double() - wanted.double()).norm() / magnitude.norm()).item()
        assert error <= BFLOAT16_RELATIVE_ERROR, f"{what}: relative error {error:.3g}"

    for rank, result in enumerate(results):
        assert result["world_size"] == PROCESSES
        if case in COMPILE_CASES:
            operator = "lltm_ffi.forward_pass" if kind == "cell" else "lltm_ffi.packed_forward"
            assert f"{operator}.default" in result["compiled_operators"], (
                f"{launch.note(case)}, rank {rank}: no {operator} in the compiled graphs "
                f"{sorted(result['compiled_operators'])}")
        assert_close(result["outputs"], outputs.detach().cpu().chunk(PROCESSES)[rank],
                     f"{launch.note(case)}, rank {rank}")
        assert result["gradients"].keys() == expected.keys()
        for name, gradient in expected.items():
            if kind in cases.BFLOAT16_KINDS:
                assert gradient.dtype == torch.bfloat16 and gradient.norm() > 0, name
            assert_close(result["gradients"][name], gradient,
                         f"{launch.note(case)}, rank {rank}, {name}", magnitudes.get(name))


@pytest.mark.parametrize("case", FSDP_CASES)
@pytest.mark.slow
def test_fsdp2_trains_to_the_parameters_one_process_reaches(launch, case):
    """fully_shard of the LLTM layer and of the model; Adam on the shards.
    Each step's mean of the processes' losses is one process's loss on the
    whole batch, and the gathered parameters after the last step are its."""
    results = launch.results(case)
    _, kind, _ = cases.case_parts(case)
    model = one_process(kind, results[0]["initial"], launch.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cases.LEARNING_RATE)
    for step, batch in enumerate(results[0]["batches"]):
        loss = cases.loss_of(model, kind, *(tensor.to(launch.device) for tensor in batch))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        shares = sum(result["losses"][step] for result in results) / PROCESSES
        assert shares == pytest.approx(loss.item(), rel=1e-12), f"{launch.note(case)}, step {step}"
    trained = {name: parameter.detach().cpu() for name, parameter in model.named_parameters()}
    for name, value in trained.items():  # each process holds its rows of the LLTM's parameters
        rows = [result["shard_rows"][name] for result in results]
        assert sum(rows) == value.shape[0], (name, rows)
        if not name.startswith("readout."):
            assert 0 < min(rows) and max(rows) < value.shape[0], (name, rows)
    for rank, result in enumerate(results):
        assert result["trained"].keys() == trained.keys()
        for name, value in trained.items():
            torch.testing.assert_close(
                result["trained"][name], value, **TIGHT,
                msg=lambda m, name=name: f"{launch.note(case)}, rank {rank}, {name}: {m}")


# --- The demo's --distributed run ---------------------------------------------------------

# 300 sequences: two steps an epoch at the global batch of 128 (64 a process).
DEMO_SAMPLES = 300
STOPPED_AT, STEPS = 7, 12
MULTINODE_SCRIPT = REPO_ROOT / "scripts" / "multinode_demo.sh"


@pytest.fixture(scope="module",
                params=["cpu", pytest.param("cuda", marks=pytest.mark.multi_gpu)])
def demo_device(request):
    skip_without_two_gpus(request.param)
    return request.param


def demo_arguments(device_type, checkpoint, steps, *arguments):
    """The demo's --distributed run on DEMO_SAMPLES sequences, checkpointing to `checkpoint`."""
    return ["-m", "examples.demo", "--distributed", "--device", device_type, "--samples",
            str(DEMO_SAMPLES), "--steps", str(steps), "--checkpoint", str(checkpoint),
            "--plot", str(checkpoint.with_suffix(".png")), *arguments]


def run_demo(device_type, checkpoint, steps, *arguments, processes=PROCESSES, options=(),
             **variables):
    """The output of the demo's run of demo_arguments, after asserting it succeeded."""
    code, output = torchrun(demo_arguments(device_type, checkpoint, steps, *arguments),
                            device_type, DEMO_TIMEOUT_S, processes, options, **variables)
    assert code == 0, f"exit status {code}:\n{output}"
    return output


def load(path):
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def uninterrupted(demo_device, tmp_path_factory):
    """The checkpoint of a run of STEPS steps, never stopped."""
    path = tmp_path_factory.mktemp(f"uninterrupted_{demo_device}") / "whole.pt"
    run_demo(demo_device, path, STEPS, "--checkpoint-every", "5")
    return load(path)


@pytest.fixture(scope="module")
def stopped(demo_device, tmp_path_factory):
    """The checkpoint of a run stopped at step STOPPED_AT (checkpoints at 3, 6
    and 7): a test resumes from a copy of it."""
    path = tmp_path_factory.mktemp(f"stopped_{demo_device}") / "stopped.pt"
    output = run_demo(demo_device, path, STOPPED_AT, "--checkpoint-every", "3")
    assert f"checkpoint written to {path} (step {STOPPED_AT})" in output
    return path


def copy_of(checkpoint, directory):
    return Path(shutil.copy(checkpoint, directory / "resumed.pt"))


def assert_same_training(result, reference, exact):
    """The same steps, losses and parameters: bit for bit where `exact`,
    else to float32's tolerance."""
    assert result["step"] == reference["step"]
    if exact:
        assert result["losses"] == reference["losses"]
        for name, value in reference["model"].items():
            assert torch.equal(result["model"][name], value), name
    else:
        torch.testing.assert_close(torch.tensor(result["losses"]),
                                   torch.tensor(reference["losses"]))
        torch.testing.assert_close(result["model"], reference["model"])


def same_processes_same_bits(device_type):
    """Whether a resumed run on as many processes as before repeats the
    uninterrupted run's numbers bit for bit: on the CPU the same kernels
    take the same shares, gloo adds two processes' values, and the
    checkpoint keeps every bit. On GPUs, allow for a library's rounding."""
    return device_type == "cpu"


@pytest.mark.slow
def test_demo_resumes_where_it_stopped(demo_device, stopped, uninterrupted, tmp_path):
    """A run stopped at step 7 and resumed to 12 equals an uninterrupted
    run of 12: the same losses (the step numbers go on), the same parameters."""
    resumed_path = copy_of(stopped, tmp_path)
    resumed = run_demo(demo_device, resumed_path, STEPS, "--resume")

    assert f"resumed from {resumed_path} at step {STOPPED_AT}" in resumed
    assert ("trained steps 8 to 12 of a 20-step sequence, a global batch of 128 (64 on each of "
            "2 process(es))") in resumed
    assert "  step 12/12  loss " in resumed
    continued = load(resumed_path)
    assert continued["losses"][:STOPPED_AT] == load(stopped)["losses"]
    assert_same_training(continued, uninterrupted, same_processes_same_bits(demo_device))
    assert not list(tmp_path.glob("*.partial"))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed, so no loss curve was written" in resumed
    else:
        assert f"loss curve written to {resumed_path.with_suffix('.png')}" in resumed
        assert resumed_path.with_suffix(".png").stat().st_size > 0


@pytest.mark.slow
def test_demo_resumed_on_one_process_trains_on_the_same_batches(demo_device, stopped,
                                                                uninterrupted, tmp_path):
    """The checkpoint of two processes, resumed by one: it keeps the global
    batch (128, now all on one process), so it takes the uninterrupted run's
    batches. One process sums each batch's gradients in another order than
    two, so the losses after the stop equal that run's to float32's
    tolerance, not bit for bit."""
    resumed_path = copy_of(stopped, tmp_path)
    resumed = run_demo(demo_device, resumed_path, STEPS, "--resume", processes=1)

    assert "a global batch of 128 (128 on each of 1 process(es)), 2 steps an epoch" in resumed
    continued = load(resumed_path)
    assert continued["losses"][:STOPPED_AT] == uninterrupted["losses"][:STOPPED_AT]
    assert_same_training(continued, uninterrupted, exact=False)


@pytest.mark.slow
def test_demo_on_two_nodes_resumed_on_one_node(demo_device, stopped, uninterrupted, tmp_path):
    """scripts/multinode_demo.sh: two torchrun nodes of one process each (a
    c10d rendezvous on this machine; with GPUs, one GPU a node) train to
    step 7, and one node of two processes resumes to 12. Rank 0 alone
    writes the checkpoint; the two phases equal one node's runs."""
    environment = child_environment(DEVICE=demo_device, STOP=str(STOPPED_AT), STEPS=str(STEPS),
                                    OUT=str(tmp_path), PYTHON=sys.executable,
                                    LAUNCH_TIMEOUT=str(DEMO_TIMEOUT_S))
    process = subprocess.Popen(
        [str(MULTINODE_SCRIPT), "--samples", str(DEMO_SAMPLES), "--checkpoint-every", "3"],
        cwd=REPO_ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True)
    code, output = output_within(process, 3 * DEMO_TIMEOUT_S, MULTINODE_SCRIPT.name)
    assert code == 0, f"exit status {code}:\n{output}"

    assert "== 2 nodes x 1 process, steps 1-7" in output
    assert "  step 7/7  loss " in output
    assert f"resumed from {tmp_path / 'multinode.pt'} at step 7" in output
    assert "  step 8/12  loss " in output
    exact = same_processes_same_bits(demo_device)
    assert_same_training(load(tmp_path / "multinode_stopped.pt"), load(stopped), exact)
    assert_same_training(load(tmp_path / "multinode.pt"), uninterrupted, exact)
    assert sorted(path.name for path in tmp_path.glob("*.pt")) == ["multinode.pt",
                                                                   "multinode_stopped.pt"]


@pytest.mark.slow
def test_demo_restarted_by_torchrun_after_a_crash_goes_on_from_its_checkpoint(
        demo_device, uninterrupted, tmp_path):
    """--max-restarts 1 and --resume: rank 1 kills itself (SIGKILL) at step
    5 of the first attempt, torchrun starts both processes again, and they
    go on from the checkpoint of step 3 to the end. The result is the
    uninterrupted run's; the restart left no partial checkpoint."""
    path = tmp_path / "restarted.pt"
    store_variable, unshared = distributed.UNSHARED_STORE.split("=")
    output = run_demo(demo_device, path, STEPS, "--resume", "--checkpoint-every", "3",
                      options=["--max-restarts", "1"],
                      **{distributed.CRASH_VARIABLE: "5", store_variable: unshared})

    assert f"no checkpoint at {path} yet: starting at step 0" in output
    assert "exitcode: -9" in output  # torchrun's report of the killed process
    assert f"resumed from {path} at step 3" in output
    assert "trained steps 4 to 12 of a 20-step sequence" in output
    assert_same_training(load(path), uninterrupted, same_processes_same_bits(demo_device))
    assert [file.name for file in tmp_path.iterdir() if file.suffix != ".png"] == [path.name]


@pytest.mark.parametrize("samples", [300, 1000, 1024])
def test_a_steps_global_batch_is_the_same_for_every_number_of_processes(samples):
    """Whatever the world size, the processes' batches of a step together
    are the same global batch: a run resumed on another number of processes
    takes the batches the uninterrupted run would have."""
    global_batch, steps = 128, 20

    def global_batches(world_size, first_step=0):
        shares = [distributed.batches(distributed.share_sampler(range(samples), rank, world_size),
                                      global_batch // world_size, first_step)
                  for rank in range(world_size)]
        return [sorted(index for share in shares for index in next(share)[1])
                for _ in range(first_step, steps)]

    two_processes = global_batches(2)
    assert all(len(batch) == global_batch for batch in two_processes)
    assert len({tuple(batch) for batch in two_processes}) == steps
    for world_size in (1, 4, 8):
        assert global_batches(world_size) == two_processes
        assert global_batches(world_size, first_step=5) == two_processes[5:]


def without_launch_environment(monkeypatch):
    for name in distributed.ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)


def launched_as(monkeypatch, rank, world_size, local_rank=0):
    for name, value in zip(distributed.ENVIRONMENT,
                           (rank, world_size, local_rank, "localhost", 1)):
        monkeypatch.setenv(name, str(value))


def refusal(arguments, capsys):
    """The demo's parser.error message for `arguments` on the CPU."""
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--device", "cpu", *arguments])
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("arguments, message", [
    (["--distributed"], "--distributed needs the environment torchrun gives each process "
                        "(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT not set)"),
    (["--resume"], "--resume is for --distributed runs only"),
    (["--checkpoint", "state.pt"], "--checkpoint is for --distributed runs only"),
    (["--samples", "1000"], "--samples is for --distributed runs only"),
    (["--distributed", "--resume"], "--resume needs --checkpoint PATH"),
    (["--distributed", "--resume", "--checkpoint", "no/such.pt"],
     "--checkpoint no/such.pt: there is no directory no to write it in"),
    (["--distributed", "--checkpoint", "tests"],
     "--checkpoint tests is a directory: name the file to write"),
    (["--distributed", "--checkpoint-every", "0"], "--checkpoint-every must be at least 1"),
])
def test_demo_refuses_a_wrong_launch_saying_why(arguments, message, monkeypatch, capsys):
    monkeypatch.chdir(REPO_ROOT)
    without_launch_environment(monkeypatch)
    assert message in refusal(arguments, capsys)


def test_demo_refuses_too_few_samples_for_the_processes(monkeypatch, capsys):
    launched_as(monkeypatch, 0, 2)
    assert ("--samples 127: fewer than one global batch of 128 sequences (64 for each of the 2 "
            "processes)") in refusal(["--distributed", "--samples", "127"], capsys)


def test_demo_refuses_a_step_to_crash_at_that_is_no_step(monkeypatch, capsys):
    launched_as(monkeypatch, 0, 2)
    monkeypatch.setenv(distributed.CRASH_VARIABLE, "0")
    assert (f"{distributed.CRASH_VARIABLE} is '0': a step number, 1 or more"
            in refusal(["--distributed"], capsys))


def test_demo_refuses_restarts_through_the_agents_store(monkeypatch, capsys):
    launched_as(monkeypatch, 0, 2)
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    assert ("torchrun --max-restarts 1: a restarted process group can fail or hang joining "
            "through the store torchrun's agent shares with its processes; launch torchrun with "
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in its environment"
            in refusal(["--distributed"], capsys))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    assert distributed.launch_problem("cpu") is None


def test_more_processes_than_gpus_is_refused(monkeypatch):
    launched_as(monkeypatch, 0, 9, local_rank=8)
    count = torch.cuda.device_count()
    assert distributed.launch_problem("cuda") == (
        f"LOCAL_RANK is 8 but torch sees {count} GPU(s): start at most one process a GPU "
        f"(--nproc-per-node), or use --device cpu")
    assert distributed.launch_problem("cpu") is None


def saved_checkpoint(path, config):
    model = demo.SequenceRegressor(3, 5)
    distributed.save_checkpoint(path, model, torch.optim.Adam(model.parameters()), 4,
                                [1.0, 0.5, 0.25, 0.125], config)
    return path


# Settings of a run the demo never makes.
FOREIGN_CONFIG = {"samples": 9}


@pytest.mark.parametrize("config, world_size, arguments, message", [
    ("demo's", 3, [], "state.pt is of a run with a global batch of 128 sequences, which 3 "
                      "processes cannot share equally: resume on a number of processes that "
                      "divides 128"),
    ("demo's", 2, ["--samples", "1000"], "--samples 1000: PATH is of a run on 300 sequences; "
                                         "leave --samples out to go on with it"),
    ("foreign", 2, [], "state.pt holds a run with the settings {'samples': 9}, not one of this "
                       "demo's (state size 64, settings samples, global_batch, state_size)"),
], ids=["unshared-global-batch", "other-samples", "foreign-settings"])
def test_demo_refuses_to_resume_a_run_it_cannot_go_on_with(config, world_size, arguments, message,
                                                           tmp_path, monkeypatch, capsys):
    """Each process reads the checkpoint before joining the group: a run of
    other settings, or a global batch the processes cannot share equally,
    is refused there. The checkpoint is left as it was."""
    path = tmp_path / "state.pt"
    saved_checkpoint(path, FOREIGN_CONFIG if config == "foreign"
                     else distributed.fresh_config(DEMO_SAMPLES, 2))
    launched_as(monkeypatch, 0, world_size)
    error = refusal(["--distributed", "--resume", "--checkpoint", str(path), *arguments], capsys)
    assert message.replace("PATH", str(path)) in error
    assert [file.name for file in tmp_path.iterdir()] == ["state.pt"]


# One gloo process: a DistributedDataParallel model left in a reference
# cycle, with the collector off so that only finish() can free it.
FINISH_SCRIPT = """
import gc, weakref
import torch
from torch.nn.parallel import DistributedDataParallel
from examples import distributed
gc.disable()
distributed.start("cpu")
model = DistributedDataParallel(torch.nn.Linear(3, 2))
model.cycle = [model]
model(torch.randn(4, 3)).sum().backward()
alive = weakref.ref(model)
del model
distributed.finish()
print("freed" if alive() is None else "alive")
"""


@pytest.mark.slow
def test_finish_frees_a_model_in_a_reference_cycle_before_leaving_the_group():
    """finish() collects the DDP model (its reducer holds the group's gloo
    threads) while the group still stands: left to interpreter exit, a gloo
    process could abort there."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environment = child_environment(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    result = subprocess.run([sys.executable, "-c", FINISH_SCRIPT], cwd=REPO_ROOT,
                            env=environment, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["freed"]


# --- Checkpoints that are damaged, shared or orphaned ------------------------------------

def _damaged_checkpoints():
    """How a file at --checkpoint can fail to be the demo's checkpoint: each
    takes the bytes of a whole one and returns the file's."""
    def torch_file(value):
        def write(_):
            import io
            buffer = io.BytesIO()
            torch.save(value, buffer)
            return buffer.getvalue()
        return write

    return {
        "empty": lambda whole: b"",
        "cut_to_100_bytes": lambda whole: whole[:100],
        "cut_in_half": lambda whole: whole[:len(whole) // 2],
        "one_byte_short": lambda whole: whole[:-1],
        "text": lambda whole: b"step 100, loss 0.01\n",
        "a_tensor": torch_file(torch.ones(3)),
        "other_keys": torch_file({"weights": torch.ones(3), "epoch": 2}),
        "config_not_a_dict": torch_file({"step": 4, "losses": [], "config": [1, 2],
                                         "model": {}, "optimizer": {}}),
    }


DAMAGED_CHECKPOINTS = _damaged_checkpoints()


@pytest.mark.parametrize("damage", DAMAGED_CHECKPOINTS)
def test_demo_refuses_to_resume_from_a_file_that_is_not_its_checkpoint(damage, tmp_path,
                                                                       monkeypatch, capsys):
    """A damaged or foreign file at --checkpoint is refused (status 2) with
    the demo's own message, naming the file and what is wrong with it, and
    left as it was."""
    path = saved_checkpoint(tmp_path / "state.pt", distributed.fresh_config(DEMO_SAMPLES, 2))
    path.write_bytes(DAMAGED_CHECKPOINTS[damage](path.read_bytes()))
    before = path.read_bytes()
    launched_as(monkeypatch, 0, 2)
    error = refusal(["--distributed", "--resume", "--checkpoint", str(path)], capsys)
    assert f"--checkpoint {path} is not a checkpoint of this demo" in error, error
    assert "Start afresh without --resume" in error, error
    assert path.read_bytes() == before


# Writes checkpoints to argv[1] until the file argv[3] exists, each with its
# own step, from argv[2] on, as every one of its losses and parameters (a few
# MB, so that writes take a while); then says how many it wrote.
WRITER_SCRIPT = """
import sys
import torch
from pathlib import Path
from examples import demo, distributed
path, first, stop = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
model = demo.SequenceRegressor(8, 512)
optimizer = torch.optim.Adam(model.parameters())
written = 0
while not stop.exists() and written < 5000:
    step = first + written
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(step)
    distributed.save_checkpoint(path, model, optimizer, step, [float(step)] * 10,
                                distributed.fresh_config(300, 2))
    written += 1
print("wrote", written)
"""


def _mixed(state):
    """What in a checkpoint WRITER_SCRIPT wrote is not its step's, or None."""
    step = state["step"]
    if state["losses"] != [float(step)] * 10:
        return "losses"
    return next((name for name, tensor in state["model"].items()
                 if not torch.all(tensor == step)), None)


@pytest.mark.slow
def test_concurrent_checkpoint_writers_never_expose_a_partial_checkpoint(tmp_path):
    """Two processes write one checkpoint over and over while this one reads
    it: every read is one whole checkpoint of one writer, and neither writer
    fails on the other's files."""
    path, stop = tmp_path / "run.pt", tmp_path / "stop"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, str(path), str(first),
                                 str(stop)], cwd=REPO_ROOT, env=child_environment(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for first in (0, 1_000_000)]
    reads, writers_read, problems = 0, set(), []
    deadline = time.monotonic() + 300
    try:
        while (reads < 200 or len(writers_read) < 2) and time.monotonic() < deadline:
            if any(writer.poll() is not None for writer in writers):
                break
            if not path.exists():
                time.sleep(0.01)
                continue
            reads += 1
            try:
                state = distributed.load_checkpoint(path)
            except Exception as error:  # the read of a partial file: the failure sought
                problems.append(f"read {reads}: {type(error).__name__}: {error}")
                continue
            if _mixed(state):
                problems.append(f"read {reads}: step {state['step']} with another's "
                                f"{_mixed(state)}")
            writers_read.add(state["step"] >= 1_000_000)
    finally:
        stop.touch()
        outputs = [output_within(writer, 120, "a checkpoint writer") for writer in writers]
    for code, output in outputs:
        assert code == 0 and output.startswith("wrote "), output
    assert not problems, f"{len(problems)} of {reads} reads failed: {problems[:5]}"
    assert len(writers_read) == 2, "the reads never found both writers' checkpoints"
    leftovers = sorted(file.name for file in tmp_path.iterdir() if file.name not in ("run.pt",
                                                                                     "stop"))
    assert not leftovers, leftovers


class LiveLaunch:
    """A torchrun launch of the demo that runs on until stopped; its output
    gathered by a thread, so that the test can wait for a line."""

    def __init__(self, arguments, processes=1):
        self.process = start_torchrun(arguments, "cpu", processes)
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line)

    def output(self):
        return "".join(self.lines)

    def wait_for(self, text, timeout=DEMO_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"no {text!r} from the launch:\n{self.output()}")
            time.sleep(0.1)

    def workers(self):
        """The pids of the processes torchrun started."""
        pids = []
        for task in Path(f"/proc/{self.process.pid}/task").iterdir():
            pids += [int(pid) for pid in (task / "children").read_text().split()]
        return pids

    def stop(self, workers=()):
        """Kills torchrun's group and any of `workers` still there."""
        for pid in workers:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=STOP_GRACE_S)
        self.reader.join(timeout=STOP_GRACE_S)


def running(pid):
    """Whether the process `pid` is there and not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


# Long enough never to end by itself while a test watches it.
ENDLESS_STEPS = 10**6
TRAINING_STARTED = "synthetic sequences of 20 steps"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_demo_processes_end_when_torchrun_is_killed(tmp_path):
    """torchrun starts its processes in sessions of their own, so a SIGKILL
    to torchrun's process group reaches torchrun alone: the demo's processes
    notice it is gone and end, rather than train on and hold the checkpoint."""
    launch = LiveLaunch(demo_arguments("cpu", tmp_path / "run.pt", ENDLESS_STEPS,
                                       "--checkpoint-every", "5"), processes=2)
    workers = []
    try:
        launch.wait_for(TRAINING_STARTED)
        workers = launch.workers()
        assert len(workers) == 2, workers
        os.killpg(launch.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(map(running, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(running, workers)), (
            f"the demo's processes {[pid for pid in workers if running(pid)]} outlived torchrun "
            f"by 30 s:\n{launch.output()}")
    finally:
        launch.stop(workers)
    assert "torchrun (pid" in launch.output() and "is gone" in launch.output(), launch.output()


@pytest.mark.slow
def test_a_second_run_on_a_checkpoint_being_written_refuses_saying_so(tmp_path):
    """Two runs never write one checkpoint: the second, while the first
    trains, exits 1 naming the checkpoint and the run that writes it, and
    leaves the checkpoint to it."""
    path = tmp_path / "run.pt"
    first = LiveLaunch(demo_arguments("cpu", path, ENDLESS_STEPS, "--checkpoint-every", "1"))
    try:
        first.wait_for(TRAINING_STARTED)
        deadline = time.monotonic() + DEMO_TIMEOUT_S
        while not path.exists() and first.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert path.exists(), first.output()
        code, output = torchrun(demo_arguments("cpu", path, 3, "--resume"), "cpu",
                                DEMO_TIMEOUT_S, processes=1)
        assert code == 1, output
        assert f"another run is writing {path}" in output, output
        assert "pid" in output, output
        # The first run writes on.
        assert first.process.poll() is None, first.output()
        assert distributed.load_checkpoint(path)["step"] >= 1
    finally:
        first.stop()
