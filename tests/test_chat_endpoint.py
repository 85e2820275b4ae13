"""The OpenAI-compatible chat endpoint (bat_jax/clients/chat_endpoint.py) against a local stub server: the request
it sends, retries with doubling backoff on 429 / 5xx, failures by category, and config checks."""

import pytest
from openai_stub import FakeChatServer

from bat_jax.clients.chat_endpoint import ChatClient, ChatEndpointConfig, ChatError

OK = (200, {"choices": [{"message": {"content": "fine"}}]})


@pytest.fixture
def server():
    servers = []

    def make(replies):
        servers.append(FakeChatServer(replies))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def _client(url, sleeps, **kw):
    config = ChatEndpointConfig(url, "judge-m", api_key_env="BAT_TEST_KEY", timeout_s=5.0, backoff_s=0.5, **kw)
    return ChatClient(config, sleep=sleeps.append)


def test_the_request_and_the_reply(server, monkeypatch):
    monkeypatch.setenv("BAT_TEST_KEY", "k-123")
    stub, sleeps = server([OK]), []
    reply = _client(stub.url, sleeps, max_tokens=64).complete([{"role": "user", "content": "hi"}], 0.0,
                                                               {"type": "json_object"})
    assert reply == "fine" and sleeps == []
    ((path, auth, body),) = stub.requests
    assert (path, auth) == ("/v1/chat/completions", "Bearer k-123")
    assert body == {"model": "judge-m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64,
                    "temperature": 0.0, "response_format": {"type": "json_object"}}


def test_retries_back_off_doubling_and_stop_at_the_limit(server):
    stub, sleeps = server([(503, {}), (429, {}), OK]), []
    assert _client(stub.url, sleeps).complete([]) == "fine"
    assert sleeps == [0.5, 1.0] and len(stub.requests) == 3
    stub, sleeps = server([(500, {})] * 3), []
    with pytest.raises(ChatError, match=r"unreachable: .* after 3 attempts \(HTTP 500\)") as e:
        _client(stub.url, sleeps, max_retries=2).complete([])
    assert e.value.cause == "unreachable" and sleeps == [0.5, 1.0]


def test_a_client_error_is_not_retried_and_a_reply_without_content_is_bad(server):
    stub, sleeps = server([(400, {})]), []
    with pytest.raises(ChatError, match="http_error: .*HTTP 400") as e:
        _client(stub.url, sleeps).complete([])
    assert e.value.cause == "http_error" and sleeps == [] and len(stub.requests) == 1
    bad = (({"choices": []}, "no choices"), ({"choices": [{"message": {"content": 3}}]}, "not a string"))
    for reply, detail in bad:
        stub = server([(200, reply)])
        with pytest.raises(ChatError, match=f"bad_reply: .*{detail}"):
            _client(stub.url, []).complete([])


@pytest.mark.parametrize("kw, message", [
    (dict(base_url="api.example.com/v1"), "base_url must start with http:// or https://"),
    (dict(model=""), "model must name the model"),
    (dict(timeout_s=0), "timeout_s > 0"),
    (dict(max_retries=-1), "max_retries >= 0"),
])
def test_bad_configs_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        ChatEndpointConfig(**{"base_url": "http://x/v1", "model": "m", **kw})


@pytest.mark.parametrize("choice,cause", [
    ({"finish_reason": "length", "message": {"content": '<think>cut </think>{"verdict": "yes"}'}}, "length"),
    ({"finish_reason": "stop", "message": {"content": None, "refusal": "I can't help with that."}}, "refusal"),
    ({"finish_reason": "content_filter", "message": {"content": ""}}, "refusal"),
    ({"finish_reason": "tool_calls", "message": {"content": None, "tool_calls": []}}, "bad_reply"),
])
def test_a_reply_cut_for_length_or_refused_is_an_error_never_content(server, choice, cause):
    stub, sleeps = server([(200, {"choices": [choice]})]), []
    with pytest.raises(ChatError) as err:
        _client(stub.url, sleeps, max_tokens=8).complete([{"role": "user", "content": "hi"}])
    assert err.value.cause == cause and len(stub.requests) == 1 and sleeps == []
    assert _client(server([(200, {"choices": [{"finish_reason": "stop", "message": {"content": "x"}}]})]).url,
                   sleeps).complete([{"role": "user", "content": "hi"}]) == "x"
