"""lltm_ffi under torch.distributed, two processes launched by torchrun:
DistributedDataParallel gradients of a model on lltm_ffi.LLTM, of one on
LLTMSequence and of one on a two-layer bidirectional LLTMSequence equal one
process's on the whole batch; FSDP2 (fully_shard) of
the LLTM parameters trains to the parameters one process reaches;
torch.compile of the DDP-wrapped models gives the same outputs and
gradients; the demo's --distributed run checkpoints and resumes where it
stopped, and refuses a wrong launch; leaving the process group frees the
DDP model first.

Each variant runs with gloo on the CPU and, where there are two GPUs, with
NCCL on cuda:0 and cuda:1 (NVLink multicast off: NCCL_NVLS_ENABLE=0). All the
cases of a device run in one torchrun launch (tests/distributed_cases.py);
every launch runs under a timeout, so that a hang fails the tests. torchrun
--standalone finds a free port itself.
"""

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import distributed_cases as cases
from checkouts import output_within
from conftest import REPO_ROOT, SEED_VARIABLE
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
    "ddp-layers-3"]
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


def torchrun(arguments, device_type, timeout):
    """(return code, output) of `torchrun --standalone` with PROCESSES
    processes, in a process group of its own that is killed past `timeout`."""
    environment = child_environment()
    if device_type == "cuda":
        environment.update(NVLINK_MULTICAST_OFF)
    process = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={PROCESSES}", *arguments],
        cwd=REPO_ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True)
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


@pytest.fixture(scope="session", params=["cpu", "cuda"])
def launch(request, tmp_path_factory):
    """Every case of distributed_cases.py, run once a device by one torchrun launch."""
    device_type = request.param
    skip_without_two_gpus(device_type)
    seed = int(os.environ.get(SEED_VARIABLE) or torch.Generator().seed() % 2 ** 31)
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


@pytest.mark.parametrize("case", DDP_CASES + COMPILE_CASES)
def test_ddp_and_compiled_ddp_equal_one_process_on_the_whole_batch(launch, case):
    """DDP averages each process's gradients of its share's mean loss: with
    equal shares, the gradients of the whole batch's mean loss. Each process
    also returns the outputs of its share."""
    results = launch.results(case)
    _, kind, batch = cases.case_parts(case)
    model = one_process(kind, results[0]["initial"], launch.device)
    sequences, targets = (tensor.to(launch.device) for tensor in results[0]["batch"])
    outputs = cases.predict(model, kind, sequences)
    torch.nn.functional.mse_loss(outputs, targets).backward()
    expected = cases.gradients(model)
    for rank, result in enumerate(results):
        assert result["world_size"] == PROCESSES
        if case in COMPILE_CASES:
            operator = "lltm_ffi.forward_pass" if kind == "cell" else "lltm_ffi.sequence_forward"
            assert f"{operator}.default" in result["compiled_operators"], (
                f"{launch.note(case)}, rank {rank}: no {operator} in the compiled graphs "
                f"{sorted(result['compiled_operators'])}")
        torch.testing.assert_close(result["outputs"], outputs.detach().cpu().chunk(PROCESSES)[rank],
                                   **TIGHT, msg=lambda m: f"{launch.note(case)}, rank {rank}: {m}")
        assert result["gradients"].keys() == expected.keys()
        for name, gradient in expected.items():
            torch.testing.assert_close(
                result["gradients"][name], gradient, **TIGHT,
                msg=lambda m, name=name: f"{launch.note(case)}, rank {rank}, {name}: {m}")


@pytest.mark.parametrize("case", FSDP_CASES)
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

@pytest.fixture(params=["cpu", "cuda"])
def demo_device(request):
    skip_without_two_gpus(request.param)
    return request.param


def run_demo(device_type, *arguments):
    """The demo's --distributed run on 300 sequences (150 a process, so two
    steps an epoch at batch 64): its output, after asserting it succeeded."""
    code, output = torchrun(["-m", "examples.demo", "--distributed", "--device", device_type,
                             "--samples", "300", *arguments], device_type, DEMO_TIMEOUT_S)
    assert code == 0, f"exit status {code}:\n{output}"
    return output


def load(path):
    return torch.load(path, weights_only=True)


def test_demo_resumes_where_it_stopped(demo_device, tmp_path):
    """7 steps, then a resumed run to 12, equal an uninterrupted run of 12:
    the same losses (the step numbers go on) and the same parameters."""
    stopped, whole = tmp_path / "stopped.pt", tmp_path / "whole.pt"
    first = run_demo(demo_device, "--steps", "7", "--checkpoint", str(stopped),
                     "--checkpoint-every", "3", "--plot", str(tmp_path / "first.png"))
    assert f"checkpoint written to {stopped} (step 7)" in first
    after_seven = load(stopped)
    resumed = run_demo(demo_device, "--steps", "12", "--checkpoint", str(stopped), "--resume",
                       "--plot", str(tmp_path / "resumed.png"))
    run_demo(demo_device, "--steps", "12", "--checkpoint", str(whole), "--checkpoint-every", "5",
             "--plot", str(tmp_path / "whole.png"))

    assert f"resumed from {stopped} at step 7" in resumed
    assert "trained steps 8 to 12 of a 20-step sequence, batch 64 on each of 2 process" in resumed
    assert "  step 12/12  loss " in resumed
    continued, uninterrupted = load(stopped), load(whole)
    assert after_seven["step"] == 7 and len(after_seven["losses"]) == 7
    assert continued["step"] == uninterrupted["step"] == 12
    assert continued["losses"][:7] == after_seven["losses"]
    # float32 training: the same computation, but allow for a GPU library's rounding.
    torch.testing.assert_close(torch.tensor(continued["losses"]),
                               torch.tensor(uninterrupted["losses"]))
    torch.testing.assert_close(continued["model"], uninterrupted["model"])
    assert not list(tmp_path.glob("*.partial"))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed, so no loss curve was written" in resumed
    else:
        assert f"loss curve written to {tmp_path / 'resumed.png'}" in resumed
        assert (tmp_path / "resumed.png").stat().st_size > 0


@pytest.mark.parametrize("arguments, message", [
    (["--distributed"], "--distributed needs the environment torchrun gives each process "
                        "(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT not set)"),
    (["--resume"], "--resume is for --distributed runs only"),
    (["--checkpoint", "state.pt"], "--checkpoint is for --distributed runs only"),
    (["--samples", "1000"], "--samples is for --distributed runs only"),
    (["--distributed", "--resume"], "--resume needs --checkpoint PATH"),
    (["--distributed", "--resume", "--checkpoint", "no/such.pt"],
     "--resume: no checkpoint at no/such.pt"),
    (["--distributed", "--checkpoint-every", "0"], "--checkpoint-every must be at least 1"),
])
def test_demo_refuses_a_wrong_launch_saying_why(arguments, message, monkeypatch, capsys):
    for name in distributed.ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--device", "cpu", *arguments])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_demo_refuses_too_few_samples_for_the_processes(monkeypatch, capsys):
    for name, value in zip(distributed.ENVIRONMENT, ("0", "2", "0", "localhost", "1")):
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--device", "cpu", "--distributed", "--samples", "127"])
    assert exit_info.value.code == 2
    assert ("--samples 127: each of the 2 processes needs at least a batch (64)"
            in capsys.readouterr().err)


def test_more_processes_than_gpus_is_refused(monkeypatch):
    for name, value in zip(distributed.ENVIRONMENT, ("0", "9", "8", "localhost", "1")):
        monkeypatch.setenv(name, value)
    count = torch.cuda.device_count()
    assert distributed.launch_problem("cuda") == (
        f"LOCAL_RANK is 8 but torch sees {count} GPU(s): start at most one process a GPU "
        f"(--nproc-per-node), or use --device cpu")
    assert distributed.launch_problem("cpu") is None


def test_a_checkpoint_of_another_configuration_is_refused(tmp_path):
    model = demo.SequenceRegressor(3, 5)
    optimizer = torch.optim.Adam(model.parameters())
    path = tmp_path / "state.pt"
    distributed.save_checkpoint(path, model, optimizer, 4, [1.0, 0.5, 0.25, 0.125], {"samples": 9})
    assert distributed.load_checkpoint(path, "cpu", {"samples": 9})["step"] == 4
    with pytest.raises(ValueError, match=r"state.pt was written by a run with \{'samples': 9\}, "
                                         r"this run has \{'samples': 8\}"):
        distributed.load_checkpoint(path, "cpu", {"samples": 8})
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
