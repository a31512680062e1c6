"""Request and response bodies of the OpenAI-compatible API, as pydantic models.

The request models are built per server (:func:`request_models`), because their limits depend
on it: token ids must be below the model's vocabulary size, and ``max_tokens`` below its
context. Declaring them on the routes puts these limits in ``/openapi.json``, so clients,
client generators and schema-driven fuzzers see the real contract, and every check runs once,
before any backend sees the request.

Types follow JSON, not Python: ``true`` is not the token id 1, nor ``max_tokens=1``, and
``"5"`` is not 5; an integral number such as ``5.0`` is an integer, as JSON Schema says.
Every text field must be valid Unicode: a JSON string may hold a lone surrogate (``"\\ud800"``),
which no tokenizer can encode, so it is rejected with a 400 that says where it is.
"""

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    Tag,
)

MAX_STOP_STRINGS = 4  # as OpenAI
MAX_STOP_CHARS = 256
# Validating a message costs the event loop about 7 us: 50,000 of them (1.8 MB) stalled every
# client for 0.3 s. 2,048 is far more turns than any context holds; a longer list is refused
# before its items are validated.
MAX_MESSAGES = 2048
MAX_CONTENT_PARTS = 256
MAX_N = 16  # answers per request: each takes an engine slot
MAX_COMPLETION_LOGPROBS = 5  # as OpenAI's completions
MAX_TOP_LOGPROBS = 20  # as OpenAI's chat completions
# OpenAI parameters this server does not implement: refused by name, never accepted and
# ignored (a client would get a wrong answer with a 200 instead of an error).
UNSUPPORTED = {
    "tools": "tool calling is not implemented",
    "tool_choice": "tool calling is not implemented",
    "functions": "function calling is not implemented",
    "function_call": "function calling is not implemented",
    "parallel_tool_calls": "tool calling is not implemented",
    "response_format": "structured output (JSON mode, JSON schema) is not implemented",
    "echo": "echoing the prompt is not implemented",
    "best_of": "best_of is not implemented",
    "suffix": "insertion (suffix) is not implemented",
    "logit_bias": "logit_bias is not implemented",
    "audio": "audio output is not implemented",
    "modalities": "only text output is implemented",
    "prediction": "predicted outputs are not implemented",
    "web_search_options": "web search is not implemented",
}

# Sampling parameters this server does not implement, accepted at the value that changes
# nothing, as vLLM's benchmark client sends them (``vllm bench serve --backend openai`` always
# sends "repetition_penalty": 1.0; its --top-k, --min-p, ... flags add the others); null is
# their default too. Any other value is refused with a 400 that names the parameter and this
# value. name -> (the accepted values, as the error words them).
NEUTRAL_ONLY: dict[str, tuple[tuple[float, ...], str]] = {
    "repetition_penalty": ((1.0,), "1.0 (no penalty)"),
    "presence_penalty": ((0.0,), "0 (no penalty)"),
    "frequency_penalty": ((0.0,), "0 (no penalty)"),
    "top_k": ((0, -1), "0 or -1 (all tokens, as vLLM)"),
    "min_p": ((0.0,), "0 (no filter)"),
    "min_tokens": ((0,), "0"),
}

# Below this a temperature is greedy (as vLLM), and so is a top_p: logits / 1e-300 overflow
# to inf, a top_p of 1e-323 is 0 in float32 and drops every token; either way the sampler
# gets NaN, which fails the whole batch the request is in. Both limits already mean "the
# most likely token" (the top token of a 50k vocabulary has at least 2e-5 of the mass).
GREEDY_BELOW = 1e-5
# torch.Generator.manual_seed takes 64 bits; vLLM takes the signed 64-bit range, so do we.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


def _valid_unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"U+{ord(text[exc.start]):04X} at character {exc.start} is a lone surrogate, not a "
            "character: send valid Unicode (in JSON, a \\uD800-\\uDBFF escape must be followed "
            "by a \\uDC00-\\uDFFF one)"
        ) from None
    return text


def _shape(value: Any) -> str:
    """Which member of a string-or-list union a value means, so errors speak of that one only."""
    if isinstance(value, str):
        return "as-text"
    if isinstance(value, list) and value and isinstance(value[0], str):
        return "as-texts"
    return "as-list"


def _json_integer(value: Any) -> Any:
    if isinstance(value, (bool, str)):
        kind = "a boolean" if isinstance(value, bool) else "a string"
        raise ValueError(f"Input should be an integer, not {kind}")
    return value


def json_int(**bounds: int) -> Any:
    """An integer in JSON's sense within ``bounds`` (pydantic's ``ge``, ``lt``, ...): 5 or 5.0,
    never true or "5" (5.5 fails too). The bounds come first, so the schema shows them."""
    return Annotated[int, Field(**bounds), BeforeValidator(_json_integer)]


def neutral_only(kind: Any, name: str) -> Any:
    """``kind`` (a float or an integer type) restricted to the values of ``NEUTRAL_ONLY[name]``,
    which change nothing: a parameter this server does not implement, taken only where it is a
    no-op. The schema lists them (``enum``); any other value gets a 400 naming both."""
    accepted, says = NEUTRAL_ONLY[name]

    def check(value: Any) -> Any:
        if value not in accepted:
            raise ValueError(
                f"{name} is not supported by this server: only {says}, which changes nothing, "
                f"is accepted (or leave it out); got {value!r}"
            )
        return value

    return Annotated[kind, AfterValidator(check), Field(json_schema_extra={"enum": list(accepted)})]


Text = Annotated[str, AfterValidator(_valid_unicode)]
StopString = Annotated[
    str, Field(min_length=1, max_length=MAX_STOP_CHARS), AfterValidator(_valid_unicode)
]
Stop = Annotated[
    Annotated[StopString, Tag("as-text")]
    | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS), Tag("as-list")],
    Discriminator(lambda v: "as-text" if isinstance(v, str) else "as-list"),
]
Seed = json_int(ge=SEED_MIN, le=SEED_MAX)


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class ContentPart(BaseModel):
    """One part of a message's content: text only (an image would be silently dropped)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text"] = Field(description="only text parts are supported")
    text: Text


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Text | Annotated[list[ContentPart], Field(max_length=MAX_CONTENT_PARTS)] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text for part in self.content)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str = Field(description="what went wrong, as a string (context_length_exceeded, ...)")


class ErrorResponse(BaseModel):
    """Every error the server returns, as OpenAI shapes them."""

    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ServerTiming(BaseModel):
    """infer-lab's extension: the server's own clock for this request, in seconds.

    ``preprocess_s`` runs from the request's first byte to the engine (body, validation,
    tokenization); ``ttft_s`` and ``e2e_s`` run from the engine's arrival, like the
    ``/metrics`` histograms. A client's TTFT minus ``ttft_s`` is what the server's clock misses.
    """

    preprocess_s: float
    ttft_s: float | None = None
    e2e_s: float | None = None


class CompletionLogprobs(BaseModel):
    """The legacy completions shape: one entry per generated token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None
    prompt_token_ids: list[int] | None = Field(default=None, description="with return_token_ids")
    token_ids: list[int] | None = Field(default=None, description="with return_token_ids")


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    server_timing: ServerTiming | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None
    token_ids: list[int] | None = Field(default=None, description="with return_token_ids")


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    server_timing: ServerTiming | None = None
    prompt_token_ids: list[int] | None = Field(default=None, description="with return_token_ids")


def request_models(
    model_name: str, max_model_len: int, vocab_size: int
) -> tuple[type[BaseModel], type[BaseModel]]:
    """The completion and chat request models of a server with these limits."""
    MaxTokens = json_int(ge=1, le=max_model_len - 1)
    TokenId = json_int(ge=0, lt=vocab_size)

    class _Common(BaseModel):
        # Unknown and unimplemented parameters are refused by name (a misspelled one would
        # otherwise change nothing, silently); the few harmless ones are declared below.
        model_config = ConfigDict(extra="forbid")

        model: Text = Field(
            description="the served model id (GET /v1/models)", examples=[model_name]
        )
        max_tokens: MaxTokens | None = Field(default=None, description="new tokens, at most")
        temperature: StrictFloat = Field(
            default=1.0,
            ge=0.0,
            le=2.0,
            allow_inf_nan=False,
            description=f"0 (or below {GREEDY_BELOW:g}) is greedy",
        )
        top_p: StrictFloat = Field(
            default=1.0,
            gt=0.0,
            le=1.0,
            allow_inf_nan=False,
            description=f"below {GREEDY_BELOW:g} is greedy",
        )
        seed: Seed | None = None
        stop: Stop | None = None
        n: json_int(ge=1, le=MAX_N) = Field(  # type: ignore[valid-type]
            default=1,
            description="answers to the same prompt; they share its KV blocks when the "
            "engine has a prefix cache",
        )
        stream: StrictBool = False
        stream_options: StreamOptions | None = None
        ignore_eos: StrictBool = Field(
            default=False, description="vLLM's extension: keep going past end-of-sequence"
        )
        return_token_ids: StrictBool | None = Field(
            default=None,
            description="vLLM's extension: the response has the prompt's token ids "
            "(prompt_token_ids) and the generated ones (token_ids, the EOS that ended the "
            "answer included); streamed, each chunk has its own token_ids and the first the "
            "prompt_token_ids",
        )
        repetition_penalty: neutral_only(StrictFloat, "repetition_penalty") | None = None  # type: ignore[valid-type]
        presence_penalty: neutral_only(StrictFloat, "presence_penalty") | None = None  # type: ignore[valid-type]
        frequency_penalty: neutral_only(StrictFloat, "frequency_penalty") | None = None  # type: ignore[valid-type]
        top_k: neutral_only(json_int(), "top_k") | None = None  # type: ignore[valid-type]
        min_p: neutral_only(StrictFloat, "min_p") | None = None  # type: ignore[valid-type]
        min_tokens: neutral_only(json_int(), "min_tokens") | None = None  # type: ignore[valid-type]
        user: Text | None = Field(default=None, description="accepted, changes nothing")
        metadata: dict[str, Any] | None = Field(default=None, description="accepted, ignored")
        store: StrictBool | None = Field(default=None, description="accepted, ignored")

        def sampling(self) -> tuple[float, float]:
            """(temperature, top_p) for the sampler: greedy (0, 1) when either is near 0."""
            if self.temperature < GREEDY_BELOW or self.top_p < GREEDY_BELOW:
                return 0.0, 1.0
            return self.temperature, self.top_p

        def stop_strings(self) -> list[str]:
            return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    class CompletionRequest(_Common):
        logprobs: json_int(ge=0, le=MAX_COMPLETION_LOGPROBS) | None = Field(  # type: ignore[valid-type]
            default=None,
            description="log-probability of each generated token and of the N most likely "
            "ones (not with stream=true)",
        )

        def top_logprobs_wanted(self) -> int | None:
            return self.logprobs

        prompt: Annotated[
            Annotated[Text, Field(min_length=1), Tag("as-text")]
            | Annotated[
                list[Annotated[Text, Field(min_length=1)]],
                Field(min_length=1, max_length=1),
                Tag("as-texts"),
            ]
            | Annotated[
                list[TokenId], Field(min_length=1, max_length=max_model_len - 1), Tag("as-list")
            ],
            Discriminator(_shape),
        ] = Field(description="text, a list of one text, or token ids")

        def prompt_text(self) -> str | None:
            """The prompt as text, or None when it was given as token ids."""
            if isinstance(self.prompt, str):
                return self.prompt
            if self.prompt and isinstance(self.prompt[0], str):
                return self.prompt[0]
            return None

    class ChatCompletionRequest(_Common):
        messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
        max_completion_tokens: MaxTokens | None = None
        logprobs: StrictBool = Field(
            default=False,
            description="log-probability of each generated token (not with stream=true)",
        )
        top_logprobs: json_int(ge=0, le=MAX_TOP_LOGPROBS) | None = Field(  # type: ignore[valid-type]
            default=None, description="with logprobs: the N most likely tokens at each step"
        )

        def top_logprobs_wanted(self) -> int | None:
            if self.top_logprobs and not self.logprobs:
                raise ValueError("top_logprobs needs logprobs: true")
            return (self.top_logprobs or 0) if self.logprobs else None

    return CompletionRequest, ChatCompletionRequest


# Hints for the fields that take several shapes.
_UNION_HINTS = {
    "prompt": "prompt must be a string, a list with one string, or a list of integer token ids",
    "stop": f"stop must be a string or a list of at most {MAX_STOP_STRINGS} strings of "
    f"1 to {MAX_STOP_CHARS} characters",
    "seed": f"seed must be an integer in [{SEED_MIN}, {SEED_MAX}]",
    "content": 'content must be a string or a list of parts like {"type": "text", "text": "..."}',
}


def _is_union_tag(part: Any) -> bool:
    """Our tags ("as-text") and pydantic's ("list[ContentPart]"); no field is named like that."""
    return isinstance(part, str) and (part.startswith("as-") or "[" in part)


def _clean_loc(error: dict[str, Any]) -> list[Any]:
    loc = [p for p in error.get("loc", ()) if not _is_union_tag(p)]
    return loc[1:] if loc[:1] == ["body"] else loc


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """One clear message and the offending parameter from pydantic/FastAPI validation errors."""
    if not errors:
        return "invalid request", None
    # A broken constraint says more than "wrong type" (union members each report a type error).
    best = min(errors, key=lambda e: str(e.get("type", "")).endswith("_type"))
    loc, kind = _clean_loc(best), best.get("type")
    if kind == "json_invalid":
        detail = (best.get("ctx") or {}).get("error", "")
        at = f" at character {loc[0]}" if loc and isinstance(loc[0], int) else ""
        return f"request body is not valid JSON: {detail}{at}", None
    if kind == "extra_forbidden" and loc:
        name = ".".join(str(p) for p in loc)
        reason = UNSUPPORTED.get(str(loc[-1]))
        if reason is not None:
            return f"{name} is not supported by this server: {reason}; remove it", name
        return (
            f"unknown parameter {name!r}: this server does not know it (misspelled?); "
            "see GET /openapi.json for the parameters it takes",
            name,
        )
    if loc == ["n"] and kind in ("less_than_equal", "greater_than_equal"):
        return f"invalid request: n: must be from 1 to {MAX_N} answers per request", "n"
    if kind == "finite_number" and loc:
        name = ".".join(str(p) for p in loc)
        return f"invalid request: {name}: must be a finite number, not NaN or infinity", name
    if not loc:
        if kind == "missing":
            return "the request body is missing: send a JSON object", None
        return "the request body must be a JSON object", None
    param = ".".join(str(p) for p in loc)
    message = str(best.get("msg", "invalid value")).removeprefix("Value error, ")
    field = next((p for p in reversed(loc) if p in _UNION_HINTS), None)
    if field is not None and "lone surrogate" not in message:
        message = f"{message} ({_UNION_HINTS[field]})"
    return f"invalid request: {param}: {message}", param
