"""The handlers of the HTTP API, one module per resource."""
