"""The errors `specedge serve` answers with: OpenAI's {"error": {"message", "type", "param", "code"}} and an HTTP status
(apps/openai_protocol.py engine_error turns an Engine's ValueError into one)."""
from __future__ import annotations


class APIError(Exception):
    """An error the client gets as {"error": {"message", "type", "param", "code"}} with an HTTP status."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)
