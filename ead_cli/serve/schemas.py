"""The request bodies of ``ead serve``: OpenAI's fields and ead's own options, as pydantic models, and
OpenAI's error object for whatever is wrong with them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import EadError
from ..policies import parse_tau


class EadOptions(BaseModel):
    """The ``ead`` object of a request: policy options of ``ead generate``, checked by the same rules."""

    model_config = ConfigDict(extra="forbid", strict=True)

    mode: Literal["ead", "small", "large", "spec"] | None = None
    policy: Literal["gate", "ead", "lookahead"] | None = None
    tau: float | list[float] | str | None = None
    window: int | None = None
    min_run: int | None = None
    burst: int | Literal["line", "adaptive"] | None = None
    switch_point: Literal["before", "after"] | None = None
    normalize: bool | None = None
    draft: int | None = None
    draft_entropy_stop: float | None = None
    verify: float | None = None
    pattern: list[str] | None = None
    tau_range: tuple[float, float] | None = None
    top_k: int | None = None
    min_p: float | None = None

    def policy_changes(self) -> dict[str, Any]:
        """The fields given, as PolicyOptions takes them."""
        given = self.model_dump(exclude_none=True, exclude={"top_k", "min_p"})
        if isinstance(given.get("tau"), str):
            try:
                given["tau"] = parse_tau(given["tau"])
            except ValueError:
                raise EadError(f"ead.tau must be a number of bits or a list, got {self.tau!r}") from None
        elif isinstance(given.get("tau"), list):
            given["tau"] = tuple(given["tau"])
        if "pattern" in given:
            given["patterns"] = tuple(given.pop("pattern"))
        return given


class CompletionBase(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    stream: bool = False
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    stop: str | list[str] | None = None
    seed: Annotated[int, Field(ge=0, le=2**32 - 2)] | None = None
    n: Annotated[int, Field(ge=1, le=1)] = 1
    ead: EadOptions | None = None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "user", "assistant"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatRequest(CompletionBase):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]


class CompletionRequest(CompletionBase):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class ApiError(Exception):
    """An HTTP error with OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.headers = status, message, kind, code, headers

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": None, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def parse(model: type[BaseModel], data: bytes) -> Any:
    """A request body (JSON whatever its content type says, as curl -d sends it) into its schema;
    pydantic's first complaint as one line otherwise."""
    try:
        return model.model_validate_json(data)
    except ValidationError as error:
        first = error.errors()[0]
        if first["type"] == "json_invalid":
            message = f"the body is not valid JSON: {first['ctx']['error']}"
            raise ApiError(400, message, code="invalid_json") from None
        where = ".".join(str(part) for part in first["loc"])
        if first["type"] == "model_type" and not where:
            raise ApiError(400, "the body must be a JSON object", code="invalid_json") from None
        message = f"{where}: {first['msg']}" if where else first["msg"]
        raise ApiError(400, message, code="invalid_value") from None
