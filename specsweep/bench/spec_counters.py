"""Server-side speculation counters, read before and after each level.

SGLang reports ``internal_states[0].avg_spec_accept_length`` (an average since boot) in
``/server_info`` (older: ``/get_server_info``); vLLM exposes Prometheus counters in
``/metrics``. Both are cumulative, so a level's figure comes from the difference
(``specsweep.metrics.spec_from_counters``), never from one reading.
"""

from __future__ import annotations

import re

import httpx

_VLLM = {
    "vllm_accepted": re.compile(r"^vllm:spec_decode_num_accepted_tokens(?:_total)?(?:\{[^}]*\})?\s+([0-9.eE+-]+)$", re.M),
    "vllm_drafted": re.compile(r"^vllm:spec_decode_num_draft_tokens(?:_total)?(?:\{[^}]*\})?\s+([0-9.eE+-]+)$", re.M),
    "vllm_drafts": re.compile(r"^vllm:spec_decode_num_drafts(?:_total)?(?:\{[^}]*\})?\s+([0-9.eE+-]+)$", re.M),
}


async def read_spec_counters(client: httpx.AsyncClient, base_url: str, headers: dict[str, str]) -> dict[str, float]:
    """Whatever speculation counters the server offers; empty when none."""
    out: dict[str, float] = {}
    base = base_url.rstrip("/")
    for path in ("/server_info", "/get_server_info"):
        try:
            r = await client.get(base + path, headers=headers, timeout=10)
        except httpx.HTTPError:
            break
        if r.status_code == 200:
            try:
                states = r.json().get("internal_states") or []
            except ValueError:
                break
            if states and isinstance(states[0], dict) and states[0].get("avg_spec_accept_length") is not None:
                out["sglang_avg_accept_length"] = float(states[0]["avg_spec_accept_length"])
                for key in ("spec_verify_ct", "total_spec_verify_ct", "num_generated_tokens", "total_generated_tokens"):
                    if isinstance(states[0].get(key), (int, float)):
                        out[f"sglang_{key}"] = float(states[0][key])
            break
    try:
        r = await client.get(base + "/metrics", headers=headers, timeout=10)
        if r.status_code == 200 and "vllm:" in r.text:
            for key, rx in _VLLM.items():
                vals = rx.findall(r.text)
                if vals:
                    out[key] = sum(float(v) for v in vals)
    except httpx.HTTPError:
        pass
    return out
