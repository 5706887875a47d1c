"""The Python SDK (speaks only HTTP)."""
