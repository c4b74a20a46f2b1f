"""Coordination state shared by the gateway and the workers: tenants and their keys, the rate
limiter, the budget ledger and the relay of stream events, each with an embedded and a Redis
backend chosen by the queue's URL."""
