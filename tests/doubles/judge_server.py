"""A local OpenAI-style judge endpoint (stdlib http.server on 127.0.0.1) with a context window, a reply budget and a
scripted manner of answering (test_judge_round5, test_tabular_judge)."""

import json
import math
import re

from openai_stub import json_endpoint

from .judges import decode_judge_request

_ESCAPE = re.compile(r"\\u[0-9a-fA-F]{4}")


def approx_tokens(text: str) -> int:
    """Prompt tokens as a byte-level BPE spends them, roughly: six per '\\uXXXX' escape, one per three other bytes."""
    escapes = len(_ESCAPE.findall(text))
    rest = len(_ESCAPE.sub("", text).encode("utf-8"))
    return 6 * escapes + math.ceil(rest / 3)


def reply_tokens(text: str) -> int:
    """Reply tokens, roughly: one per four characters."""
    return math.ceil(len(text) / 4)


class JudgeServer:
    """An OpenAI-compatible /chat/completions judge on 127.0.0.1 (a daemon thread).

    `answer(item, evidence, host, structured) -> str | dict` writes the reply the model would write whole (a dict is
    a message, e.g. {"content": None, "refusal": "..."}); the server answers HTTP 400 when prompt tokens
    (`approx_tokens` + 8 a message) plus max_tokens exceed `context`, when `schema=False` and a response_format is
    sent, or when `reject(item, evidence, structured)` is true; it cuts a reply at max_tokens with finish_reason
    'length'. The host's control question is answered correctly unless `answer` handles it (`control=True`).
    Attributes: log, one (item, status, finish_reason, prompt tokens) per request.
    """

    def __init__(self, answer, context: int = 16384, schema: bool = True, control: bool = False, reject=None):
        self.answer, self.context, self.schema, self.control = answer, context, schema, control
        self.reject = reject
        self.log: list[tuple[str, int, str | None, int]] = []
        self._httpd, self.url = json_endpoint(lambda path, headers, body: self._reply(body), threaded=True)

    def close(self):
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def items(self, status=None) -> list[str]:
        """The items asked, in order (those answered `status` only, when given)."""
        return [i for i, s, _, _ in self.log if status is None or s == status]

    def _reply(self, body: dict):
        from bat_jax.verify.verdict import _CONTROL_ITEM

        messages = body["messages"]
        prompt = sum(approx_tokens(m["content"]) + 8 for m in messages)
        try:
            item, evidence, _, host = decode_judge_request(messages)
        except (AttributeError, IndexError, ValueError):
            item, evidence, host = "(check)", "", messages[-1]["content"]
        structured = body.get("response_format") is not None
        if prompt + body["max_tokens"] > self.context:
            self.log.append((item, 400, None, prompt))
            return 400, {"error": {"message": f"This model's maximum context length is {self.context} tokens. However, "
                                              f"you requested {prompt + body['max_tokens']} tokens."}}
        if (structured and not self.schema) or (self.reject is not None and self.reject(item, evidence, structured)):
            self.log.append((item, 400, None, prompt))
            return 400, {"error": {"message": "request rejected"}}
        if item in (_CONTROL_ITEM, "(check)") and not self.control:
            verdict = "yes" if "ready" in evidence or item == "(check)" else "no"
            message = {"content": json.dumps({"verdict": verdict, "reason": "control"})}
        else:
            out = self.answer(item, evidence, host, structured)
            message = out if isinstance(out, dict) else {"content": out}
        finish = "stop"
        content = message.get("content")
        if message.get("refusal"):
            finish = "stop"
        elif isinstance(content, str) and reply_tokens(content) > body["max_tokens"]:
            message = {**message, "content": content[:4 * body["max_tokens"]]}
            finish = "length"
        self.log.append((item, 200, finish, prompt))
        return 200, {"choices": [{"index": 0, "finish_reason": finish,
                                  "message": {"role": "assistant", "content": None, **message}}]}
