"""An OpenAI-compatible chat endpoint on 127.0.0.1 that answers after a fixed latency."""

from __future__ import annotations

import asyncio
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

LATENCY = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05


async def chat(request: Request) -> JSONResponse:
    body = await request.json()
    await asyncio.sleep(LATENCY)
    text = body["messages"][-1]["content"][::-1]
    if "response_format" in body:  # a judge asking for a verdict (patronus_tasks.evaluators)
        text = '{"explanation": "reads well", "pass": true}'
    return JSONResponse({"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": text}}]})


app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error", backlog=4096,
                limit_concurrency=10_000)
