"""`tidegate demo`: `tidegate up` driven by a load generator through the HTTP API, with a live
view; and the demo shop (its schema, seed data and write load) that `up`'s change flow follows."""
