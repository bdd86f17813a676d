"""The collector service: ingest, DuckDB store, REST API, Prometheus metrics."""
