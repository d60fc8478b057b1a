"""The HTTP API's shared parts: error handling, pagination, throttling, schema and URLs."""
