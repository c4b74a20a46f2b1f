"""OpenAI's Files and Batch APIs, the whole feature in one place: the routes (`file_routes` for
/v1/files, `routes` for /v1/batches), their request and response models (`schemas`), a batch's
lines read, checked and answered (`lines`), its life from creation to its output file (`runs`),
every gateway's sweep of the batches nobody asks about (`sweep`), and the store that keeps files
and batches between calls in the queue's backend (`store`: SQLite or Redis).

The store is only the gateway's (and the composition roots' that open it), so it lives here, in
the gateway's layer, beside the routes it serves, rather than among the coordination state the
workers share (`tidegate.coord`)."""
