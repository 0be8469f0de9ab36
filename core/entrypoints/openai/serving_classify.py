"""POST /classify: each input's label probabilities, over a classifier (core.pooling.tasks).

Each input (a text or token ids) is one engine request; every input is checked before any
is queued, so a bad one is a 400 naming `input` and nothing runs. A model that does not
classify is a 400 naming the task. `label` is the most probable label's name in the
checkpoint's id2label.
"""

from __future__ import annotations

from functools import partial

from fastapi.responses import JSONResponse

from core.engine.async_llm import AsyncLLM
from core.entrypoints.openai.final_outputs import final_outputs
from core.entrypoints.openai.offload import OffLoop
from core.entrypoints.openai.protocol_classify import (
    ClassificationData,
    ClassificationRequest,
    ClassificationResponse,
)
from core.entrypoints.openai.serving_models import ServedModels
from core.entrypoints.openai.serving_pooled import prepare_inputs, require_task, usage

__all__ = ["ServingClassification"]


class ServingClassification:
    def __init__(self, engine: AsyncLLM, models: ServedModels, offload: OffLoop) -> None:
        """`offload`: where inputs are tokenized (see OffLoop)."""
        self.engine = engine
        self.models = models
        self.offload = offload

    async def create(self, req: ClassificationRequest) -> JSONResponse:
        lora = self.models.lora_request(req.model)  # a 404 for a model not served here
        require_task(self.engine, "classify")
        prepare = partial(prepare_inputs, task="classify", use_activation=req.use_activation)
        prepared = await self.offload.run(prepare, self.engine, req.prompts())
        outputs = await final_outputs(self.engine, prepared)
        labels = self.engine.processor.pooling_tasks.labels
        data = [
            ClassificationData(
                index=i,
                label=_label(labels, o.outputs.probs),
                probs=o.outputs.probs,
                num_classes=len(o.outputs.probs),
            )
            for i, o in enumerate(outputs)
        ]
        response = ClassificationResponse(
            model=self.models.model_name(lora), data=data, usage=usage(outputs)
        )
        return JSONResponse(response.model_dump())


def _label(labels: tuple[str, ...], probs: list[float]) -> str | None:
    best = max(range(len(probs)), key=probs.__getitem__)
    return labels[best] if best < len(labels) else None
