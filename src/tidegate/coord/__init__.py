"""Coordination state shared by the gateway and the workers, one package per family, each shaped
like `tidegate.queue`: `base.py` with the contract (an ABC whose public methods check arguments
and the lifecycle once and call the `_hooks` a backend implements) and the `*_for(queue_url)`
factory, which imports the backend the queue's URL names (the same SQLite file or the same Redis
server) only when it is chosen; one module per backend; Lua beside the Redis backend.

- `tenants`: tenants and their hashed API keys (`tenant_store_for`; sqlite, redis);
- `limiter`: rate limits per provider/model key (`rate_limiter_for`; memory, redis), and the
  adaptive concurrency of one worker;
- `budget`: daily budgets reserved before a call and settled after it (`budget_ledger_for`;
  sqlite, redis), and what becomes of a job a budget refuses;
- `relay`: streamed answers from the worker to the gateway (`relay_for`; memory, redis).

A store that serves one feature lives with that feature instead: the Files and Batch APIs' in
`tidegate.gateway.batches.store`, the provider batches' in `tidegate.dispatch.provider_batches.store`.

Every object is on the one lifecycle (`tidegate._lifecycle`), opened by its first use (or
`open()`, `async with`); a closed one refuses use and cannot reopen. Every Redis backend opens
its connections with `tidegate._redis.RedisClient`, which translates driver errors into the
family's error with the URL's credentials left out.
"""

from tidegate.coord._store import queue_name_of

__all__ = ["queue_name_of"]
