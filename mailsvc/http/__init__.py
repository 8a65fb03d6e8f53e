"""What reads a request and answers it, around the handlers: the API key, the body read
strictly and bounded (in size, depth, count and time), the schemas, large bodies, paging
cursors, idempotency keys, the routes' declarations, the OpenAPI document, and the access log.
"""
