"""The OpenAI-compatible surface: chat completions, embeddings, models and the legacy completions
and moderations (`routes`), their bodies (`schemas`), the OpenAI dialect (`dialect`), and the fast
path that serves the two hot routes without FastAPI's per-request work (`fast_path`)."""
