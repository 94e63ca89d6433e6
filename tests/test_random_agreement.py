"""Seeded random agreement with the reference cell: shapes (batch 1..33,
input_features 0..70, state_size 1..300) and value scales (each argument
scaled by its own factor, log-uniform in 1e-3..30) drawn from the test's
seed, both outputs and all five gradients compared through
selfcheck.compare_with_reference, on the CPU and (where there is one) the GPU.

A failure prints the seed; LLTM_TEST_SEED=<seed> replays the same shape,
scales and values. No hypothesis: the project depends on torch, cffi and
pytest only.

Tolerance: selfcheck.TOLERANCES (1e-5 float32, 1e-12 float64), widened only
where the inputs make the cell ill-conditioned (large scales saturate the
gates, and 1 - sigmoid(z) cancels): there lltm_ffi must stay within
CONDITIONING_FACTOR times the error of the reference cell itself computed in
float32 (scaled by float64's epsilon over float32's for float64).
"""

import math
import random

import pytest
import torch

from conftest import assert_agrees_with_reference, shape_id
from lltm_ffi import reference, selfcheck

CASES = 30  # per device and dtype
SCALE_RANGE = (1e-3, 30.0)
CONDITIONING_FACTOR = 20.0
EPSILON_RATIO = {torch.float32: 1.0, torch.float64: 2.0 ** -29}  # float64 eps / float32 eps

# Fixed shapes for both kernel paths and their edges (also what `make memcheck`
# runs the CUDA kernels on): batch 1, one state, no features, state a
# multiple of 4 (float32 16-byte packs) or of 2 (float64) or neither, the CUDA
# block size (256) and one past it.
EDGE_SHAPES = [(1, 1, 1), (1, 0, 4), (1, 3, 8), (2, 5, 3), (1, 2, 2), (4, 3, 12), (7, 9, 65),
               (5, 7, 256), (33, 1, 257), (3, 70, 300), (2, 4, 6), (9, 11, 1)]


def _draw(seed):
    """(batch, input_features, state_size) and one scale per argument, from `seed`."""
    rng = random.Random(seed)
    shape = (rng.randint(1, 33), rng.randint(0, 70), rng.randint(1, 300))
    low, high = (math.log(bound) for bound in SCALE_RANGE)
    scales = [math.exp(rng.uniform(low, high)) for _ in range(5)]
    return shape, scales


def _scaled(scales, monkeypatch):
    """Makes compare_with_reference draw its inputs scaled by `scales`."""
    draw = selfcheck.random_inputs

    def scaled_inputs(*args, **kwargs):
        return tuple(tensor * scale for tensor, scale in zip(draw(*args, **kwargs), scales))

    monkeypatch.setattr(selfcheck, "random_inputs", scaled_inputs)


@pytest.mark.parametrize("case", range(CASES))
def test_random_shape_and_scales_agree_with_reference(case, dtype, device, seed, monkeypatch):
    shape, scales = _draw(seed)
    _scaled(scales, monkeypatch)
    errors = selfcheck.compare_with_reference(*shape, dtype, device, seed=seed)
    # How hard the inputs are: the reference cell's own float32 error.
    conditioning = selfcheck.compare_with_reference(*shape, torch.float32, device, seed=seed,
                                                    function=reference.lltm)
    failures = []
    for name in selfcheck.OUTPUT_NAMES + selfcheck.GRADIENT_NAMES:
        allowed = max(selfcheck.TOLERANCES[dtype],
                      CONDITIONING_FACTOR * EPSILON_RATIO[dtype] * conditioning[name])
        if not errors[name] <= allowed:  # NaN fails
            failures.append(f"{name}: {errors[name]:.3g} > {allowed:.3g} (reference in float32: "
                            f"{conditioning[name]:.3g})")
    assert not failures, (f"shape {shape_id(shape)}, scales "
                          f"{', '.join(f'{scale:.3g}' for scale in scales)} (input, weights, "
                          f"bias, old_h, old_cell), seed {seed}: " + "; ".join(failures))


@pytest.mark.parametrize("shape", EDGE_SHAPES, ids=shape_id)
def test_edge_shapes_agree_with_reference(shape, dtype, device, seed):
    assert_agrees_with_reference(
        selfcheck.compare_with_reference(*shape, dtype, device, seed=seed), dtype)
