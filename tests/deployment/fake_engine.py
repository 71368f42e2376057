"""A stand-in for an external LLM engine's OpenAI-compatible server (vLLM's, FastDeploy's),
for the tests of the serving host's engine revisions only: it answers each chat with
"引擎答：" and the last user message, one character per chunk.

    python tests/deployment/fake_engine.py --model DIR --served-model-name NAME --port PORT
"""

import argparse
import json
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

parser = argparse.ArgumentParser()
parser.add_argument("--model", required=True)
parser.add_argument("--served-model-name", required=True)
parser.add_argument("--port", type=int, required=True)
args = parser.parse_args()


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok", "model": args.model})


async def chat(request: Request):
    body = await request.json()
    if body.get("model") != args.served_model_name:
        return JSONResponse({"error": {"message": "unknown model", "type": "invalid"}}, 404)
    text = "引擎答：" + body["messages"][-1]["content"]
    usage = {"prompt_tokens": 5, "completion_tokens": len(text), "total_tokens": 5 + len(text)}
    base = {"id": "chatcmpl-fake", "created": int(time.time()), "model": args.served_model_name}
    if not body.get("stream"):
        return JSONResponse(
            {
                **base,
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            }
        )

    async def events():
        chunk = {**base, "object": "chat.completion.chunk"}
        for c in text:
            delta = {"index": 0, "delta": {"content": c}, "finish_reason": None}
            yield f"data: {json.dumps({**chunk, 'choices': [delta]})}\n\n"
        done = {"index": 0, "delta": {}, "finish_reason": "stop"}
        yield f"data: {json.dumps({**chunk, 'choices': [done]})}\n\n"
        yield f"data: {json.dumps({**chunk, 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


app = Starlette(
    routes=[Route("/health", health), Route("/v1/chat/completions", chat, methods=["POST"])]
)
uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
