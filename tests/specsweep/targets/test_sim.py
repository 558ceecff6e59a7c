"""The SGLang-compatible simulator, over HTTP, as a separate process."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.sim import running_sim

#: Timing bounds and busy servers: these run when no other test does (scripts/test.sh).
pytestmark = pytest.mark.solo


def stream_lines(url: str, path: str, body: dict) -> list[str]:  # type: ignore[type-arg]
    with httpx.stream("POST", url + path, json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        return [line for line in r.iter_lines() if line]


def test_health_is_refused_then_503_then_200_with_empty_body() -> None:
    with running_sim("--startup-s", "2.0", ready=False) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        seen: list[object] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                r = httpx.get(url + "/health", timeout=1)
                seen.append(r.status_code)
                if r.status_code == 200:
                    assert r.content == b""
                    break
            except httpx.ConnectError:
                seen.append("refused")
            time.sleep(0.05)
        states = [s for i, s in enumerate(seen) if i == 0 or seen[i - 1] != s]
        assert states == ["refused", 503, 200], states
        assert httpx.get(url + "/health_generate").status_code == 200
        with socket.create_connection(("127.0.0.1", port)):
            pass


def test_info_endpoints() -> None:
    with running_sim("--model-path", "/models/kimi", "--tp", "8", "--speculative-algorithm", "EAGLE3",
                     "--speculative-draft-model-path", "/models/eagle3", "--mem-fraction-static", "0.85") as (url, proc):
        for path in ("/get_model_info", "/model_info"):
            assert httpx.get(url + path).json()["model_path"] == "/models/kimi"
        for path in ("/get_server_info", "/server_info"):
            info = httpx.get(url + path).json()
            assert info["tp_size"] == 8 and info["speculative_algorithm"] == "EAGLE3"
            assert info["internal_states"][0]["avg_spec_accept_length"] == 0.0
            assert info["ignored_args"] == ["--mem-fraction-static", "0.85"]
        assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "/models/kimi"
        # The average accept length is cumulative since start, as SGLang's.
        httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 64, "ignore_eos": True}, timeout=30)
        first = httpx.get(url + "/server_info").json()["internal_states"][0]["avg_spec_accept_length"]
        assert 1.3 < first < 3.0


def test_openai_streaming_and_usage() -> None:
    with running_sim("--sim-profile", "tiny-fast", "--speculative-algorithm", "EAGLE3") as (url, _):
        lines = stream_lines(url, "/v1/completions", {"prompt": "hello", "max_tokens": 20, "stream": True,
                                                      "ignore_eos": True, "stream_options": {"include_usage": True}})
        assert lines[-1] == "data: [DONE]"
        events = [json.loads(line[6:]) for line in lines[:-1]]
        assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 20
        texts = [e["choices"][0]["text"] for e in events[:-1]]
        assert sum(len(t.split()) for t in texts) == 20 and any(len(t.split()) > 1 for t in texts)
        assert events[-2]["choices"][0]["finish_reason"] == "length"
        chat = stream_lines(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                          "max_tokens": 5, "stream": True, "ignore_eos": True})
        assert json.loads(chat[0][6:])["choices"][0]["delta"]["content"]
        plain = httpx.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 7, "ignore_eos": True}).json()
        assert plain["usage"]["completion_tokens"] == 7 and len(plain["choices"][0]["text"].split()) == 7
        chat_plain = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                                    "max_tokens": 3, "ignore_eos": True}).json()
        assert chat_plain["choices"][0]["message"]["role"] == "assistant"
        natural = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 10000}, timeout=60).json()
        assert natural["usage"]["completion_tokens"] <= 512  # without ignore_eos, generation ends on its own


def test_native_generate() -> None:
    with running_sim("--sim-profile", "tiny-fast", "--speculative-algorithm", "EAGLE3") as (url, _):
        r = httpx.post(url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 30, "ignore_eos": True}})
        meta = r.json()["meta_info"]
        assert meta["completion_tokens"] == 30 and 8 <= meta["spec_verify_ct"] < 30
        lines = stream_lines(url, "/generate", {"text": "hi", "stream": True,
                                                "sampling_params": {"max_new_tokens": 12, "ignore_eos": True}})
        last = json.loads(lines[-2][6:])
        assert last["meta_info"]["completion_tokens"] == 12 and last["meta_info"]["finish_reason"]["type"] == "length"


def test_token_times_are_the_servers_own_send_times() -> None:
    with running_sim("--sim-profile", "paced-5ms") as (url, _):
        lines = stream_lines(url, "/v1/completions", {"prompt": "x", "max_tokens": 20, "stream": True, "ignore_eos": True})
        rid = json.loads(lines[0][6:])["id"]
        times = httpx.get(url + "/sim/token_times", params={"id": rid}).json()["token_times_s"]
        assert len(times) == 20
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        assert 0.004 < sorted(gaps)[len(gaps) // 2] < 0.007  # paced 5 ms apart
        assert abs(times[-1] - time.perf_counter()) < 60  # the shared monotonic clock


def test_batching_slows_steps_as_the_batch_grows() -> None:
    import asyncio

    async def measure(url: str, conc: int) -> float:
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"prompt": "x", "max_tokens": 40, "ignore_eos": True}
            t = time.perf_counter()
            await asyncio.gather(*(client.post(url + "/v1/completions", json=body) for _ in range(conc)))
            return conc * 40 / (time.perf_counter() - t)

    with running_sim() as (url, _):  # the published profile
        single = asyncio.run(measure(url, 1))
        many = asyncio.run(measure(url, 32))
    assert 80 < single < 100  # ~92.6 tok/s
    assert 600 < many < 800  # ~750 tok/s at 32 running requests


# -- faults ---------------------------------------------------------------------------------


def test_fault_crash_during_startup() -> None:
    with running_sim("--fault-crash-on-start", "--startup-s", "0.3", ready=False) as (_, proc):
        assert proc.wait(10) == 1
        out = proc.stdout.read().decode()  # type: ignore[union-attr]
        assert "simulated crash" in out and "out of memory" in out


def test_fault_never_healthy() -> None:
    with running_sim("--fault-never-healthy", "--startup-s", "0.2", ready=False, listening=True) as (url, _):
        time.sleep(1.0)  # well past its 0.2 s "startup"
        assert httpx.get(url + "/health").status_code == 503


def test_fault_die_after_n_requests() -> None:
    with running_sim("--sim-profile", "tiny-fast", "--fault-die-after", "2") as (url, proc):
        body = {"prompt": "x", "max_tokens": 4, "ignore_eos": True}
        assert httpx.post(url + "/v1/completions", json=body).status_code == 200
        with pytest.raises(httpx.HTTPError):
            httpx.post(url + "/v1/completions", json=body)
            httpx.post(url + "/v1/completions", json=body)
        assert proc.wait(5) == 1


def test_fault_generation_hangs_while_health_is_200() -> None:
    with running_sim("--sim-profile", "tiny-fast", "--fault-hang-after", "1") as (url, _):
        body = {"prompt": "x", "max_tokens": 4, "ignore_eos": True}
        assert httpx.post(url + "/v1/completions", json=body, timeout=5).status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", json=body, timeout=1.0)
        assert httpx.get(url + "/health").status_code == 200


def test_fault_error_rate() -> None:
    with running_sim("--sim-profile", "tiny-fast", "--fault-error-rate", "0.5", "--seed", "1") as (url, _):
        codes = [httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2, "ignore_eos": True}).status_code
                 for _ in range(40)]
    assert set(codes) == {200, 500} and 8 < codes.count(500) < 32


def test_fault_cut_off_mid_stream() -> None:
    with running_sim("--sim-profile", "tiny-fast", "--fault-cut-rate", "1.0") as (url, _):
        with pytest.raises(httpx.RemoteProtocolError):
            stream_lines(url, "/v1/completions", {"prompt": "x", "max_tokens": 30, "stream": True, "ignore_eos": True})


def test_fault_malformed_sse() -> None:
    with running_sim("--sim-profile", "tiny-fast", "--fault-malformed-rate", "1.0") as (url, _):
        lines = stream_lines(url, "/v1/completions", {"prompt": "x", "max_tokens": 10, "stream": True, "ignore_eos": True})
    bad = []
    for line in lines:
        if line != "data: [DONE]":
            try:
                json.loads(line[6:])
            except json.JSONDecodeError:
                bad.append(line)
    assert len(bad) == 1 and lines[-1] == "data: [DONE]"


def test_speculative_flags_are_checked_like_sglang() -> None:
    with running_sim("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
                     "--speculative-num-draft-tokens", "8", ready=False) as (_, proc):
        assert proc.wait(10) == 2
        assert "num-draft-tokens must be" in proc.stdout.read().decode()  # type: ignore[union-attr]


def _spec_details(url: str, n: int, concurrency: int) -> list[dict]:  # type: ignore[type-arg]
    """``sglext.spec_tokens_details`` of ``concurrency`` streams sent at once (each n tokens)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(_: int) -> dict:  # type: ignore[type-arg]
        lines = stream_lines(url, "/v1/completions", {"prompt": "x", "max_tokens": n, "stream": True,
                                                     "ignore_eos": True, "return_spec_tokens_details": True})
        last = json.loads(lines[-2][6:])
        assert last["choices"][0]["finish_reason"] == "length"
        return last["sglext"]["spec_tokens_details"]  # type: ignore[no-any-return]

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, range(concurrency)))


def test_adaptive_config_speculates_per_batch_tier(tmp_path: Path) -> None:
    """A file as the grid recommends it: 3 steps for one stream, none from 4 running requests. One stream
    drafts 3 tokens per verify step; eight at once draft nothing once they all run (their acceptance
    length falls to 1 token per step)."""
    cfg = tmp_path / "adaptive.json"
    cfg.write_text(json.dumps({"1": {"candidate_steps": [3]}, "4": {"candidate_steps": [0]}}))
    with running_sim("--sim-profile", "tiny-fast", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
                     "--speculative-adaptive", "--speculative-adaptive-config", str(cfg), "--enable-metrics") as (url, _):
        (single,) = _spec_details(url, 200, 1)
        assert single["spec_num_proposed_drafts"] == 3 * single["spec_verify_ct"]
        assert single["spec_accept_length"] > 1.5
        crowd = _spec_details(url, 200, 8)
        # Steps taken while fewer than four ran (the streams arriving, the last ones finishing) still draft 3
        # tokens; the rest draft none: far under the 3 drafts per step of one stream.
        drafts = sum(d["spec_num_proposed_drafts"] for d in crowd) / sum(d["spec_verify_ct"] for d in crowd)
        assert drafts < 0.5, crowd
        assert sum(d["spec_accept_length"] for d in crowd) / 8 < 1.3, crowd
        text = httpx.get(url + "/metrics").text
        assert 'sglang:num_running_reqs{model_name="moonshotai/Kimi-K2.5"} 0.0' in text
        assert "# TYPE sglang:generation_tokens_total counter" in text
        generated = [ln for ln in text.splitlines() if ln.startswith("sglang:generation_tokens_total")]
        assert generated and float(generated[0].split()[-1]) == 200 * 9


def test_fixed_steps_cost_and_pay_in_proportion() -> None:
    """More draft steps: more tokens per verify step for one stream, at a higher price per step."""
    from specsweep.targets.sim.model import PROFILES, expected_throughput

    tiny = PROFILES["tiny-fast"]
    one = [expected_throughput(tiny, 1, True, s) for s in (0, 1, 3, 5)]
    assert one[0] == expected_throughput(tiny, 1, False)
    assert one[1] < one[2] and one[0] < one[1]  # drafting pays for one stream, more so up to 3 steps
    busy = [expected_throughput(tiny, 64, True, s) for s in (0, 1, 3, 5)]
    assert busy == sorted(busy, reverse=True)  # under load every draft step costs more than it brings


@pytest.mark.parametrize(("content", "words"), [
    ('{"small": {"candidate_steps": [3]}}', "no integer batch-size key"),
    ('{"1": {"candidate_steps": [3, -1]}}', "batch size 1: candidate_steps must be a non-empty list of integers >= 0"),
    ('{"1": {"candidate_steps": 3}}', "candidate_steps must be a non-empty list"),
    ("[1, 2]", "must be a JSON object"),
])
def test_a_bad_adaptive_config_is_refused_as_sglang_refuses_it(tmp_path: Path, content: str, words: str) -> None:
    cfg = tmp_path / "adaptive.json"
    cfg.write_text(content)
    with running_sim("--speculative-algorithm", "EAGLE3", "--speculative-adaptive", "--speculative-adaptive-config",
                     str(cfg), ready=False) as (_, proc):
        assert proc.wait(10) == 2
        assert words in proc.stdout.read().decode()  # type: ignore[union-attr]


def test_adaptive_needs_eagle_with_topk_1() -> None:
    with running_sim("--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "4",
                     "--speculative-num-draft-tokens", "8", "--speculative-adaptive", ready=False) as (_, proc):
        assert proc.wait(10) == 2
        assert "--speculative-adaptive needs" in proc.stdout.read().decode()  # type: ignore[union-attr]


def test_metrics_only_when_enabled() -> None:
    with running_sim("--sim-profile", "tiny-fast") as (url, _):
        assert httpx.get(url + "/metrics").status_code == 404


def test_a_stop_with_a_request_in_flight_ends_the_simulator_within_seconds() -> None:
    """SIGTERM while a stream is still being generated: the process is gone within seconds, as an engine's is
    (aiohttp alone waited a minute for the request; the interpreter's teardown took over 10 s on a loaded
    machine). The bound is a tenth of that minute: the stop itself took 2 s here."""
    with running_sim() as (url, proc):
        body = {"prompt": "hello", "max_tokens": 100_000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
            next(r.iter_lines())  # generating
            t0 = time.monotonic()
            proc.terminate()
            code = proc.wait(30)
            took = time.monotonic() - t0
    assert code == 0 and took < 6, took
