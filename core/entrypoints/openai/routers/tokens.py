"""vLLM's /tokenize (a prompt, or messages through the chat template), /detokenize and
/tokenizer_info.

Messages with images count as the engine would see them: each image's placeholder expanded
to the positions its embeddings take, so `count` is what the request costs of the context.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from core.engine.async_llm import AsyncLLM
from core.entrypoints.chat_content import ChatContent
from core.entrypoints.openai import protocol as p
from core.entrypoints.openai.errors import OpenAIError
from core.entrypoints.openai.offload import OffLoop
from core.entrypoints.openai.serving import Serving

__all__ = ["tokens_router"]

# Token ids per piece of a /tokenize response (see _tokenize_response).
_IDS_PER_PIECE = 1 << 15


def tokens_router(
    engine: AsyncLLM, serving: Serving, offload: OffLoop, tokenizer_info: bool = False
) -> APIRouter:
    """The routes over `engine`'s tokenizer; `serving` checks the request's model and
    renders messages; tokenizing and decoding run on `offload`. `tokenizer_info`
    (--enable-tokenizer-info-endpoint): GET /tokenizer_info too, vLLM's tokenizer_config.json
    equivalent (off by default: it shows the chat template)."""
    router = APIRouter()

    if tokenizer_info:

        @router.get("/tokenizer_info")
        async def get_tokenizer_info() -> JSONResponse:
            config = engine.tokenizer.config()
            return JSONResponse({**config, "model_max_length": engine.processor.max_model_len})

    def tokenized(req: p.TokenizeRequest, chat: tuple[ChatContent, list[Any]] | None) -> Response:
        if chat is None:
            tokens = engine.tokenizer.encode(req.prompt or "", req.add_special_tokens)
        else:
            content, images = chat
            tokens = serving.render_chat(req, content)
            if images:
                tokens = serving.expand_images(tokens, images)
        strs = engine.tokenizer.convert_ids_to_tokens(tokens) if req.return_token_strs else None
        return _tokenize_response(tokens, engine.processor.max_model_len, strs)

    @router.post("/tokenize")
    async def tokenize(req: p.TokenizeRequest) -> Response:
        serving.check_model(req.model)
        chat = None if req.messages is None else await serving.chat_content(req)
        return await offload.run(tokenized, req, chat)

    @router.post("/detokenize")
    async def detokenize(req: p.DetokenizeRequest) -> JSONResponse:
        serving.check_model(req.model)
        bad = [t for t in req.tokens if not 0 <= t < engine.processor.vocab_size]
        if bad:
            raise OpenAIError(
                HTTPStatus.BAD_REQUEST,
                f"token id {bad[0]} is outside the vocabulary",
                param="tokens",
            )
        text = await offload.run(engine.tokenizer.decode, req.tokens)
        return JSONResponse(p.DetokenizeResponse(prompt=text).model_dump())

    return router


def _tokenize_response(
    tokens: list[int], max_model_len: int, token_strs: list[str] | None
) -> Response:
    """p.TokenizeResponse's JSON (with `token_strs` when asked), written in pieces: one
    json.dumps of a million token ids holds the GIL for a tenth of a second even on the
    OffLoop's thread, and the event loop waits for it; between pieces of _IDS_PER_PIECE
    items it gets its turn."""
    ids = _joined(tokens, str)
    body = f'{{"tokens":[{ids}],"count":{len(tokens)},"max_model_len":{max_model_len}'
    if token_strs is not None:
        body += f',"token_strs":[{_joined(token_strs, json.dumps)}]'
    return Response(body + "}", media_type="application/json")


def _joined(items: list, encode: Callable[[Any], str]) -> str:
    return ",".join(
        ",".join(map(encode, items[i : i + _IDS_PER_PIECE]))
        for i in range(0, len(items), _IDS_PER_PIECE)
    )
