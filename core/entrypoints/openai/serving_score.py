"""POST /score and /rerank: text pairs scored by a cross-encoder or an embedding model.

/score pairs `text_1` with `text_2` 1:1, 1:N or N:N and answers one score per pair, in
order; /rerank scores `query` against each of `documents` and answers the `top_n` best
(0: all), best first, each with its index in the request and, unless `return_documents` is
false, its text. How pairs become engine requests and scores is core.entrypoints.scoring's;
every request is checked before any is queued, so a bad one is a 400 naming its field and
nothing runs. A model that does not score (a generating one, a classifier with several
labels) is a 400 naming the task.
"""

from __future__ import annotations

from http import HTTPStatus

from fastapi.responses import JSONResponse

from core.engine.async_llm import AsyncLLM
from core.entrypoints.openai.errors import OpenAIError
from core.entrypoints.openai.final_outputs import final_outputs
from core.entrypoints.openai.offload import OffLoop
from core.entrypoints.openai.protocol_score import (
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreRequest,
    ScoreResponse,
    ScoreResponseData,
)
from core.entrypoints.openai.serving_models import ServedModels
from core.entrypoints.openai.serving_pooled import field_errors, require_task, usage
from core.entrypoints.scoring import plan_scores
from core.outputs import ScoringRequestOutput
from core.pooling.params import PoolingParams

__all__ = ["ServingScores"]

# The request's names for the fields the engine's validation names.
_SCORE_FIELDS = {"text_1": "text_1", "text_2": "text_2", "use_activation": "use_activation"}
_RERANK_FIELDS = {"text_1": "query", "text_2": "documents", "use_activation": "use_activation"}


class ServingScores:
    def __init__(self, engine: AsyncLLM, models: ServedModels, offload: OffLoop) -> None:
        """`offload`: where texts are tokenized (see OffLoop)."""
        self.engine = engine
        self.models = models
        self.offload = offload

    async def score(self, req: ScoreRequest) -> JSONResponse:
        lora = self.models.lora_request(req.model)  # a 404 for a model not served here
        scores = await self._scores(req.text_1, req.text_2, req.use_activation, _SCORE_FIELDS)
        data = [ScoreResponseData(index=i, score=s.outputs.score) for i, s in enumerate(scores)]
        response = ScoreResponse(model=self.models.model_name(lora), data=data, usage=usage(scores))
        return JSONResponse(response.model_dump())

    async def rerank(self, req: RerankRequest) -> JSONResponse:
        lora = self.models.lora_request(req.model)
        if req.top_n < 0:
            raise OpenAIError(
                HTTPStatus.BAD_REQUEST, "top_n must be >= 0 (0: every document)", param="top_n"
            )
        if not req.documents:
            raise OpenAIError(
                HTTPStatus.BAD_REQUEST, "documents must not be empty", param="documents"
            )
        scores = await self._scores(req.query, req.documents, req.use_activation, _RERANK_FIELDS)
        best_first = sorted(range(len(scores)), key=lambda i: -scores[i].outputs.score)
        results = [
            RerankResult(
                index=i,
                document=RerankDocument(text=req.documents[i]) if req.return_documents else None,
                relevance_score=scores[i].outputs.score,
            )
            for i in best_first[: req.top_n or len(best_first)]
        ]
        response = RerankResponse(
            model=self.models.model_name(lora),
            usage=RerankUsage(total_tokens=usage(scores).total_tokens),
            results=results,
        )
        return JSONResponse(response.model_dump(exclude_none=True))

    async def _scores(
        self,
        text_1: str | list[str],
        text_2: str | list[str],
        use_activation: bool | None,
        renames: dict[str, str],
    ) -> list[ScoringRequestOutput]:
        require_task(self.engine, "score")
        params = PoolingParams(use_activation=use_activation)

        def plan():
            return plan_scores(self.engine.processor, text_1, text_2, params)

        scoring = await self.offload.run(field_errors, plan, renames)
        return scoring.finish(await final_outputs(self.engine, scoring.prepared))
