"""What an account may spend: requests a minute by route group (token buckets kept in the store)
and template CPU time (a bucket of milliseconds, and the budget one render runs under).
"""
