"""The admin surface (admin tenants only): queue statistics, dead letters, tenants and keys
(`routes`), the provider batches the workers sent (`provider_batches`), and the live page of the
queue (`dashboard`, its files in static/)."""
