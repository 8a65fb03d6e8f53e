"""Delivery: threads that drain the queue in the store and hand mail to a transport."""

from .pool import DeliveryPool

__all__ = ["DeliveryPool"]
