"""Chapter 13's data-parallel worker on 2 CPU processes (gloo): the translator trained by DDP on every other
pair of each global token-budget batch equals one process on the whole batch, a step that divides by each
rank's own token count does not, and the timing reports what the chapter reads. Once on this machine's
profile and once rehearsing an H100 (its processes are CPU processes with gloo, at the CPU's sizes).

Tolerances, float32: the two runs sum the same per-token gradients in a different order (per rank, then the
all-reduce, against one batch), which changes results by a few units in the last place (float32's unit at 1
is 1.2e-7). Measured here: first gradients 6e-8 apart (largest 0.18), weights after 4 SGD steps 1.2e-7 (largest
about 1), losses 1.4e-6 (about 7.9: a unit in the last place is 9.5e-7). The bounds, 1e-6 for gradients,
1e-5 for weights and losses, leave 10 to 100 units of slack and sit at least two orders of magnitude below the
control's gaps (4e-3, 3e-3, 5e-4 measured): an error as small as the old step's, which weighs the ranks'
tokens 336 : 322 as if equal, fails them.
"""

import pytest

from gpuformer_lib import translation_task
from gpuformer_lib import distributed as D
from gpuformer_lib import profiles
from gpuformer_lib.workers import translation

WORKER = D.worker_path("translation")
EQUIVALENCE_KEYS = {"world_size", "preset", "parameters", "steps", "optimizer", "dropout", "pairs_per_step",
                    "tokens_per_rank", "padded_tokens_per_rank", "losses", "max_abs_weight", "max_abs_gradient",
                    "data parallel", "each rank's own count"}
GAP_KEYS = {"gradient_gap", "weight_gap", "loss_gap", "replica_spread"}
TIMING_KEYS = {"world_size", "preset", "repeats", "step_s", "per_repeat_s", "speedup", "efficiency",
               "communication_share", "tokens_per_step"}
STEP_NAMES = {"one process", "no communication", "data parallel"}


# 8xh100: the world chapter 13 launches on an 8-GPU node (data_parallel_world), rehearsed here with 8 gloo processes
# instead of in the notebook (make rehearse leaves chapter 13 out under 8xh100: this is its only 8-rank path)
@pytest.mark.parametrize("rehearse, world", [(None, 2), ("h100-80gb", 2), ("8xh100", 8)])
def test_data_parallel_translation_equals_one_process_and_is_timed(rehearse, world, monkeypatch):
    if rehearse is None:
        monkeypatch.delenv(profiles.REHEARSE_ENV, raising=False)
    else:
        monkeypatch.setenv(profiles.REHEARSE_ENV, rehearse)
        profile = profiles.current_profile()
        case = translation_task.case_run(profiles.size_preset(profile), 100, 100)  # chapter 13's batch
        assert profiles.data_parallel_world(profile, case.batch_size) == (world, "gloo")
    extra = {profiles.REHEARSE_ENV: rehearse} if rehearse else None
    results = D.launch(WORKER, world, ["all"], backend="gloo", echo=False, timeout_s=240, extra_env=extra).results
    eq, timing = results["equivalence"], results["timing"]
    assert set(eq) == EQUIVALENCE_KEYS and set(timing) == TIMING_KEYS
    assert eq["world_size"] == timing["world_size"] == world and eq["steps"] == translation.STEPS
    assert eq["dropout"] == 0.0
    assert eq["preset"].startswith("gpu" if rehearse else "cpu") and ("rehearsed" in eq["preset"]) == bool(rehearse)
    # the shares really differ: unequal real tokens, and padded lengths that differ between the ranks
    assert any(len(set(t)) > 1 for t in eq["tokens_per_rank"])
    assert any(len(set(t)) > 1 for t in eq["padded_tokens_per_rank"])
    assert all(len(t) == world for t in eq["tokens_per_rank"])
    assert len(eq["losses"]["one process"]) == translation.STEPS
    dp, control = eq["data parallel"], eq["each rank's own count"]
    assert set(dp) == set(control) == GAP_KEYS
    assert dp["gradient_gap"] < 1e-6 and dp["weight_gap"] < 1e-5 and dp["loss_gap"] < 1e-5, dp
    assert dp["replica_spread"] == 0.0  # DDP hands every rank the same gradients: the same weights, bit for bit
    assert control["gradient_gap"] > 1e-4 and control["weight_gap"] > 1e-4 and control["replica_spread"] > 1e-4, control
    assert 0.01 < eq["max_abs_gradient"] and 0.1 < eq["max_abs_weight"] < 10  # the gaps' scale: not all zeros
    # timing: every step timed on every repeat, the speedup and efficiency consistent with the medians
    assert set(timing["step_s"]) == set(timing["per_repeat_s"]) == STEP_NAMES
    assert all(len(t) == timing["repeats"] and min(t) > 0 for t in timing["per_repeat_s"].values())
    steps = timing["step_s"]
    assert timing["speedup"] == pytest.approx(steps["one process"] / steps["data parallel"])
    assert timing["efficiency"] == pytest.approx(timing["speedup"] / world)
    assert -1 < timing["communication_share"] < 1
    assert len(timing["tokens_per_step"]) == translation.STEPS
    assert results["seconds"] > 0
