"""Every 4xx/5xx answer in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}.

``param`` names the request field at fault (None when no single field is), ``code`` is a short kind
that /metrics counts errors by (tformer_errors_total{kind=...}).
"""

from __future__ import annotations

import json

# status -> OpenAI's error type
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 408: "timeout_error", 413: "invalid_request_error",
          415: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error",
          504: "timeout_error"}


class APIError(Exception):
    """An answer other than 200: raised anywhere below a route, turned into JSON by the app's handler."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str = "invalid_value",
                 headers: dict[str, str] | None = None):
        # An answer is UTF-8 JSON: a lone surrogate echoed from a request would make encoding it fail (a 500).
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}

    def encoded(self) -> bytes:
        return json.dumps(self.body()).encode()


__all__ = ["APIError"]
