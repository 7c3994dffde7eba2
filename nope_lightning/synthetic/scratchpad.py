"""The paper's unified scratchpad: a sequence of steps, each made of up to five components.

Kazemnejad et al. (Sec. 6) split every step of a scratchpad into

* ``step_input``             - the part of the input this step reads,
* ``step_computation``       - the computation it performs,
* ``step_output``            - the step's result,
* ``intermediate_variables`` - state carried to the next step (carry, running sum, parity),
* ``remaining_input``        - the input still to be processed,

and compare eight formats: no scratchpad (``none``), ``full``, ``minimal`` (computation and output
only) and ``full`` minus each component (``full_minus_<component>``). A task only offers the
"minus" formats for components its steps have: sorting and LEGO have no intermediate variables, so
``full_minus_intermediate_variables`` would equal ``full`` and is not offered.

Layout of a target with a scratchpad (each marker is one token)::

    <in> 7 , 8 <comp> 7 + 8 + 0 = 1 5 <out> 5 <vars> carry = 1 <rem> 3 5 + 4 <step> <in> ... <ans> 4 0 5

Components keep this fixed order; steps are separated by ``<step>``; ``<ans>`` starts the final
answer. Without a scratchpad the target is the answer alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from .core import EOS, SEP, Step

COMPONENTS = (
    "step_input",
    "step_computation",
    "step_output",
    "intermediate_variables",
    "remaining_input",
)
MARKERS = {
    "step_input": "<in>",
    "step_computation": "<comp>",
    "step_output": "<out>",
    "intermediate_variables": "<vars>",
    "remaining_input": "<rem>",
}
STEP_MARKER = "<step>"
ANSWER_MARKER = "<ans>"
SCRATCHPAD_MARKERS = (*MARKERS.values(), STEP_MARKER, ANSWER_MARKER)
MINIMAL = ("step_computation", "step_output")
_COMPONENT_OF_MARKER = {marker: name for name, marker in MARKERS.items()}


def step(**components: list[str]) -> Step:
    """Build a step from component keyword arguments, rejecting unknown component names."""
    unknown = set(components) - set(COMPONENTS)
    if unknown:
        raise ValueError(f"unknown scratchpad components {sorted(unknown)}; known: {', '.join(COMPONENTS)}")
    return {name: list(components[name]) for name in COMPONENTS if name in components}


def supported_formats(components: Sequence[str]) -> tuple[str, ...]:
    """Scratchpad formats for a task whose steps fill ``components`` (none at all -> only ``none``)."""
    if not components:
        return ("none",)
    return ("none", "full", "minimal", *(f"full_minus_{name}" for name in components))


def enabled_components(scratchpad: str) -> tuple[str, ...]:
    """The components a format keeps, in rendering order; ``()`` for ``none``."""
    if scratchpad == "none":
        return ()
    if scratchpad == "full":
        return COMPONENTS
    if scratchpad == "minimal":
        return MINIMAL
    dropped = scratchpad.removeprefix("full_minus_")
    if scratchpad.startswith("full_minus_") and dropped in COMPONENTS:
        return tuple(name for name in COMPONENTS if name != dropped)
    raise ValueError(f"unknown scratchpad format {scratchpad!r}; known: {', '.join(supported_formats(COMPONENTS))}")


def render_scratchpad(steps: Sequence[Step], answer: Sequence[str], scratchpad: str) -> list[str]:
    """The target tokens for ``steps`` and ``answer`` in format ``scratchpad``.

    A component is written when the format keeps it and the step has it, so one set of gold steps
    serves every format.
    """
    keep = enabled_components(scratchpad)
    if not keep:
        return list(answer)
    out: list[str] = []
    for i, gold in enumerate(steps):
        if i:
            out.append(STEP_MARKER)
        for name in keep:
            if name in gold:
                out += [MARKERS[name], *gold[name]]
    return [*out, ANSWER_MARKER, *answer]


def parse_scratchpad(tokens: Sequence[str], scratchpad: str) -> tuple[list[Step], list[str]]:
    """Split a target (optionally ending in ``<eos>``) into its steps and final answer.

    The inverse of :func:`render_scratchpad`. Raises ``ValueError`` when the tokens do not follow
    the format: no ``<ans>``, a step that does not start with a marker, a component the format drops,
    or components out of order.
    """
    keep = enabled_components(scratchpad)
    tokens = _until_eos(list(tokens))
    if not keep:
        return [], tokens
    if ANSWER_MARKER not in tokens:
        raise ValueError(f"no {ANSWER_MARKER} marker in a {scratchpad!r} scratchpad")
    cut = len(tokens) - 1 - tokens[::-1].index(ANSWER_MARKER)
    body, answer = tokens[:cut], tokens[cut + 1:]
    return [_parse_step(chunk, keep) for chunk in _split(body, STEP_MARKER)], answer


#: What ``first_error`` names as where an output first departs from its target: the component being written there
#: (of ``COMPONENTS``), ``fewer steps`` (the answer starts where the target holds another step), ``more steps`` (a
#: step starts where the target's answer does) or ``answer`` (every step right, the answer wrong or missing).
ERROR_KINDS = (*COMPONENTS, "fewer steps", "more steps", "answer")


def first_error(target: Sequence[str], predicted: Sequence[str], scratchpad: str) -> tuple[str, int]:
    """Where a wrong scratchpad output first departs from its target: ``(what, step)``, ``what`` one of
    ``ERROR_KINDS`` and ``step`` the target's step (1-based) at that token.

    ``target`` is the gold scratchpad and answer (as :func:`render_scratchpad` writes them), ``predicted`` the
    generated tokens (read up to ``<eos>``; one that ends early departs where it ends). The first token where the two
    differ is placed in the target: its step counts the ``<step>`` markers before it, and its component is the one
    being written there, the last whose marker precedes it (a marker that opens a step names the component it
    opens). So a component written too long or too short, or a wrong marker after it, is that component's error.
    The answer starting where the target has another step is ``fewer steps`` (at the first step left out), a step
    starting where the target's answer does ``more steps`` (at the extra step), anything from the target's
    ``<ans>`` on ``answer`` (at the last step). A right output has no first error: call it on wrong ones.
    """
    if not enabled_components(scratchpad):
        raise ValueError("first_error reads scratchpads: format 'none' has no steps")
    target, predicted = _until_eos(list(target)), _until_eos(list(predicted))
    answer_at = len(target) - 1 - target[::-1].index(ANSWER_MARKER)
    at = next((i for i, (a, b) in enumerate(zip(target, predicted, strict=False)) if a != b),
              min(len(target), len(predicted)))
    made = predicted[at] if at < len(predicted) else None
    step_number = target[:at].count(STEP_MARKER) + 1
    if at == answer_at and made == STEP_MARKER:
        return "more steps", step_number + 1
    if at >= answer_at:
        return "answer", step_number
    if target[at] == STEP_MARKER and made == ANSWER_MARKER:
        return "fewer steps", step_number + 1
    if target[at] in _COMPONENT_OF_MARKER and (at == 0 or target[at - 1] == STEP_MARKER):
        return _COMPONENT_OF_MARKER[target[at]], step_number
    return _COMPONENT_OF_MARKER[next(t for t in reversed(target[:at]) if t in _COMPONENT_OF_MARKER)], step_number


def parse_answer(tokens: Sequence[str]) -> list[str]:
    """The final answer in a predicted sequence, with or without a scratchpad.

    Accepts a whole decoded sequence or only the generated part: everything up to the first
    ``<sep>`` (the prompt, which never holds one) and from the first ``<eos>`` (padding, overrun) is
    dropped, and when a scratchpad is present only the tokens after its last ``<ans>`` count. In a
    whole sequence a ``<sep>`` the model generates stays in the answer (cutting at the last one would
    score ``<bos> ... <sep> x <sep> 4 0 5`` as ``4 0 5``); in the generated part alone it cannot be told
    from the prompt's, so score whole sequences.
    """
    tokens = list(tokens)
    if SEP in tokens:
        tokens = tokens[tokens.index(SEP) + 1:]
    tokens = _until_eos(tokens)
    if ANSWER_MARKER in tokens:
        tokens = tokens[len(tokens) - tokens[::-1].index(ANSWER_MARKER):]
    return tokens


def _until_eos(tokens: list[str]) -> list[str]:
    return tokens[: tokens.index(EOS)] if EOS in tokens else tokens


def _split(tokens: list[str], separator: str) -> list[list[str]]:
    chunks: list[list[str]] = [[]]
    for token in tokens:
        if token == separator:
            chunks.append([])
        else:
            chunks[-1].append(token)
    return chunks


def _parse_step(chunk: list[str], keep: tuple[str, ...]) -> Step:
    if not chunk or chunk[0] not in _COMPONENT_OF_MARKER:
        raise ValueError(f"a scratchpad step must start with a component marker, got {chunk[:3]}")
    parsed: Step = {}
    current = ""  # set by the first token, which is a marker (checked above)
    for token in chunk:
        name = _COMPONENT_OF_MARKER.get(token)
        if name is None:
            parsed[current].append(token)
        elif name not in keep:
            raise ValueError(f"component {name!r} is not part of this scratchpad format")
        elif current and COMPONENTS.index(name) <= COMPONENTS.index(current):
            raise ValueError(f"component {name!r} is repeated or out of order")
        else:
            current = name
            parsed[current] = []
    return parsed
