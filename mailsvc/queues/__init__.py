"""How the store's queues are drained: threads that claim due work with a lease (mail to
deliver, webhooks to post), do it, record its outcome, and keep their leases while they work.
"""
