"""Compare a baseline run with a speculative run: per level a verdict, then one answer.

Per level: both configurations' throughput (geometric mean over blocks, with its interval),
latency (TTFT and TPOT, p50 and p99), the ratio speculative / baseline with its interval and
verdict (``stats``: paired when the blocks alternated), then the recommendation (``recommend``)
and the setting in the form the measured engine loads (``specsweep.engines``). Data only:
``specsweep.reports`` writes it for people.

The levels are concurrency levels (requests in flight, closed loop), or, where both runs measured
request rates only (open loop: Poisson arrivals or a trace replayed at its recorded gaps, scaled),
request-rate levels. At a rate both configurations are sent the same requests at the same moments
and deliver the same tokens while they keep up, so what is compared there is the speed a request
saw (``BlockRow.throughput``): a server that falls behind the arrivals queues them and reads slower.
The answer is then "off from R requests/s", carried to the engine's per-batch setting by the
running batch the engine reported at the last rate where speculation is on.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence

from pydantic import BaseModel, Field

from specsweep import engines
from specsweep.analysis.decision import DecisionConfig, blocks_needed, level_verdict
from specsweep.analysis.recommend import LevelVerdict, Recommendation, level_words, recommend
from specsweep.analysis.search import max_levels, rests_on
from specsweep.analysis.slo import SLOView, requests_by_level, slo_view
from specsweep.analysis.stats import Verdict, t_quantile
from specsweep.analysis.traffic import COLUMNS as TRAFFIC_COLUMNS
from specsweep.analysis.traffic import TrafficView, traffic_view
from specsweep.analysis.verify import ARMS, CONTROLLER, Verification, verify_levels
from specsweep.bench.config import SweepConfig
from specsweep.engines import PerBatchSetting, SpeculationSettings
from specsweep.errors import ConfigError, MeasurementError
from specsweep.records import FINGERPRINT_COLUMNS, BlockRow, Mode, RunRow
from specsweep.results import ResultsStore

FINGERPRINT_KEYS = FINGERPRINT_COLUMNS
SLO_COLUMNS = ("mode", "level_value", "repeat", "warmup", "ttft_ms", "tpot_ms", "output_tokens", "error_type")


class LevelComparison(BaseModel):
    concurrency: int | float = Field(description="The level: requests in flight, or requests a second in a "
                                     "request-rate comparison (Comparison.mode).")
    blocks: tuple[int, int] = Field(description="Blocks that count (baseline, speculative).")
    set_aside: tuple[int, int] = Field((0, 0), description="Blocks set aside as disturbed and measured again.")
    requests: tuple[int, int] = Field(description="Measured requests (baseline, speculative).")
    baseline_tokens_per_s: float = Field(description="Geometric mean over the blocks.")
    speculative_tokens_per_s: float
    baseline_interval: tuple[float, float] | None = Field(None, description="95 % interval of the baseline's mean.")
    speculative_interval: tuple[float, float] | None = None
    ratio: float = Field(description="speculative / baseline output throughput")
    ratio_low: float | None = Field(None, description="Interval of the ratio (None: fewer than two blocks).")
    ratio_high: float | None = None
    confidence: float = Field(description="Confidence of the level's interval: simultaneous over the levels and looks, "
                              "so that the answer as a whole holds at 1 - alpha.")
    round_seconds: float | None = Field(None, description="Measured seconds of one round (a block of each "
                                        "configuration), mean: what another round at this level costs.")
    rounds_to_settle: float | None = Field(None, description="Rounds in all that would settle this level (one fixed "
                                           "policy within the margin, worst case), from its spread so far.")
    paired: bool
    verdict: Verdict
    baseline_ttft_ms: float | None = None
    speculative_ttft_ms: float | None = None
    baseline_ttft_p99_ms: float | None = None
    speculative_ttft_p99_ms: float | None = None
    baseline_tpot_ms: float | None = None
    speculative_tpot_ms: float | None = None
    baseline_tpot_p99_ms: float | None = None
    speculative_tpot_p99_ms: float | None = None
    speculative_accept_length: float | None = None
    speculative_acceptance_rate: float | None = None
    baseline_batch: float | None = Field(None, description="The running batch the engine reported (its /metrics "
                                         "gauge, sampled while the level ran): mean, median over the blocks.")
    speculative_batch: float | None = None
    speculative_batch_max: float | None = Field(None, description="The largest running batch the speculative engine "
                                                "reported at the level (median over the blocks).")

    def as_verdict(self) -> LevelVerdict:
        return LevelVerdict(concurrency=self.concurrency, verdict=self.verdict, ratio=self.ratio,
                            baseline_tokens_per_s=self.baseline_tokens_per_s,
                            speculative_tokens_per_s=self.speculative_tokens_per_s, low=self.ratio_low,
                            high=self.ratio_high, rounds=min(self.blocks), round_seconds=self.round_seconds,
                            rounds_to_settle=self.rounds_to_settle,
                            batch_mean=self.speculative_batch, batch_max=self.speculative_batch_max)


class Comparison(BaseModel):
    baseline: str
    speculative: str
    levels: list[LevelComparison]
    mode: Mode = Field("concurrency", description="What the levels are: concurrency (requests in flight; the "
                       "throughputs are output tok/s) or rate (requests a second; the throughputs are the speed a "
                       "request saw, output tok/s per request).")
    recommendation: Recommendation
    margin: float
    alpha: float = Field(0.05, description="The error rate of the answer as a whole (its intervals hold together at "
                         "1 - alpha).")
    design: str | None = None
    speculation: SpeculationSettings | None = Field(None, description="What the speculative configuration drafts.")
    setting: PerBatchSetting | None = Field(None, description="The setting in the form the measured engine loads "
                                            "(its file and flags, or a note where it has none), decided or the best "
                                            "available: its status and bound say which.")
    slo: SLOView | None = Field(None, description="Capacity and goodput within the decision's latency targets.")
    verification: Verification | None = Field(None, description="The verify stage: the recommended setting run by the "
                                              "engine against always off and always on (and the engine's own "
                                              "controller, where that arm ran).")
    traffic: TrafficView | None = Field(None, description="Per category of prompt and level, output lengths, and "
                                        "whether speculation kept the greedy outputs.")
    notes: list[str] = Field(default_factory=list)
    steering: list[int] = Field(default_factory=list, description="A search's levels measured only to steer it: the "
                                "answer rests on the levels around its crossing (analysis.search.rests_on).")
    unanswered: list[int | float] = Field(default_factory=list, description="Levels where every block a configuration measured "
                                  "was set aside as disturbed: no verdict, an open answer there.")
    baseline_run_id: str | None = None
    speculative_run_id: str | None = None
    host: str | None = None

    @property
    def summary(self) -> str:
        return self.recommendation.reason


def check_fingerprints(base_run: RunRow, spec_run: RunRow, allow_mismatch: bool) -> list[str]:
    """Differences between the two runs' environments; raises unless allow_mismatch."""
    diffs = []
    for key in FINGERPRINT_KEYS:
        a, b = getattr(base_run, key), getattr(spec_run, key)
        if a is None or b is None:
            continue
        if str(a) != str(b):
            diffs.append(f"{key}: {a!r} vs {b!r}")
    if diffs and not allow_mismatch:
        raise ConfigError(
            "the two runs were measured in different environments (" + "; ".join(diffs) + "). Comparing them would "
            "mix hardware or software differences into the result; rerun on the same host, or pass "
            "allow_mismatch (--allow-mismatch) if you know the difference does not matter."
        )
    return diffs


def comparison_mode(base_rows: Sequence[BlockRow], spec_rows: Sequence[BlockRow]) -> Mode:
    """Concurrency, unless both runs measured request-rate levels and neither a concurrency level."""
    modes = [{r.mode for r in rows} for rows in (base_rows, spec_rows)]
    return "rate" if all(m == {"rate"} for m in modes) else "concurrency"


def _by_level(rows: Sequence[BlockRow], mode: Mode) -> dict[int | float, list[BlockRow]]:
    """The blocks that count (not set aside as disturbed), by level."""
    out: dict[int | float, list[BlockRow]] = {}
    for r in sorted(rows, key=lambda r: (r.level_index, r.repeat)):
        if r.mode == mode and r.load is not None and r.disturbed is None:
            out.setdefault(r.load, []).append(r)
    return out


def _median(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def _mean_interval(rows: Sequence[BlockRow]) -> tuple[float, tuple[float, float] | None]:
    logs = [math.log(max(r.throughput, 1e-9)) for r in rows]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), None
    half = t_quantile(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), (math.exp(mean - half), math.exp(mean + half))


def compare_levels(base_rows: Sequence[BlockRow], spec_rows: Sequence[BlockRow], *, decision: DecisionConfig,
                   paired: bool, num_requests: int, baseline_name: str = "baseline",
                   speculative_name: str = "speculative", answer_levels: int = 0, search: bool = False) -> Comparison:
    """The two configurations' blocks, level by level, and the answer. ``answer_levels``: the levels the answer's
    error is controlled over, when more than those measured (a search's most, ``analysis.search.max_levels``);
    ``search``: the levels were chosen by a search, whose answer rests on the levels around its crossing
    (``analysis.search.rests_on``)."""
    mode = comparison_mode(base_rows, spec_rows)
    if mode == "rate" and any(r.request_speed_tokens_per_s is None for r in (*base_rows, *spec_rows)
                              if r.disturbed is None):
        raise ConfigError("these request-rate runs were measured before specsweep stored the speed a request saw "
                          "(levels column request_speed_tokens_per_s), which a comparison at request rates counts: "
                          "measure them again")
    base, spec = _by_level(base_rows, mode), _by_level(spec_rows, mode)
    aside = {c: (sum(1 for r in base_rows if r.mode == mode and r.load == c and r.disturbed is not None),
                 sum(1 for r in spec_rows if r.mode == mode and r.load == c and r.disturbed is not None)) for c in base}
    common = sorted(set(base) & set(spec))
    measured = {c: (_measured(base_rows, c, mode), _measured(spec_rows, c, mode))
                for c in _levels_of(base_rows, mode) | _levels_of(spec_rows, mode)}
    # Measured by a configuration whose every block there was set aside as disturbed (the other may not have measured
    # it at all: a grid's points measure the levels its baseline answered). A level one configuration simply did not
    # reach (a sweep stopped at saturation) is not such a level.
    unanswered = sorted(c for c, ((nb, okb), (ns, oks)) in measured.items()
                        if c not in common and ((nb and not okb) or (ns and not oks)))
    if not common and not unanswered:
        raise ConfigError(
            f"the runs share no {'request-rate' if mode == 'rate' else 'concurrency'} level (baseline "
            f"{sorted(base)}, speculative {sorted(spec)}): measure both with the same "
            f"{'request_rate' if mode == 'rate' else 'concurrency'} list (a run of rates is compared with a run of "
            "rates, one of concurrency levels with one of concurrency levels)"
        )
    if not common:
        raise MeasurementError(f"no level could be answered: every block of a configuration at "
                               f"{', '.join(map(level_words, unanswered))} was set aside as disturbed (why: "
                               f"{_reasons((*base_rows, *spec_rows))}). The blocks are kept in the levels "
                               "dataset (column disturbed). Measure again: a machine too busy to measure them on, or a "
                               "server that fails every request, does so every time.")
    levels = []
    # The levels the answer rests on (or may, for a search): its intervals hold together over them.
    answering = max(len(common) + len(unanswered), answer_levels)
    for c in common:
        b, s = base[c], spec[c]
        interval, v = level_verdict(b, s, decision, paired=paired, num_requests=num_requests, levels=answering)
        b_mean, b_int = _mean_interval(b)
        s_mean, s_int = _mean_interval(s)
        levels.append(LevelComparison(
            concurrency=c, blocks=(len(b), len(s)), set_aside=aside.get(c, (0, 0)),
            requests=(sum(r.requests for r in b), sum(r.requests for r in s)),
            baseline_tokens_per_s=b_mean, speculative_tokens_per_s=s_mean, baseline_interval=b_int,
            speculative_interval=s_int, ratio=interval.ratio, ratio_low=interval.low, ratio_high=interval.high,
            confidence=interval.confidence, paired=paired, verdict=v,
            round_seconds=statistics.fmean(r.duration_s for r in b) + statistics.fmean(r.duration_s for r in s),
            rounds_to_settle=blocks_needed(interval, decision.margin),
            baseline_ttft_ms=_median([r.ttft_ms_median for r in b]), speculative_ttft_ms=_median([r.ttft_ms_median for r in s]),
            baseline_ttft_p99_ms=_median([r.ttft_ms_p99 for r in b]),
            speculative_ttft_p99_ms=_median([r.ttft_ms_p99 for r in s]),
            baseline_tpot_ms=_median([r.tpot_ms_median for r in b]), speculative_tpot_ms=_median([r.tpot_ms_median for r in s]),
            baseline_tpot_p99_ms=_median([r.tpot_ms_p99 for r in b]),
            speculative_tpot_p99_ms=_median([r.tpot_ms_p99 for r in s]),
            speculative_accept_length=_median([r.spec_accept_length for r in s]),
            speculative_acceptance_rate=_median([r.spec_acceptance_rate for r in s]),
            baseline_batch=_median([r.engine_running_mean for r in b]),
            speculative_batch=_median([r.engine_running_mean for r in s]),
            speculative_batch_max=_median([r.engine_running_max for r in s]),
        ))
    verdicts = [lv.as_verdict().model_copy(update={"max_rounds": decision.max_blocks(num_requests)}) for lv in levels]
    steering: list[int] = []
    if search:
        resting = rests_on({int(lv.concurrency): lv.ratio for lv in levels if not math.isnan(lv.ratio)})
        steering = sorted(int(lv.concurrency) for lv in levels if lv.concurrency not in resting)
        verdicts = [v for v in verdicts if v.concurrency not in steering]
    rec = recommend(verdicts, decision.margin, unanswered)
    comp = Comparison(baseline=baseline_name, speculative=speculative_name, levels=levels, recommendation=rec,
                      margin=decision.margin, alpha=decision.alpha, unanswered=unanswered, steering=steering,
                      mode=mode)
    if steering:
        comp.notes.append(f"Found by search: {', '.join(map(str, steering))} steered it (measured until it was clear "
                          "whether speculation is ahead there); the answer and its bound rest on the levels around "
                          "the crossing, assuming, as bisection does, that speculation's gain falls as load grows (the "
                          "levels' estimates fall in that order).")
    for c in unanswered:
        sides = [f"{name}'s {n} block(s)" for name, (n, ok) in ((baseline_name, measured[c][0]),
                                                                  (speculative_name, measured[c][1])) if n and not ok]
        why = _reasons([r for r in (*base_rows, *spec_rows) if r.mode == mode and r.load == c])
        comp.notes.append(f"No answer at {level_words(c)}: all of {' and '.join(sides)} there were set aside as disturbed, as "
                          f"often as a level is measured again (why: {why}). The answer is open there, as at an "
                          "undetermined level: measure it again (a machine "
                          "too busy to measure it stalls every block; a server that fails every request there "
                          "does so again).")
    return comp


def _reasons(rows: Sequence[BlockRow]) -> str:
    """Why these blocks were set aside: the first three distinct reasons."""
    why = sorted({r.disturbed for r in rows if r.disturbed})
    return "; ".join(why[:3]) + (" ..." if len(why) > 3 else "")


def _levels_of(rows: Sequence[BlockRow], mode: Mode) -> set[int | float]:
    return {r.load for r in rows if r.mode == mode and r.load is not None}


def _measured(rows: Sequence[BlockRow], c: int | float, mode: Mode) -> tuple[int, bool]:
    """How many blocks were measured at level c, and whether one of them counts."""
    at = [r for r in rows if r.mode == mode and r.load == c]
    return len(at), any(r.disturbed is None for r in at)


def off_starts(k: int, off_from_batch: int | None) -> list[tuple[int, int]]:
    """(first batch size, K) for "K below the batch size off_from_batch, 0 from it on"."""
    if off_from_batch is None:
        return [(1, k)]
    if off_from_batch <= 1:
        return [(1, 0)]
    return [(1, k), (off_from_batch, 0)]


def never_reached(base_rows: Sequence[BlockRow], spec_rows: Sequence[BlockRow]) -> list[str]:
    """The concurrency levels where a counted block of either configuration never had C requests in flight."""
    short = sorted({r.concurrency for r in (*base_rows, *spec_rows)
                    if r.reached_concurrency is False and r.disturbed is None and r.concurrency is not None})
    return [f"C={c}" for c in short]


def with_engine_setting(comp: Comparison, speculation: SpeculationSettings | None) -> Comparison:
    """The setting in the form the measured engine loads, decided or the best available (its status and bound
    carried with it)."""
    comp.speculation = speculation
    if speculation is None:
        return comp
    k = speculation.num_speculative_tokens
    if comp.recommendation.speculation_off_from is not None and comp.recommendation.off_from_batch is None:
        return comp  # off from a request rate whose batch the engine did not report: no per-batch setting to give
    setting = engines.per_batch_setting(speculation, off_starts(k, comp.recommendation.off_from_batch), k)
    comp.setting = carrying(setting, comp.recommendation)
    return comp


def carrying(setting: PerBatchSetting | None, rec: Recommendation) -> PerBatchSetting | None:
    """The engine's setting, stamped with the status and bound of the answer it carries."""
    if setting is None:
        return None
    return setting.model_copy(update={"status": rec.status, "worst_case_loss": rec.worst_case_loss})


def refuted_if_short(comp: Comparison) -> Comparison:
    """A setting the verify stage found short of a fixed policy beyond the margin at some level is refuted: its
    status, its sentence and the engine's file say so (the file is kept, so that what ran can be read)."""
    v = comp.verification
    if v is None or v.status != "failed":
        return comp
    short = [lv for lv in v.levels if lv.result == "falls short"]
    where = ", ".join(f"{level_words(lv.concurrency)} (x{lv.ratio:.2f} of always {lv.better_fixed})" for lv in short)
    rec = comp.recommendation.model_copy(update={
        "status": "refuted",
        "decision": f"Refuted: run by the engine, the setting fell short of a fixed policy at {where}. "
                    f"{comp.recommendation.decision}"})
    setting = comp.setting.model_copy(update={"status": "refuted"}) if comp.setting is not None else None
    return comp.model_copy(update={"recommendation": rec, "setting": setting})


def compare_runs(store: ResultsStore, baseline_run_id: str, speculative_run_id: str, *,
                 decision: DecisionConfig | None = None) -> Comparison:
    """Compare two runs from the store (the CLI's ``compare`` and the flows' comparison task). Without
    ``decision``, the speculative run's own decision settings (or the defaults) apply."""
    base_run, spec_run = store.run(baseline_run_id), store.run(speculative_run_id)
    if decision is None:
        decision = DecisionConfig.model_validate_json(spec_run.decision_json) if spec_run.decision_json else DecisionConfig()
    diffs = check_fingerprints(base_run, spec_run, decision.allow_mismatch)
    paired = (base_run.design or "").startswith("alternate") and base_run.design == spec_run.design
    sweep = SweepConfig.model_validate_json(spec_run.sweep_json) if spec_run.sweep_json not in (None, "", "{}") \
        else SweepConfig()
    num_requests = sweep.num_requests
    # A search's answer holds over the most levels it could have measured, not only those it did.
    answer_levels = max_levels(sweep.search.min, sweep.search.max) if sweep.search is not None else 0
    base_rows, spec_rows = store.level_rows(baseline_run_id), store.level_rows(speculative_run_id)
    comp = compare_levels(base_rows, spec_rows, decision=decision, paired=paired, num_requests=num_requests,
                          baseline_name=base_run.config_name, speculative_name=spec_run.config_name,
                          answer_levels=answer_levels, search=sweep.search is not None)
    comp.baseline_run_id, comp.speculative_run_id, comp.host = baseline_run_id, speculative_run_id, base_run.host
    comp.design = base_run.design if base_run.design == spec_run.design else None
    if not paired:
        comp.notes.append("The blocks were not taken alternately (sequential design): drift of the machine between the "
                          "two configurations is not cancelled out; the alternate design is more robust.")
    if diffs:
        comp.notes.append("Compared despite different environments: " + "; ".join(diffs))
    reasons = sorted({r.disturbed for r in (*base_rows, *spec_rows) if r.disturbed is not None})
    if reasons:
        aside = Counter(r.load for r in (*base_rows, *spec_rows) if r.mode == comp.mode and r.disturbed)
        counted = ", ".join(f"{level_words(c)} ({n})" for c, n in sorted(aside.items()) if c is not None)
        comp.notes.append(f"Blocks set aside as disturbed and measured again, by level: {counted}. Why: "
                          + "; ".join(reasons[:6]) + (" ..." if len(reasons) > 6 else "") + ". They are kept in the "
                          "levels dataset (column disturbed) and do not count.")
    if short := never_reached(base_rows, spec_rows):
        comp.notes.append("Never reached its concurrency (no moment with C requests in flight) at " + ", ".join(short)
                          + ": the figures there are not those of the level they are labelled with; give the level's "
                          "blocks at least C x 2 requests (benchmark.sweep.requests_per_slot).")
    if differ := prompts_differ(base_rows, spec_rows):
        comp.notes.append("The two configurations were not sent the same prompts at " + ", ".join(differ) +
                          " (their prompt digests differ: another workload, seed or tokenizer): the comparison there is "
                          "not paired by prompt.")
    speculation = engines.speculation_of(spec_run.command, spec_run.engine)
    comp.traffic = traffic_view(store.request_fields(baseline_run_id, TRAFFIC_COLUMNS),
                                store.request_fields(speculative_run_id, TRAFFIC_COLUMNS), base_rows, spec_rows,
                                margin=decision.margin, names=(base_run.config_name, spec_run.config_name),
                                batch={lv.concurrency: (lv.speculative_batch, lv.speculative_batch_max)
                                       for lv in comp.levels},
                                confidence=lambda categories: decision.interval_confidence(
                                    num_requests, max(len(comp.levels) + len(comp.unanswered), answer_levels),
                                    categories, paired=paired),
                                unanswered=comp.unanswered,
                                lossy_verifier=speculation.lossy_verifier if speculation is not None else None)
    comp.notes += comp.traffic.notes
    if comp.mode == "rate":
        comp.notes.append("At request rates the report gives the answer for the requests as sent; the answers per "
                          "category of prompt, the check of the outputs at temperature 0, the energy per token and "
                          "the latency targets (decision.slo) are read at concurrency levels only: measure concurrency "
                          "levels for them.")
    comp = with_engine_setting(comp, speculation)
    comp.verification = verification_of(store, comp, decision, num_requests)
    comp = refuted_if_short(comp)
    if decision.slo is not None and comp.mode == "concurrency":
        comp.slo = slo_view(decision.slo, *(requests_by_level(store.request_fields(rid, SLO_COLUMNS), rows)
                                            for rid, rows in ((baseline_run_id, base_rows),
                                                              (speculative_run_id, spec_rows))))
    return comp


def verification_of(store: ResultsStore, comp: Comparison, decision: DecisionConfig,
                    num_requests: int) -> Verification | None:
    """The verify stage's runs of this comparison in the store (ids ending like the comparison's: the same
    flow run), judged; None when it was not run."""
    key = f"{comp.baseline_run_id}--{comp.speculative_run_id}"
    suffix = (comp.speculative_run_id or "").rsplit("-", 1)[-1]
    ids: dict[str, str] = {}
    commands: dict[str, str] = {}
    for rid in store.run_ids():
        if rid.endswith(f"-verify-{suffix}") and (row := store.run(rid)).verifies == key and row.verify_arm:
            ids[row.verify_arm], commands[row.verify_arm] = rid, row.command or ""
    if not set(ARMS) <= set(ids):
        return None
    rows = {arm: store.level_rows(ids[arm]) for arm in ids}
    v = verify_levels(rows["off"], rows["on"], rows["schedule"], rows.get(CONTROLLER),
                      off_from=comp.recommendation.speculation_off_from, setting=commands["schedule"],
                      decision=decision, num_requests=num_requests, controller_setting=commands.get(CONTROLLER),
                      setting_cost=_setting_cost(comp))
    v.runs = ids
    return v


def _setting_cost(comp: Comparison) -> str | None:
    """The engine's known cost of its per-batch setting (Engine.per_batch_cost), where the verify stage ran
    that setting on the engine itself (not behind the router)."""
    setting = comp.setting
    if setting is None or not setting.flags or setting.engine not in engines.ENGINES:
        return None
    return engines.ENGINES[setting.engine].per_batch_cost


def prompts_differ(base: list[BlockRow], spec: list[BlockRow]) -> list[str]:
    """The blocks (level and repeat) whose two configurations were sent different prompts."""
    digests = {(r.concurrency, r.request_rate_per_s, r.repeat): r.prompts_digest for r in base}
    return [f"{r.label} block {r.repeat}" for r in spec
            if r.prompts_digest and digests.get((r.concurrency, r.request_rate_per_s, r.repeat), r.prompts_digest)
            not in (None, r.prompts_digest)]
