"""The acceptance profile: how far into a draft the target model agrees, per draft position.

From the engine's own per-request histograms (index j: verify steps that accepted exactly j drafts) of one
configuration, per category of prompt and over all of them, in the shape of NVIDIA's
``speculation_profile.json`` (Model-Optimizer's specdec_bench): for each draft position i = 1..K

    marginal[i]     = P(accepted >= i)                        the share of steps whose i-th draft was accepted
    conditional[i]  = P(accepted >= i | accepted >= i - 1)    = marginal[i] / marginal[i - 1]

and acceptance length = 1 + the sum of the marginals, checked against the engine's own accept length.

For a chain drafter (EAGLE, EAGLE-3 or a draft model with one candidate per step), drafting fewer tokens
removes only the later positions: the first K' marginals stay what they were, so the acceptance length at
K' < K is predicted as 1 + the sum of the first K' marginals. A prediction, labelled so, never a
measurement; a tree or block drafter has no such shortcut and gets none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: Methods whose drafts form one chain (with a single candidate per step).
CHAIN_METHODS = frozenset({"eagle", "eagle3", "draft_model"})
#: How close the profile's acceptance length must come to the engine's own to pass the check.
CHECK_TOLERANCE = 1e-6
ALL = "(all)"


def profile_of(histograms: Iterable[Sequence[int]]) -> dict[str, Any] | None:
    """Marginal and conditional acceptance per position from histograms summed over requests (None: no step)."""
    total: list[int] = []
    for h in histograms:
        if len(h) > len(total):
            total += [0] * (len(h) - len(total))
        for j, n in enumerate(h):
            total[j] += n
    steps = sum(total)
    if steps == 0 or len(total) < 2:
        return None
    k = len(total) - 1
    marginal = [sum(total[i:]) / steps for i in range(1, k + 1)]
    conditional, before = [], 1.0
    for m in marginal:
        conditional.append(m / before if before > 0 else 0.0)
        before = m
    return {"steps": steps, "histogram": total, "marginal": [round(m, 6) for m in marginal],
            "conditional": [round(c, 6) for c in conditional], "acceptance_length": round(1 + sum(marginal), 6)}


def is_chain(method: str | None, eagle_topk: int | None) -> bool:
    return method in CHAIN_METHODS and eagle_topk in (None, 1)


def speculation_profile(requests: Sequence[Mapping[str, Any]], *, configuration: str, method: str | None = None,
                        eagle_topk: int | None = None) -> dict[str, Any] | None:
    """The profile of one configuration from its measured request rows (``category``, ``spec_accept_histogram``,
    ``spec_accept_length``, ``spec_verify_ct``); None where no request carried a histogram."""
    rows = [r for r in requests if not r.get("warmup") and _histogram(r) is not None]
    if not rows:
        return None
    groups: dict[str, list[Mapping[str, Any]]] = {ALL: rows}
    for r in rows:
        groups.setdefault(str(r.get("category") or "(none)"), []).append(r)
    categories: dict[str, Any] = {}
    for name in [ALL, *sorted(g for g in groups if g != ALL)]:
        found = profile_of(h for r in groups[name] if (h := _histogram(r)) is not None)
        if found is None:
            continue
        found["requests"] = len(groups[name])
        engine_length = _engine_length(groups[name])
        found["engine_acceptance_length"] = engine_length
        found["check"] = ("1 + sum(marginal) matches the engine's own accept length" if engine_length is not None
                          and abs(engine_length - found["acceptance_length"]) <= CHECK_TOLERANCE * engine_length
                          else "MISMATCH: 1 + sum(marginal) differs from the engine's own accept length"
                          if engine_length is not None else "no engine figure to check against")
        categories[name] = found
    if not categories:
        return None
    k = len(categories[ALL]["marginal"])
    out: dict[str, Any] = {
        "configuration": configuration, "method": method, "num_speculative_tokens": k,
        "source": "the engine's per-request acceptance histograms", "categories": categories}
    if is_chain(method, eagle_topk) and k > 1:
        out["predicted_at_smaller_k"] = {
            "label": "PREDICTION, not measured: a chain drafter drafting K' < K tokens keeps the first K' marginals, "
                     "so its acceptance length is 1 + their sum",
            **{name: {str(kk): round(1 + sum(c["marginal"][:kk]), 6) for kk in range(1, k)}
               for name, c in categories.items()}}
    return out


def _histogram(row: Mapping[str, Any]) -> list[int] | None:
    h = row.get("spec_accept_histogram")
    if h is None:
        return None
    values = [int(x) for x in h]
    return values if values else None


def _engine_length(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The engine's own accept length over these requests' steps together (each request's, weighted by its steps)."""
    pairs = [(float(r["spec_accept_length"]), int(r["spec_verify_ct"])) for r in rows
             if r.get("spec_accept_length") is not None and r.get("spec_verify_ct")]
    steps = sum(n for _, n in pairs)
    return round(sum(length * n for length, n in pairs) / steps, 6) if steps else None
