"""What every surface of the gateway shares: the app's plumbing (auth, errors, middleware, the
uvicorn server's options, the gateway's state, settings, limits, metrics, traces and OpenAPI
document) and the one request path of the AI surfaces (the dialect seam in `dialect`, then
intake, the budget door, outcomes, streaming and the views of stored records). Nothing here
imports a surface's routes: the state holds the batch store, `batches.store`, as it holds the
others."""
