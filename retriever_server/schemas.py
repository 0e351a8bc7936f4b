"""Wire types of the retrieval HTTP API (Search-R1 compatible).

`agent_rl` may import this module (and only this one) for the request/response types.
POST /retrieve {"queries": [str], "topk": int?, "return_scores": bool?}
  -> {"result": [[{"document": {"id": str, "contents": str, ...}, "score": float}, ...], ...]}
One list per query, in request order. `score` is present when asked (Search-R1 default: asked).
SkyRL's search tool (skyrl-gym `call_search_api`) sends one query, {"query": str, "topk": int?,
"return_scores": bool?}; it is answered as {"queries": [query]} is: a result of one list, which
is what that client reads. Non-finite numbers (a NaN in a corpus field) are sent as null.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RetrieveRequest(BaseModel):
    """Body of POST /retrieve. Limits (max queries, max length, topk range) are enforced by the
    server from its settings, so that the error message can name the configured bound."""

    model_config = ConfigDict(extra="forbid")

    queries: list[str] = Field(..., description="Search queries, answered in order.")
    topk: int | None = Field(None, description="Passages per query; server default when omitted.")
    return_scores: bool = Field(True, description="Include each passage's score.")


class SingleQueryRequest(BaseModel):
    """SkyRL's form of the same request: one query (skyrl_gym.tools.search.call_search_api)."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(..., description="One search query; answered as `queries: [query]`.")
    topk: int | None = Field(None, description="Passages for the query; server default when omitted.")
    return_scores: bool = Field(True, description="Include each passage's score.")


class Document(BaseModel):
    """A corpus passage: Search-R1/FlashRAG `{"id", "contents": "\\"Title\\"\\ntext"}`."""

    model_config = ConfigDict(extra="allow")

    id: str
    contents: str


class ScoredDocument(BaseModel):
    document: Document
    score: float | None = None


class RetrieveResponse(BaseModel):
    result: list[list[ScoredDocument]]


class HealthResponse(BaseModel):
    status: str  # "ok" once index, corpus and encoder are loaded; "loading" before
    index_kind: str | None = None
    num_passages: int | None = None


class ErrorResponse(BaseModel):
    detail: str
