"""Scripts run in the peer systems' environment (../shared/bench/peers/setup.sh)."""
