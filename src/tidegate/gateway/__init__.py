"""The HTTP gateway: an OpenAI-compatible API in front of the queue, jobs, admin, metrics and the
dashboard.

One package per surface, each holding its routes, its request and response models and, for an
AI API, its dialect; what every surface shares is `core`:

- `core/`: the app's plumbing (auth, errors, middleware, the HTTP server's options, the state a
  gateway holds, its settings, limits, metrics, traces, OpenAPI document) and the request path
  every AI surface takes (the dialect seam, intake, budget door, outcomes, streaming, views);
- `openai/`: chat completions, embeddings, models and the legacy endpoints, with the fast path
  of the two hot routes;
- `responses/`: OpenAI's Responses API;
- `anthropic/`: Anthropic's Messages API;
- `batches/`: OpenAI's Files and Batch APIs, their store included;
- `admin/`: statistics, dead letters, tenants and keys, the provider batches, the dashboard;
- `jobs.py` (/v1/jobs), `recs.py` (recommendations), `ops.py` (metrics, health);
- `app.py`: `create_app`, which mounts every surface's router.
"""
