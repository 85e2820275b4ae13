"""Minimal OpenAI-compatible chat-completions client (stdlib urllib): timeouts, retries with backoff.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import time
import urllib.error
import urllib.request


@dataclasses.dataclass(frozen=True)
class ChatEndpointConfig:
    """Endpoint of an OpenAI-compatible chat-completions server.

    Attributes:
      base_url: e.g. 'https://api.example.com/v1' (requests go to base_url + '/chat/completions').
      model: model name sent in the request.
      api_key_env: name of the environment variable holding the key ('' for none); the key itself is never
        stored in config.
      timeout_s: per-request timeout, seconds.
      max_retries: retries after the first attempt on network errors, HTTP 408/429 and 5xx.
      backoff_s: first retry delay in seconds, doubled each retry.
      temperature, max_tokens: sampling settings (a caller may pass its own temperature per request).
    Raises:
      ValueError: naming the field: a base_url that is not http(s), no model, timeout_s <= 0, a negative
        max_retries or backoff_s, max_tokens < 1.
    """

    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 60.0
    max_retries: int = 3
    backoff_s: float = 1.0
    temperature: float = 0.7
    max_tokens: int = 2048

    def __post_init__(self):
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"ChatEndpointConfig.base_url must start with http:// or https://, got {self.base_url!r}")
        if not self.model:
            raise ValueError("ChatEndpointConfig.model must name the model")
        if self.timeout_s <= 0 or self.max_retries < 0 or self.backoff_s < 0 or self.max_tokens < 1:
            raise ValueError(f"ChatEndpointConfig needs timeout_s > 0, max_retries >= 0, backoff_s >= 0 and "
                             f"max_tokens >= 1; got {self.timeout_s}, {self.max_retries}, {self.backoff_s}, "
                             f"{self.max_tokens}")


class ChatError(RuntimeError):
    """The endpoint failed; `cause` is a short category.

    'http_error' (a non-retryable status: the request was refused), 'unreachable', 'bad_reply' (no content),
    'length' (the reply was cut at max_tokens: finish_reason 'length') or 'refusal' (the model declined: a
    `message.refusal` or finish_reason 'content_filter')."""

    def __init__(self, cause: str, detail: str):
        super().__init__(f"{cause}: {detail}")
        self.cause = cause


def _error_text(exc: urllib.error.HTTPError) -> str:
    """The first 300 characters of an error reply's body ('' when it cannot be read)."""
    try:
        return exc.read(300).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return ""


class ChatClient:
    """Posts chat requests; `sleep` is injectable for tests."""

    def __init__(self, config: ChatEndpointConfig, sleep=time.sleep):
        self.config = config
        self._sleep = sleep

    def complete(self, messages: list[dict], temperature: float | None = None,
                 response_format: dict | None = None) -> str:
        """The first choice's message content, whole: a reply cut at max_tokens is an error, never returned.

        `response_format` (e.g. a json_schema the endpoint enforces) is sent as given.

        Raises:
          ChatError: non-retryable HTTP status, retries exhausted, a reply cut for length, a refusal, or a reply
            without choices[0].message.content.
        """
        cfg = self.config
        payload = {"model": cfg.model, "messages": messages, "max_tokens": cfg.max_tokens,
                   "temperature": cfg.temperature if temperature is None else temperature}
        if response_format is not None:
            payload["response_format"] = response_format
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        url = cfg.base_url.rstrip("/") + "/chat/completions"
        last = ""
        for attempt in range(cfg.max_retries + 1):
            if attempt:
                self._sleep(cfg.backoff_s * 2 ** (attempt - 1))
            req = urllib.request.Request(url, json.dumps(payload).encode(), headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=cfg.timeout_s) as resp:
                    reply = json.loads(resp.read().decode("utf-8"))
                break
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
                if exc.code not in (408, 429) and exc.code < 500:
                    raise ChatError("http_error", f"{url}: {last}: {_error_text(exc)}") from None
            except (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError,
                    json.JSONDecodeError) as exc:
                last = f"{type(exc).__name__}: {exc}"
        else:
            raise ChatError("unreachable", f"{url} after {cfg.max_retries + 1} attempts ({last})")
        try:
            choice = reply["choices"][0]
            message = choice["message"]
            content = message["content"] if isinstance(message, dict) else None
        except (KeyError, IndexError, TypeError):
            raise ChatError("bad_reply", "no choices[0].message.content") from None
        finish = choice.get("finish_reason") if isinstance(choice, dict) else None
        if finish == "length":
            raise ChatError("length", f"{url}: reply cut at max_tokens={cfg.max_tokens}")
        if finish == "content_filter" or (isinstance(message, dict) and message.get("refusal")):
            raise ChatError("refusal", f"{url}: the model declined ({str(message.get('refusal'))[:200]!r})")
        if not isinstance(content, str):
            raise ChatError("bad_reply", "content is not a string")
        return content
