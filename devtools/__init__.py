"""Development-only tools, apart from the product: the process supervisor of `make run` and the
embedded Redis server that `make run` and `make test` use when REDIS_URL is unset. Nothing under
the production settings imports this package, and the production image leaves it out."""
