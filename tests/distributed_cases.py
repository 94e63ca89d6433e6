"""What each process of test_distributed.py's torchrun launch does: every
case in one process group (gloo on the CPU, NCCL on cuda:LOCAL_RANK), each
process writing what it computed to OUTDIR/CASE_rankN.pt. The test process
then computes the same thing in one process on the whole batch and compares.

    torchrun --standalone --nproc-per-node 2 tests/distributed_cases.py OUTDIR cpu|cuda SEED CASE...

Every process draws the same whole batch (from the case's seed) and takes
its own equal share of it, so DDP's average of the shares' gradients is the
gradient of the whole batch's mean loss.
"""

import os
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

# conftest puts the checkout first on sys.path (this file runs as a script from tests/).
import conftest  # noqa: F401

import lltm_ffi  # noqa: E402
from examples import demo, distributed  # noqa: E402

INPUT_FEATURES, STATE_SIZE, SEQUENCE_STEPS = 5, 7, 4
FSDP_STEPS = 3
LEARNING_RATE = 1e-2


class CellLoopRegressor(torch.nn.Module):
    """The demo's task by a Python loop over lltm_ffi.LLTM, (steps, batch, features)."""

    def __init__(self, input_features, state_size):
        super().__init__()
        self.cell = lltm_ffi.LLTM(input_features, state_size)
        self.readout = torch.nn.Linear(state_size, 1)

    def forward(self, sequence):
        h = cell = sequence.new_zeros(sequence.shape[1], self.cell.state_size)
        for step in sequence:
            h, cell = self.cell(step, (h, cell))
        return self.readout(h).squeeze(1)


class LayersRegressor(torch.nn.Module):
    """The demo's task by a two-layer bidirectional LLTMSequence, (batch,
    steps, features): a readout of the last layer's final states, both
    directions."""

    def __init__(self, input_features, state_size):
        super().__init__()
        self.rnn = lltm_ffi.LLTMSequence(input_features, state_size, num_layers=2,
                                         bidirectional=True, batch_first=True)
        self.readout = torch.nn.Linear(2 * state_size, 1)

    def forward(self, sequences):
        _, (h_n, _) = self.rnn(sequences)
        return self.readout(torch.cat((h_n[-2], h_n[-1]), dim=1)).squeeze(1)


# The models in bfloat16 (their losses in float32); every other one is float64.
BFLOAT16_KINDS = ("layers_bf16",)


def build_model(kind):
    """On the CPU, parameters from torch's global generator: `cell` is a loop
    over lltm_ffi.LLTM, `sequence` the demo's LLTMSequence model, `layers` a
    two-layer bidirectional one, all float64; `layers_bf16` that one in
    bfloat16."""
    if kind == "cell":
        return CellLoopRegressor(INPUT_FEATURES, STATE_SIZE).double()
    if kind in ("layers", "layers_bf16"):
        model = LayersRegressor(INPUT_FEATURES, STATE_SIZE)
        return model.to(torch.bfloat16 if kind in BFLOAT16_KINDS else torch.float64)
    return demo.SequenceRegressor(INPUT_FEATURES, STATE_SIZE, batch_first=True,
                                  dtype=torch.float64)


def predict(model, kind, sequences):
    """The model on (batch, steps, features) in its dtype (the cell model
    takes steps first), as the loss takes it: float32 for a bfloat16
    model."""
    sequences = sequences.to(torch.bfloat16 if kind in BFLOAT16_KINDS else torch.float64)
    outputs = model(sequences.transpose(0, 1) if kind == "cell" else sequences)
    return outputs.float() if kind in BFLOAT16_KINDS else outputs


def whole_batch(seed, batch_size):
    """(sequences, targets) of one whole batch, on the CPU in float64."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(batch_size, SEQUENCE_STEPS, INPUT_FEATURES, generator=generator,
                        dtype=torch.float64),
            torch.randn(batch_size, generator=generator, dtype=torch.float64))


def loss_of(model, kind, sequences, targets):
    outputs = predict(model, kind, sequences)
    return F.mse_loss(outputs, targets.to(outputs.dtype))


def share(tensors, rank, world_size):
    """This process's equal share of each tensor's batch (first) dimension."""
    return [tensor.chunk(world_size)[rank] for tensor in tensors]


def gradients(model):
    return {name: parameter.grad.detach().cpu() for name, parameter in model.named_parameters()}


def case_parts(case):
    """'ddp-cell-3' -> ('ddp', 'cell', 3): what runs, on which model, the batch of each process."""
    what, kind, batch = case.split("-")
    return what, kind, int(batch)


def recording_inductor(operators):
    """Inductor, adding to `operators` the name of every operator in the graphs
    it compiles. DDP's forward itself runs eagerly: dynamo compiles the
    wrapped module's, split where DDP's gradient buckets end."""
    def backend(graph_module, example_inputs):
        operators.update(str(node.target) for node in graph_module.graph.nodes
                         if node.op == "call_function")
        return torch._inductor.compile(graph_module, example_inputs)
    return backend


def run_case(case, seed, rank, world_size, device):
    what, kind, batch = case_parts(case)
    torch.manual_seed(seed)
    model = build_model(kind)
    result = {"initial": {name: value.clone() for name, value in model.state_dict().items()}}
    model.to(device)
    device_ids = [device.index] if device.type == "cuda" else None
    if what == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # fully_shard's own mesh is on the GPU wherever there is one.
        mesh = init_device_mesh(device.type, (world_size,))
        fully_shard(model.cell if kind == "cell" else model.rnn, mesh=mesh)
        fully_shard(model, mesh=mesh)
        result["shard_rows"] = {name: parameter.to_local().shape[0]
                                for name, parameter in model.named_parameters()}
        optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
        result["batches"], result["losses"] = [], []
        for step in range(FSDP_STEPS):
            sequences, targets = whole_batch(seed + 1 + step, batch * world_size)
            result["batches"].append((sequences, targets))
            mine = [tensor.to(device) for tensor in share((sequences, targets), rank, world_size)]
            loss = loss_of(model, kind, *mine)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            result["losses"].append(loss.item())
        result["trained"] = {name: parameter.full_tensor().detach().cpu()
                             for name, parameter in model.named_parameters()}
        return result
    sequences, targets = whole_batch(seed + 1, batch * world_size)
    result["batch"] = (sequences, targets)
    mine = [tensor.to(device) for tensor in share((sequences, targets), rank, world_size)]
    if what == "ddp":
        wrapped = DistributedDataParallel(model, device_ids=device_ids)
    else:
        result["compiled_operators"] = set()
        wrapped = torch.compile(DistributedDataParallel(model, device_ids=device_ids),
                                backend=recording_inductor(result["compiled_operators"]))
    outputs = predict(wrapped, kind, mine[0])
    F.mse_loss(outputs, mine[1].to(outputs.dtype)).backward()
    result["outputs"] = outputs.detach().cpu()
    result["gradients"] = gradients(model)
    return result


def main(outdir, device_type, seed, cases):
    rank, world_size, device = distributed.start(device_type)
    # Each process compiles into a cache of its own: two writing one cache race.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(outdir) / f"inductor_rank{rank}")
    # FSDP2 warns for every module output that is a view (LLTMSequence's, a readout
    # column); nothing here writes into one in place, which is what it warns of.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    for index, case in enumerate(cases):
        result = run_case(case, seed + 1000 * index, rank, world_size, device)
        result["world_size"] = world_size
        torch.save(result, Path(outdir) / f"{case}_rank{rank}.pt")
    distributed.finish()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:])
