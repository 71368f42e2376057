"""The serving host: ``python -m serving``, one per node, in the runtime venv.

A standalone ASGI process (Starlette on uvicorn) that needs no database. The platform's
reconciler tells it, through the management API under ``/manage/`` (a shared secret), which
model revisions to load and how each endpoint routes its traffic and which API keys it accepts;
clients call ``POST /v1/endpoints/<name>:predict``. Each revision runs in its own predictor
processes (Paddle Inference is not thread-safe) fed by a dynamic batcher. See
``deployment/README.md``.
"""
