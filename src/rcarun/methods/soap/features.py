"""What SOAP keeps of a trajectory's forward passes: per step, from the pass that scored it (paper 004, A.3).

Everything later (reference, scores, rescoring, every configuration tried) is arithmetic on these arrays, so
the model runs once per trajectory; each pass is reduced to its targets' rows as soon as it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from rcarun.data import Trajectory
from rcarun.methods.forward import ForwardModel, SegmentStates
from rcarun.methods.soap.inputs import (
    InputPlan,
    Oversize,
    PlannedPass,
    Segments,
    Sharing,
    plan_passes,
    prepare_segments,
)

__all__ = ["DEFAULT_CONTEXT_TOKENS", "TrajectoryFeatures", "extract_features", "plan_for"]

DEFAULT_CONTEXT_TOKENS = 8_192
"""The paper's per-prompt limit (App. A.2); a model with a smaller window lowers it."""


@dataclass(frozen=True, slots=True, eq=False)
class TrajectoryFeatures:
    """The reduced forward passes of one trajectory.

    Attributes:
        qid: the trajectory.
        layers: the ``hidden_states`` index of each entry on ``pooled``'s first axis (0 = embeddings).
        pooled: ``[len(layers), n_steps, hidden]`` float32: each step's token states mean-pooled.
        attention: ``[n_layers, n_steps, n_steps]`` float32: ``[l, t, j]`` attention from step ``t`` to step
            ``j`` at decoder layer ``l`` (heads averaged), from ``t``'s own pass; 0 where not ``retained``.
        retained: ``[n_steps, n_steps]`` bool: step ``j`` precedes ``t`` and is inside ``t``'s window.
        task_attention: ``[n_layers, n_steps]`` float32: attention from each step to the task segment.
        nll: ``[n_steps]`` float32: mean negative log-likelihood of each step's tokens.
        n_tokens: tokens of each step as the model saw them.
        passes: forward passes run.
        tokens: tokens fed over all passes, chat template included.
        windowed: some step's window dropped older steps.
        task_cut: the task text was cut to fit.
        steps_cut: steps whose content was cut to fit.
    """

    qid: str
    layers: tuple[int, ...]
    pooled: npt.NDArray[np.float32]
    attention: npt.NDArray[np.float32]
    retained: npt.NDArray[np.bool_]
    task_attention: npt.NDArray[np.float32]
    nll: npt.NDArray[np.float32]
    n_tokens: tuple[int, ...]
    passes: int
    tokens: int
    windowed: bool = False
    task_cut: bool = False
    steps_cut: tuple[int, ...] = ()

    @property
    def n_steps(self) -> int:
        return len(self.n_tokens)

    @property
    def n_layers(self) -> int:
        """Decoder layers of the model (the attention's first axis)."""
        return int(self.attention.shape[0])

    def representation(self, layer: int) -> npt.NDArray[np.float32]:
        """``[n_steps, hidden]``: the step representations at ``hidden_states`` index ``layer``."""
        if layer not in self.layers:
            raise KeyError(f"{self.qid}: layer {layer} was not kept (kept: {self.layers})")
        rows: npt.NDArray[np.float32] = self.pooled[self.layers.index(layer)]
        return rows


def plan_for(
    model: ForwardModel,
    trajectory: Trajectory,
    *,
    context_tokens: int | None = DEFAULT_CONTEXT_TOKENS,
    sharing: Sharing = "grouped",
    oversize: Oversize = "cut",
) -> tuple[Segments, InputPlan]:
    """The segments and passes for ``trajectory`` on ``model``; the limit is the smaller of ``context_tokens``
    and the model's own (``None``: the model's)."""
    limit = model.context_tokens if context_tokens is None else min(context_tokens, model.context_tokens)
    segments = prepare_segments(
        trajectory,
        model.count_tokens,
        context_tokens=limit,
        template_tokens=model.template_tokens,
        oversize=oversize,
    )
    plan = plan_passes(
        segments.task_tokens,
        segments.step_tokens,
        context_tokens=limit,
        template_tokens=model.template_tokens,
        sharing=sharing,
    )
    return segments, plan


def _check_states(states: SegmentStates, forward_pass: PlannedPass, n_layers: int, qid: str) -> None:
    segments = forward_pass.n_segments
    expected = {
        "pooled": (n_layers + 1, segments),
        "attention": (n_layers, segments, segments),
        "nll": (segments,),
    }
    shapes = {
        "pooled": states.pooled.shape[:2],
        "attention": states.attention.shape,
        "nll": states.nll.shape,
    }
    for name, shape in expected.items():
        if tuple(shapes[name]) != shape:
            raise ValueError(
                f"{qid}: the model returned {name} of shape {tuple(shapes[name])} for a pass of {segments} "
                f"segments; expected {shape}"
            )
    if len(states.n_tokens) != segments:
        raise ValueError(
            f"{qid}: the model returned {len(states.n_tokens)} token counts for {segments} segments"
        )


async def extract_features(
    model: ForwardModel,
    trajectory: Trajectory,
    *,
    context_tokens: int | None = DEFAULT_CONTEXT_TOKENS,
    sharing: Sharing = "grouped",
    oversize: Oversize = "cut",
    layers: Sequence[int] | None = None,
) -> TrajectoryFeatures:
    """Run the planned passes over ``trajectory`` and keep, per step, its row of the pass that scored it.

    Args:
        model: the frozen causal LM.
        trajectory: the trajectory to read.
        context_tokens: the per-pass limit (module `rcarun.methods.soap.inputs`); None = the model's.
        sharing: how passes are shared between targets (`rcarun.methods.soap.inputs.plan_passes`).
        oversize: ``"cut"`` or ``"error"`` for a segment that cannot fit.
        layers: ``hidden_states`` indices to keep pooled states for; None keeps all ``0 … n_layers`` (what
            hyperparameter selection needs; a fitted scorer keeps one).

    Passes run one after another: each is reduced before the next starts, and a backend batches within its own
    queue; concurrency across trajectories is the caller's.
    """
    kept = tuple(range(model.n_layers + 1)) if layers is None else tuple(layers)
    for layer in kept:
        if not 0 <= layer <= model.n_layers:
            raise ValueError(f"layer {layer} is outside 0..{model.n_layers}")
    segments, plan = plan_for(
        model, trajectory, context_tokens=context_tokens, sharing=sharing, oversize=oversize
    )
    n = trajectory.n_steps
    n_layers = model.n_layers
    pooled: npt.NDArray[np.float32] | None = None
    attention = np.zeros((n_layers, n, n), dtype=np.float32)
    retained = np.zeros((n, n), dtype=bool)
    task_attention = np.zeros((n_layers, n), dtype=np.float32)
    nll = np.zeros(n, dtype=np.float32)
    n_tokens = [0] * n
    for forward_pass in plan.passes:
        texts = [segments.texts[0], *segments.texts[1 + forward_pass.start : 1 + forward_pass.stop]]
        states = await model.encode(texts)
        _check_states(states, forward_pass, n_layers, trajectory.qid)
        if pooled is None:
            pooled = np.zeros((len(kept), n, states.pooled.shape[2]), dtype=np.float32)
        for target in forward_pass.targets:
            segment = forward_pass.segment_of(target)
            pooled[:, target] = states.pooled[list(kept), segment]
            # Segments 1 … segment-1 of this pass are steps start … target-1.
            attention[:, target, forward_pass.start : target] = states.attention[:, segment, 1:segment]
            retained[target, forward_pass.start : target] = True
            task_attention[:, target] = states.attention[:, segment, 0]
            nll[target] = states.nll[segment]
            n_tokens[target] = states.n_tokens[segment]
    if pooled is None:
        pooled = np.zeros((len(kept), 0, 0), dtype=np.float32)
    return TrajectoryFeatures(
        qid=trajectory.qid,
        layers=kept,
        pooled=pooled,
        attention=attention,
        retained=retained,
        task_attention=task_attention,
        nll=nll,
        n_tokens=tuple(n_tokens),
        passes=len(plan.passes),
        tokens=plan.tokens,
        windowed=plan.windowed,
        task_cut=segments.task_cut,
        steps_cut=segments.steps_cut,
    )
